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

It returns, per prompt, its k completion texts (with k = 1 a plain string per prompt is accepted). The texts
are cut at the first stop string here too (a no-op when the engine already stopped there). ``completion_ids``
reach the reward functions as the tokenizer's encoding of the texts (no special tokens) when ``tokenizer=`` is
given, else None.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import EvaluationError
from .checks import one_line, short
from .decoding import cut_text, prompt_seed, texts_of
from .generation import GenerationSettings, generate_completions, tokenize_prompts
from .models import Resolver
from .prompts import Prompts

__all__ = ["Engine", "completions_of"]


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
        except Exception as exc:
            raise EvaluationError(f"generate={name} raised {type(exc).__name__}: {one_line(exc)}") from exc
        got = short(out)
        try:
            out = None if isinstance(out, (str, bytes)) else list(out)
        except TypeError:
            out = None
        if out is None or len(out) != len(indices):
            got = f"{len(out)} items" if out is not None else got
            raise EvaluationError(
                f"generate={name} returned {got} for {len(indices)} prompts; one list of "
                f"{s.samples} completion text(s) per prompt is expected"
            )
        texts: list[str] = []
        for p, item in enumerate(out):
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
