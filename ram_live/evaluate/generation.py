"""Batched, left-padded generation on the model where it is: greedy by default, sampling with a seed as an option.

Completions are cut after the first end-of-sequence token and decoded without special tokens, as TRL's
GRPOTrainer decodes them; conversational prompts go through the tokenizer's chat template
(``add_generation_prompt=True``) and their completions are ``[{"role": "assistant", "content": text}]``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..errors import ConfigError
from .checks import finite_float, one_line, short

__all__ = ["GenerationSettings", "generate_completions", "tokenize_prompts", "eos_ids"]

#: The largest ``seed``: seeds are ints in [0, 2**63 - 1] (a signed 64-bit int; torch takes them all).
SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class GenerationSettings:
    """How completions are generated.

    Args:
        max_new_tokens: the most tokens generated per prompt.
        batch_size: prompts per ``generate`` call.
        do_sample: sample instead of greedy decoding (then ``temperature``, ``top_p``, ``top_k``, ``seed`` apply;
            the same seed every call, so every candidate sees the same random numbers).
        temperature: a finite number > 0. top_p: a number in (0, 1]. top_k: an int >= 0 (0: no top-k cut).
        seed: an int in [0, 2**63 - 1].

    Raises:
        ConfigError: an option out of its range or of the wrong type, naming the option.
    """

    max_new_tokens: int = 64
    batch_size: int = 16
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"rewards: {name} must be an int >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"rewards: seed must be an int in [0, 2**63 - 1], got {short(self.seed)}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"rewards: top_k must be an int >= 0 (0: no top-k cut), got {short(self.top_k)}")
        if not isinstance(self.do_sample, bool):
            raise ConfigError(f"rewards: do_sample must be True or False, got {short(self.do_sample)}")
        if not _number_in(self.temperature, lambda t: t > 0):
            raise ConfigError(f"rewards: temperature must be a finite number > 0, got {short(self.temperature)}")
        if not _number_in(self.top_p, lambda p: 0 < p <= 1):
            raise ConfigError(f"rewards: top_p must be a number in (0, 1], got {short(self.top_p)}")


def _number_in(value: Any, ok: Callable[[float], bool]) -> bool:
    try:
        return ok(finite_float(value))
    except ValueError:
        return False


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a completion: the tokenizer's EOS and the model's generation config's."""
    ids: list[int] = []
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return ids


def tokenize_prompts(tokenizer: Any, prompts: list[Any], conversational: bool,
                     where: Callable[[int], str] | None = None) -> list[list[int]]:
    """Each prompt's token ids, as TRL tokenizes them (a chat template with the generation prompt for
    conversations; the tokenizer's own special tokens for text).

    Raises:
        ConfigError: the tokenizer (or its chat template) raises on a prompt, or a prompt is zero tokens (a
            tokenizer that adds no BOS): named by ``where(i)`` (default ``"prompt i"``).
    """
    where = where or (lambda i: f"prompt {i}")
    if conversational:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("conversational prompts need a tokenizer with a chat template (tokenizer.chat_template "
                              "is None)")

        def encode(batch: list[Any]) -> list[list[int]]:
            return [list(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"]) for p in batch]
    else:
        def encode(batch: list[Any]) -> list[list[int]]:
            return [list(ids) for ids in tokenizer(batch)["input_ids"]]

    what = "the tokenizer's chat template" if conversational else "the tokenizer"
    try:
        out = encode(prompts)
    except Exception as exc:
        i = next((j for j in range(len(prompts)) if _raises(encode, prompts[j])), 0)
        raise ConfigError(f"{where(i)}: {what} raised {type(exc).__name__}: {one_line(exc)}") from exc
    if len(out) != len(prompts):
        raise ConfigError(f"{what} returned {len(out)} token lists for {len(prompts)} prompts")
    empty = next((i for i, ids in enumerate(out) if not ids), None)
    if empty is not None:
        raise ConfigError(f"{where(empty)}: the prompt is zero tokens with this tokenizer (it adds no BOS token); "
                          "generation needs at least one token")
    return out


def _raises(encode: Callable[[list[Any]], Any], prompt: Any) -> bool:
    try:
        encode([prompt])
    except Exception:
        return True
    return False


def left_pad(batch: list[list[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of a batch, padded on the left."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        if ids:
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids):] = 1
    return input_ids.to(device), mask.to(device)


def generate_completions(model: Any, tokenizer: Any, prompt_ids: list[list[int]], settings: GenerationSettings
                         ) -> list[list[int]]:
    """The completion token ids of every prompt (cut after the first EOS, which is kept), in the prompts' order.

    The model is used where it is (its device, its dtype), in eval mode and without gradients (its training
    flag is restored after)."""
    from transformers import GenerationConfig

    empty = next((i for i, ids in enumerate(prompt_ids) if not ids), None)
    if empty is not None:
        raise ConfigError(f"prompt {empty} is zero tokens; generation needs at least one token")
    eos = eos_ids(model, tokenizer)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (eos[0] if eos else 0)
    # A complete config of our own, put in place of the model's while generating: transformers fills fields it
    # was not given (and, in some versions, fields left at their defaults) from model.generation_config, where an
    # instruct model keeps e.g. repetition_penalty or do_sample=True; greedy here means greedy.
    config = GenerationConfig(max_new_tokens=settings.max_new_tokens, do_sample=settings.do_sample,
                              num_beams=1, use_cache=True, pad_token_id=pad, eos_token_id=eos or None,
                              bos_token_id=getattr(model.generation_config, "bos_token_id", None),
                              **({"temperature": float(settings.temperature), "top_p": float(settings.top_p),
                                  "top_k": int(settings.top_k)} if settings.do_sample else {}))
    device = _device_of(model)
    out: list[list[int]] = []
    with _eval_mode(model), _generation_config(model, config), torch.no_grad(), _seeded(settings, device):
        for start in range(0, len(prompt_ids), settings.batch_size):
            batch = prompt_ids[start:start + settings.batch_size]
            input_ids, mask = left_pad(batch, pad, device)
            generated = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
            for row in generated[:, input_ids.shape[1]:].tolist():
                out.append(_cut(row, eos))
    return out


def _cut(ids: list[int], eos: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1]
    return ids


def _device_of(model: Any) -> torch.device:
    """The device of the model's first weight not on meta; for a model offloaded with accelerate (its weights on
    meta), its hooks' execution device."""
    for p in model.parameters():
        if not p.is_meta:
            return p.device
    for sub in model.modules():
        device = getattr(getattr(sub, "_hf_hook", None), "execution_device", None)
        if device is not None:
            return torch.device(device)
    return torch.device("cpu")


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


@contextlib.contextmanager
def _generation_config(model: Any, config: Any) -> Iterator[None]:
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


@contextlib.contextmanager
def _seeded(settings: GenerationSettings, device: torch.device) -> Iterator[None]:
    if not settings.do_sample:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(settings.seed)
        yield
