"""Where completions come from: Hugging Face ``generate`` on the model handed in (the default), or a
``generate=`` function of the user's, so a GPU run evaluates with the engine its RL run already uses (vLLM,
SGLang, a served endpoint).

**The generator signature.** ``generate(merged, prompts, settings, seeds) -> list[list[str]]``:

- ``merged``: what the evaluation was handed, as it was handed (a module, a state dict or a folder): the
  generator puts those weights into its engine (vLLM: ``load_weights``; a server: its weight-update endpoint);
- ``prompts``: the prompts to complete, as loaded (strings, or lists of chat messages to render with the engine's
  chat template), in the prompts' order;
- ``settings``: :class:`~ram_live.evaluate.GenerationSettings`: ``samples`` (k), ``max_new_tokens``, ``do_sample``,
  ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``include_stop``, ``eos_token_id``;
- ``seeds``: one seed per prompt (from ``seed`` and the prompt's index: a prompt gets the same seed whatever
  other prompts share the call), e.g. vLLM's ``SamplingParams(seed=...)``.

It returns, per prompt, its k completion texts (with k = 1 a plain string per prompt is accepted), in a list,
a tuple or another ordered iterable (a generator too); a mapping (``{prompt: text}``) or a set is refused: their
order is not the prompts'. The texts
are cut at the first stop string here too (a no-op when the engine already stopped there). ``completion_ids``
reach the reward functions as the tokenizer's encoding of the texts (no special tokens) when ``tokenizer=`` is
given, else None.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Set
from itertools import islice
from typing import Any, Callable, Sequence

from ..errors import EvaluationError, RamLiveError
from .calling import FAILURES
from .checks import existing_source, loadable_dtype, one_line, short, token_ids_in, usable_device, vocab_size
from .decoding import cut_text, prompt_seed, texts_of
from .generation import GenerationSettings, generate_completions, tokenize_prompts
from .models import Resolver, generator_of, parse_device, parse_dtype
from .prompts import Prompts

__all__ = ["Engine", "checked_resolver", "completions_of"]


def checked_resolver(
    model: Any, tokenizer: Any, device: Any = None, dtype: Any = None, eos_token_id: Sequence[int] | None = None
) -> Resolver:
    """A :class:`Resolver` for an evaluation being built, with what can be checked now checked now (not at the
    first evaluation, which inside a training run may be hours later).

    Args:
        model, tokenizer, device, dtype: as :func:`~ram_live.evaluate.rewards` takes them.
        eos_token_id: the checked token ids (``GenerationSettings.eos_token_id``), or None.

    Returns:
        The resolver; a ``tokenizer=`` folder is already loaded.

    Raises:
        ConfigError: a device this torch cannot use, a dtype a model cannot run in, a ``model=``/``tokenizer=``
            path that does not exist and is no cached model id (or a model folder without ``config.json``, a
            tokenizer folder that does not load), an ``eos_token_id`` past the vocabulary of ``model=`` (else of
            the tokenizer)."""
    device, dtype = parse_device(device), parse_dtype(dtype)
    usable_device(device)
    loadable_dtype(dtype)
    folder = existing_source(model, "model")
    existing_source(tokenizer, "tokenizer")
    resolver = Resolver(model=model, tokenizer=tokenizer, device=device, dtype=dtype)
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = resolver.tokenizer(None)  # loaded now: a folder without a tokenizer fails here
    if eos_token_id is not None:
        try:
            known = folder if folder is None or isinstance(folder, (str, os.PathLike)) else generator_of(folder)
        except EvaluationError:  # no generate-capable module inside: its error comes at the first call
            known = None
        token_ids_in(eos_token_id, *vocab_size(known, tokenizer))
    return resolver


def completions_of(texts: list[Any], conversational: bool) -> list[Any]:
    """Completions as TRL hands them to reward functions: texts, or ``[{"role": "assistant", "content": t}]``."""
    return [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)


class Engine:
    """Generates ``settings.samples`` completions for chosen prompts: ``run(merged, indices) -> (texts, ids)``,
    rows prompt-major."""

    def __init__(
        self,
        prompts: Prompts,
        settings: GenerationSettings,
        resolver: Resolver,
        generate: Callable[..., Any] | None = None,
    ) -> None:
        self.prompts, self.settings, self.resolver, self.generate = prompts, settings, resolver, generate
        self._ids: dict[int, list[list[int]]] = {}  # prompt ids per tokenizer (tokenized once)

    def run(self, merged: Any, indices: list[int]) -> tuple[list[str], list[list[int]] | None]:
        if self.generate is not None:
            return self._custom(merged, indices)
        model, tokenizer = self.resolver.resolve(merged)
        token_ids_in(self.settings.eos_token_id, *vocab_size(model))
        ids = self._prompt_ids(tokenizer)
        rows = generate_completions(model, tokenizer, [ids[i] for i in indices], self.settings, indices)
        return texts_of(tokenizer, rows, self.settings.stop, self.settings.include_stop)

    def _prompt_ids(self, tokenizer: Any) -> list[list[int]]:
        key = id(tokenizer)
        if key not in self._ids:
            self._ids = {
                key: tokenize_prompts(tokenizer, self.prompts.prompts, self.prompts.conversational, self.prompts.where)
            }
        return self._ids[key]

    def _custom(self, merged: Any, indices: list[int]) -> tuple[list[str], list[list[int]] | None]:
        s, fn = self.settings, self.generate
        name = getattr(fn, "__name__", None) or type(fn).__name__
        try:
            out = fn(
                merged,
                [self.prompts.prompts[i] for i in indices],
                s,  # type: ignore[misc]
                [prompt_seed(s.seed, i) for i in indices],
            )
        except RamLiveError:  # the library's own engine (VLLMGenerate) names what is at fault itself
            raise
        except FAILURES as exc:
            detail = one_line(exc)
            raise EvaluationError(
                f"generate={name} raised {type(exc).__name__}" + (f": {detail}" if detail else "")
            ) from exc
        texts: list[str] = []
        for p, item in enumerate(_per_prompt(out, name, len(indices), s.samples)):
            group = [item] if isinstance(item, str) and s.samples == 1 else item
            if (
                not isinstance(group, (list, tuple))
                or len(group) != s.samples
                or not all(isinstance(t, str) for t in group)
            ):
                raise EvaluationError(
                    f"generate={name} returned {short(item)} for prompt {indices[p]}; "
                    f"{s.samples} completion text(s) (a list of str) are expected"
                )
            texts.extend(cut_text(t, s.stop, s.include_stop)[0] if s.stop else t for t in group)
        return texts, self._encode(texts)

    def _encode(self, texts: list[str]) -> list[list[int]] | None:
        if self.resolver.given_tokenizer is None:
            return None
        tokenizer = self.resolver.tokenizer(None)
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _per_prompt(out: Any, name: str, n: int, k: int) -> list[Any]:
    """What a ``generate=`` function returned, as one item per prompt, in the prompts' order: a list, a tuple or
    another ordered iterable (a generator is read to its end, at most one item past ``n``).

    Raises:
        EvaluationError: a mapping (its keys are no completions; look the prompts up and return a list), a set
            (no order), a string, a non-iterable, an iterable that raises while it is read, or not ``n`` items."""
    expected = f"one list of {k} completion text(s) per prompt, in the prompts' order, is expected"
    if isinstance(out, Mapping):
        why = f"a {type(out).__name__} (a mapping: return [completions[p] for p in prompts] instead)"
    elif isinstance(out, (Set, str, bytes, bytearray)) or not hasattr(out, "__iter__"):
        why = f"a {type(out).__name__}, which has no order ({short(out)})" if isinstance(out, Set) else short(out)
    else:
        why = None
    if why is not None:
        raise EvaluationError(f"generate={name} returned {why} for {n} prompts; {expected}")
    items: list[Any] = []
    try:
        for item in islice(out, n + 1):
            items.append(item)
    except FAILURES as exc:
        raise EvaluationError(
            f"generate={name} returned an iterable that raised {type(exc).__name__} after {len(items)} of {n} "
            f"prompts" + (f": {one_line(exc)}" if one_line(exc) else "")
        ) from exc
    if len(items) != n:
        got = f"{len(items)} items" if len(items) < n else f"more than {n} items"
        raise EvaluationError(f"generate={name} returned {got} for {n} prompts; {expected}")
    return items
