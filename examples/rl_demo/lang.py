"""The demo's token language and model: checkable digit tasks (three by default, up to eight with ``--agents``),
a tiny Llama, greedy accuracy."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

DIGITS = 10
EQ = 13
# The three original tasks keep their tokens (and the 16-token vocabulary: the 3-agent runs are unchanged); the
# five more of ``--agents`` 4..8 take tokens 14..18 in a 20-token vocabulary.
TASK_TOKEN = {"shift": 10, "rev": 11, "sort": 12, "comp": 14, "rot": 15, "sortd": 16, "swap": 17, "dbl": 18}
ALL_TASKS = ("shift", "rev", "sort", "comp", "rot", "sortd", "swap", "dbl")
VOCAB = 16
TASKS = ALL_TASKS[:3]


def tasks_for(n: int) -> tuple[str, ...]:
    """The first ``n`` tasks (3 ≤ n ≤ 8)."""
    if not 1 <= n <= len(ALL_TASKS):
        raise ValueError(f"between 1 and {len(ALL_TASKS)} agents, not {n}")
    return ALL_TASKS[:n]


def vocab_for(tasks: tuple[str, ...]) -> int:
    """16 tokens while every task token fits (the three original tasks: bit-identical 3-agent runs), else 20."""
    return VOCAB if max(TASK_TOKEN[t] for t in tasks) < VOCAB else 20


def make_prompts(task: str, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """``n`` prompts of ``task`` and their answers: prompt = [TASK, digits..., '='], answer = digits."""
    digits = torch.randint(0, DIGITS, (n, 5), generator=g)
    answer = solve(task, digits)
    head = torch.full((n, 1), TASK_TOKEN[task])
    eq = torch.full((n, 1), EQ)
    return torch.cat([head, digits, eq], dim=1), answer


def solve(task: str, digits: Tensor) -> Tensor:
    """The checkable answer of ``task`` for rows of 5 digits."""
    if task == "shift":  # every digit + 3 (mod 10)
        return (digits + 3) % DIGITS
    if task == "rev":
        return digits.flip(1)
    if task == "sort":
        return digits.sort(dim=1).values
    if task == "comp":  # 9 − digit
        return DIGITS - 1 - digits
    if task == "rot":  # rotate left by 2
        return digits.roll(-2, dims=1)
    if task == "sortd":  # sort descending
        return digits.sort(dim=1, descending=True).values
    if task == "swap":  # swap neighbours: d2 d1 d4 d3 d5
        return digits[:, [1, 0, 3, 2, 4]]
    if task == "dbl":  # 2·digit (mod 10)
        return (2 * digits) % DIGITS
    raise ValueError(f"unknown task {task!r}")


def answer_len(task: str) -> int:
    return 5


# -------------------------------------------------------------------------------------------------- the model


def build_model(seed: int, vocab: int = VOCAB, hidden: int = 96, intermediate: int = 256) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=16,
        tie_word_embeddings=False,
        use_cache=False,
    )
    return LlamaForCausalLM(config)


def answer_logprobs(model: nn.Module, prompts: Tensor, answers: Tensor) -> Tensor:
    """log p(answer token | prefix) for every answer token: [B, A]."""
    ids = torch.cat([prompts, answers], dim=1)
    logits = model(input_ids=ids).logits[:, prompts.shape[1] - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, answers.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate(model: nn.Module, prompts: Tensor, length: int, g: torch.Generator | None = None) -> Tensor:
    """Answers of ``length`` tokens: greedy (g=None) or sampled at temperature 1 (no KV cache: sequences are short)."""
    ids = prompts
    for _ in range(length):
        logits = model(input_ids=ids).logits[:, -1].float()
        nxt = logits.argmax(-1) if g is None else torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids[:, prompts.shape[1] :]


@torch.no_grad()
def accuracy(model: nn.Module, data: dict[str, tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Greedy exact-match accuracy per task, computed in float32 on the model's stored weights."""
    m = model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
    m.eval()
    return {t: float((generate(m, p, a.shape[1]) == a).all(1).float().mean()) for t, (p, a) in data.items()}
