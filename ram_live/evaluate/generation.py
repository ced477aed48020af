"""Batched, left-padded generation on the model where it is: greedy by default, seeded sampling per prompt as an
option (``k`` completions a prompt with ``samples=k``).

Completions are cut after the first end-of-sequence token and decoded without special tokens, as TRL's
GRPOTrainer decodes them, then cut at the first stop string (:mod:`.decoding`); conversational prompts go through
the tokenizer's chat template (``add_generation_prompt=True``) and their completions are
``[{"role": "assistant", "content": text}]``.
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..errors import ConfigError
from ..option_checks import finite_float
from .checks import one_line, short
from .models import device_of

__all__ = ["GenerationSettings", "generate_completions", "tokenize_prompts", "eos_ids"]

#: The largest ``seed``: seeds are ints in [0, 2**63 - 1] (a signed 64-bit int; torch takes them all).
SEED_MAX = 2**63 - 1


@dataclass(frozen=True)
class GenerationSettings:
    """How completions are generated (also what a ``generate=`` function of the user's is handed).

    Args:
        max_new_tokens: the most tokens generated per completion.
        batch_size: completions (rows) per ``generate`` call.
        do_sample: sample instead of greedy decoding (then ``temperature``, ``top_p``, ``top_k``, ``seed`` apply).
            Each completion draws from a random generator of its own, seeded from ``seed``, the prompt's index and
            the sample's number: the same completions at every call, whatever other prompts share the call.
        temperature: a finite number > 0, however small (one too small to tell tokens apart samples the most
            likely one: :class:`~ram_live.evaluate.decoding.RowSampler`). top_p: a number in (0, 1]. top_k: an int
            >= 0 (0: no top-k cut).
        seed: an int in [0, 2**63 - 1].
        samples: completions per prompt (k); k > 1 needs ``do_sample``.
        stop: stop strings: a completion ends at the first one (vLLM's ``stop``).
        include_stop: keep that stop string at the end of the completion (default: dropped, as vLLM does).
        eos_token_id: the token ids that end a completion (None: the tokenizer's EOS and the model's
            ``generation_config.eos_token_id``).

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
    samples: int = 1
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    eos_token_id: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size", "samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"rewards: {name} must be an int >= 1, got {short(value)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"rewards: seed must be an int in [0, 2**63 - 1], got {short(self.seed)}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"rewards: top_k must be an int >= 0 (0: no top-k cut), got {short(self.top_k)}")
        for name in ("do_sample", "include_stop"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"rewards: {name} must be True or False, got {short(getattr(self, name))}")
        if self.samples > 1 and not self.do_sample:
            raise ConfigError(
                f"rewards: samples={self.samples} with do_sample=False: greedy completions of a prompt "
                "are all the same; leave do_sample unset (k > 1 samples)"
            )
        if not _number_in(self.temperature, lambda t: t > 0):
            raise ConfigError(f"rewards: temperature must be a finite number > 0, got {short(self.temperature)}")
        if not _number_in(self.top_p, lambda p: 0 < p <= 1):
            raise ConfigError(f"rewards: top_p must be a number in (0, 1], got {short(self.top_p)}")
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", _token_ids(self.eos_token_id))


def _stop_strings(stop: Any) -> tuple[str, ...]:
    values = (stop,) if isinstance(stop, str) else stop
    if values is None:
        return ()
    if not isinstance(values, (list, tuple)) or not all(isinstance(s, str) and s for s in values):
        raise ConfigError(f"rewards: stop must be a non-empty string or a list of them, got {short(stop)}")
    return tuple(values)


def _token_ids(ids: Any) -> tuple[int, ...]:
    values = [ids] if isinstance(ids, numbers.Integral) and not isinstance(ids, bool) else ids
    if (
        not isinstance(values, (list, tuple))
        or not values
        or not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in values)
    ):
        raise ConfigError(
            f"rewards: eos_token_id must be a token id (an int >= 0) or a non-empty list of them, got {short(ids)}"
        )
    return tuple(int(t) for t in values)  # numpy integers (a tokenizer's ids) as ints


def _number_in(value: Any, ok: Callable[[float], bool]) -> bool:
    try:
        return ok(finite_float(value))
    except ValueError:
        return False


