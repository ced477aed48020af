"""The demo's token language and model: three checkable digit tasks, a tiny Llama, greedy accuracy."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

DIGITS = 10
TASK_TOKEN = {"shift": 10, "rev": 11, "sort": 12}
EQ = 13
VOCAB = 16
TASKS = ("shift", "rev", "sort")


def make_prompts(task: str, g: torch.Generator, n: int) -> tuple[Tensor, Tensor]:
    """``n`` prompts of ``task`` and their answers: prompt = [TASK, digits..., '='], answer = digits."""
    digits = torch.randint(0, DIGITS, (n, 5), generator=g)
    if task == "shift":  # every digit + 3 (mod 10)
        answer = (digits + 3) % DIGITS
    elif task == "rev":
        answer = digits.flip(1)
    else:
        answer = digits.sort(dim=1).values
    head = torch.full((n, 1), TASK_TOKEN[task])
    eq = torch.full((n, 1), EQ)
    return torch.cat([head, digits, eq], dim=1), answer


def answer_len(task: str) -> int:
    return 5


# -------------------------------------------------------------------------------------------------- the model


def build_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                         tie_word_embeddings=False, use_cache=False)
    return LlamaForCausalLM(config)


def answer_logprobs(model: nn.Module, prompts: Tensor, answers: Tensor) -> Tensor:
    """log p(answer token | prefix) for every answer token: [B, A]."""
    ids = torch.cat([prompts, answers], dim=1)
    logits = model(input_ids=ids).logits[:, prompts.shape[1] - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, answers.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def generate(model: nn.Module, prompts: Tensor, length: int, g: torch.Generator | None = None) -> Tensor:
    """Answers of ``length`` tokens: greedy (g=None) or sampled at temperature 1 (no KV cache: sequences are short)."""
    ids = prompts
    for _ in range(length):
        logits = model(input_ids=ids).logits[:, -1].float()
        nxt = logits.argmax(-1) if g is None else torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return ids[:, prompts.shape[1]:]


@torch.no_grad()
def accuracy(model: nn.Module, data: dict[str, tuple[Tensor, Tensor]]) -> dict[str, float]:
    """Greedy exact-match accuracy per task, computed in float32 on the model's stored weights."""
    m = model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
    m.eval()
    return {t: float((generate(m, p, a.shape[1]) == a).all(1).float().mean()) for t, (p, a) in data.items()}


