"""What :func:`~ram_live.evaluate.generation.generate_completions` adds to Hugging Face ``generate``: sampling
with one seeded random generator per completion, stop strings, and the completions' texts.

**Seeds.** Completion ``j`` of prompt ``i`` draws its tokens from a generator seeded with
``prompt_seed(seed, i, j)``; a ``generate=`` function of the user's gets ``prompt_seed(seed, i)`` per prompt (vLLM:
``SamplingParams(n=k, seed=...)``). A prompt's samples are therefore the same whichever other prompts share its
batch, up to the numerics of the batch itself (left padding changes a batch's shapes, and on a GPU in half
precision that can move a logit by a rounding step).

**Stop strings.** A completion ends at the first stop string: the text is cut there, the stop string dropped
(vLLM's default; ``include_stop=True`` keeps it, as ``include_stop_str_in_output`` does), and its token ids end with
the token that completed the stop string.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

__all__ = ["RowSampler", "StopOnStrings", "prompt_seed", "cut_text", "texts_of"]


def prompt_seed(seed: int, index: int, sample: int | None = None) -> int:
    """A seed in [0, 2**31 - 1] for prompt ``index`` (and its sample ``sample``) from ``seed``: a hash, the same
    on every machine and Python process."""
    key = f"{seed}/{index}" if sample is None else f"{seed}/{index}/{sample}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") & 0x7FFFFFFF


class RowSampler:
    """A logits processor that samples each row's next token with the row's own generator (temperature, then
    top-k, then top-p, as transformers orders its warpers) and leaves only that token possible, so that greedy
    decoding picks it. The uniform draws come from CPU generators: the same on every device.

    The logits are scaled in float64 after subtracting each row's largest, so any temperature > 0 is safe: one
    so small that the scaled logits overflow samples the most likely token (evenly among tokens tied for it),
    the limit of sampling as the temperature goes to 0."""

    def __init__(self, seeds: Sequence[int], settings: Any) -> None:
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature = float(settings.temperature)
        self.top_k, self.top_p = int(settings.top_k), float(settings.top_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.double()
        top = logits.amax(dim=-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        # Shifted so each row's largest logit is 0 before dividing: no temperature can overflow them (the largest
        # stays 0, the others go to -inf at worst), so a temperature near 0 samples the most likely token.
        logits = (logits - top) / self.temperature
        vocab = logits.shape[-1]
        if 0 < self.top_k < vocab:
            kth = torch.topk(logits, self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=False, dim=-1)
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - self.top_p
            drop[:, -1] = False  # the most likely token always stays
            logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        cdf = logits.softmax(dim=-1).double().cumsum(dim=-1)
        draws = torch.tensor(
            [float(torch.rand((), generator=g, dtype=torch.float64)) for g in self.generators],
            dtype=torch.float64,
            device=cdf.device,
        )
        tokens = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1), right=True).clamp_(max=vocab - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, tokens, 0.0)


class StopOnStrings:
    """A stopping criterion: a row is done once the text of its last tokens (generated ones only) holds a stop
    string."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int) -> None:
        self.tokenizer, self.stop, self.start = tokenizer, tuple(stop), prompt_width
        self.window = max(len(s) for s in stop) + 8  # tokens: a stop string spans at most one per character

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        tail = input_ids[:, max(self.start, input_ids.shape[1] - self.window) :]
        texts = self.tokenizer.batch_decode(tail.tolist(), skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], dtype=torch.bool, device=input_ids.device)


def cut_text(text: str, stop: Sequence[str], include_stop: bool = False) -> tuple[str, bool]:
    """``text`` up to its first stop string (with it when ``include_stop``), and whether one was found."""
    hits = [(text.find(s), -len(s)) for s in stop if s in text]
    if not hits:
        return text, False
    at, minus = min(hits)  # the earliest; at one place, the longest
    return text[: at - minus if include_stop else at], True


def texts_of(
    tokenizer: Any, rows: list[list[int]], stop: Sequence[str] = (), include_stop: bool = False
) -> tuple[list[str], list[list[int]]]:
    """The completions' texts (decoded without special tokens) and token ids, cut at the first stop string."""
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    if not stop:
        return texts, rows
    out_texts, out_rows = [], []
    for text, ids in zip(texts, rows):
        cut, found = cut_text(text, stop, include_stop)
        if found:
            ids = ids[: _stop_end(tokenizer, ids, stop)]
        out_texts.append(cut)
        out_rows.append(ids)
    return out_texts, out_rows


def _stop_end(tokenizer: Any, ids: list[int], stop: Sequence[str]) -> int:
    """The length of the shortest prefix of ``ids`` whose text holds a stop string."""
    for t in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:t], skip_special_tokens=True)
        if any(s in text for s in stop):
            return t
    return len(ids)