def eos_ids(model: Any, tokenizer: Any, settings: GenerationSettings | None = None) -> list[int]:
    """The tokens that end a completion: ``settings.eos_token_id`` when given, else the tokenizer's EOS and the
    model's generation config's."""
    return end_tokens(
        settings,
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
    )


def end_tokens(settings: GenerationSettings | None, *found: Any) -> list[int]:
    """``settings.eos_token_id`` when given, else the ids in ``found`` (each an id, a list of them or None), each
    once, in order: the one rule of every engine's end tokens."""
    if settings is not None and settings.eos_token_id is not None:
        return list(settings.eos_token_id)
    ids: list[int] = []
    for value in found:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return ids


def tokenize_prompts(
    tokenizer: Any, prompts: list[Any], conversational: bool, where: Callable[[int], str] | None = None
) -> list[list[int]]:
    """Each prompt's token ids, as TRL tokenizes them (a chat template with the generation prompt for
    conversations; the tokenizer's own special tokens for text).

    Raises:
        ConfigError: the tokenizer (or its chat template) raises on a prompt, or a prompt is zero tokens (a
            tokenizer that adds no BOS): named by ``where(i)`` (default ``"prompt i"``).
    """
    where = where or (lambda i: f"prompt {i}")
    if conversational:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError(
                "conversational prompts need a tokenizer with a chat template (tokenizer.chat_template is None)"
            )

        def encode(batch: list[Any]) -> list[list[int]]:
            return [
                list(
                    tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)[
                        "input_ids"
                    ]
                )
                for p in batch
            ]
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
        raise ConfigError(
            f"{where(empty)}: the prompt is zero tokens with this tokenizer (it adds no BOS token); "
            "generation needs at least one token"
        )
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
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = 1
    return input_ids.to(device), mask.to(device)


def generate_completions(
    model: Any,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    settings: GenerationSettings,
    indices: list[int] | None = None,
) -> list[list[int]]:
    """The completion token ids, ``settings.samples`` per prompt (prompt-major: prompt 0's samples, then prompt
    1's ...), each cut after the first EOS (kept) and, with stop strings, stopped early once one is written.

    Args:
        indices: each prompt's index in the whole prompt set, which seeds its samples (default 0, 1, ...).

    The model is used where it is (its device, its dtype), in eval mode and without gradients (its training
    flag is restored after)."""
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    from .decoding import RowSampler, StopOnStrings, prompt_seed

    empty = next((i for i, ids in enumerate(prompt_ids) if not ids), None)
    if empty is not None:
        raise ConfigError(f"prompt {empty} is zero tokens; generation needs at least one token")
    indices = list(range(len(prompt_ids))) if indices is None else indices
    eos = eos_ids(model, tokenizer, settings)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (eos[0] if eos else 0)
    # A complete config of our own, put in place of the model's while generating: transformers fills fields it
    # was not given (and, in some versions, fields left at their defaults) from model.generation_config, where an
    # instruct model keeps e.g. repetition_penalty or do_sample=True; greedy here means greedy. Sampling is done
    # by RowSampler (a logits processor leaving one token per row), so generate itself always decodes greedily.
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        do_sample=False,
        num_beams=1,
        use_cache=True,
        pad_token_id=pad,
        eos_token_id=eos or None,
        bos_token_id=getattr(model.generation_config, "bos_token_id", None),
    )
    rows = [(i, j) for i in range(len(prompt_ids)) for j in range(settings.samples)]
    device = device_of(model)
    out: list[list[int]] = []
    with _eval_mode(model), _generation_config(model, config), torch.no_grad():
        for start in range(0, len(rows), settings.batch_size):
            batch = rows[start : start + settings.batch_size]
            input_ids, mask = left_pad([prompt_ids[i] for i, _ in batch], pad, device)
            processors = LogitsProcessorList()
            if settings.do_sample:
                processors.append(RowSampler([prompt_seed(settings.seed, indices[i], j) for i, j in batch], settings))
            criteria = StoppingCriteriaList()
            if settings.stop:
                criteria.append(StopOnStrings(tokenizer, settings.stop, input_ids.shape[1]))
            generated = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=criteria,
            )
            for row in generated[:, input_ids.shape[1] :].tolist():
                out.append(_cut(row, eos))
    return out


def _cut(ids: list[int], eos: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


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
