"""A prompt's score from its k sampled completions: ``mean@k`` (the mean reward) or ``pass@k`` (the unbiased
estimator of Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

``pass@k`` with ``n`` samples of which ``c`` are correct (combined reward >= ``pass_threshold``) is
``1 - C(n - c, k) / C(n, k)``: the chance that ``k`` of the ``n`` samples, drawn without replacement, hold at least
one correct one. ``k`` may be smaller than ``n`` (``samples=16, metric="pass@4"``), which lowers its variance.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ConfigError
from ..option_checks import finite_float
from .checks import short
from .moments import mean

__all__ = ["Metric", "parse_metric", "pass_at_k", "check_samples"]


@dataclass(frozen=True)
class Metric:
    """``kind`` ``"mean"`` or ``"pass"``, ``k`` (pass@k's k), ``threshold`` (a sample is correct when its
    combined reward is >= it)."""

    kind: str
    k: int
    threshold: float = 1.0

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.k}"

    def score(self, values: Sequence[float | None]) -> float | None:
        """The prompt's score from its samples' combined rewards (None: a sample no reward function scored).

        mean@k: the mean over the scored samples (None when none is). pass@k: an unscored sample counts as not
        correct; a prompt none of whose samples is scored is None."""
        scored = [v for v in values if v is not None]
        if not scored:
            return None
        if self.kind == "mean":
            return mean(scored)  # scaled: two rewards of -1.7e308 average to -1.7e308, not -inf
        return pass_at_k(len(values), sum(1 for v in scored if v >= self.threshold), self.k)


def check_samples(samples: Any) -> int:
    """``samples`` as an int >= 1 and below 2**31 (a generator's count of sequences; a bool is refused)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples < 2**31:
        raise ConfigError(
            f"rewards: samples must be an int >= 1 and < 2**31 (completions per prompt), got {short(samples)}"
        )
    return samples


def parse_metric(metric: Any, samples: int, pass_threshold: Any = 1.0) -> Metric:
    """``metric`` for ``samples`` completions a prompt.

    Args:
        metric: None or ``"mean@k"`` / ``"mean"`` / ``f"mean@{samples}"`` (the mean reward over the samples;
            the default), ``"pass@k"`` (k = ``samples``) or ``"pass@K"`` with 1 <= K <= ``samples``.
        samples: completions per prompt.
        pass_threshold: a sample is correct when its combined reward is >= this finite number (default 1.0).

    >>> parse_metric("pass@2", 8).name, parse_metric(None, 8).name
    ('pass@2', 'mean@8')
    """
    try:
        threshold = finite_float(pass_threshold)
    except ValueError as exc:
        raise ConfigError(
            f"rewards: pass_threshold must be a finite number, got {short(pass_threshold)}: {exc}"
        ) from None
    if metric is None:
        return Metric("mean", samples, threshold)
    match = re.fullmatch(r"(mean|pass)(?:@(k|\d+))?", metric) if isinstance(metric, str) else None
    if match is None or (match.group(1) == "pass" and match.group(2) is None):
        raise ConfigError(
            f"rewards: metric must be 'mean@k' or 'pass@k' (or 'pass@K', K <= samples), got {short(metric)}"
        )
    kind, k = match.group(1), match.group(2)
    # a K of more digits than samples is above it (int() of thousands of digits raises)
    digits = None if k in (None, "k") else k.lstrip("0") or "0"
    number = samples if digits is None else int(digits) if len(digits) <= len(str(samples)) else samples + 1
    if kind == "mean" and number != samples:
        raise ConfigError(
            f"rewards: metric {short(metric)}: mean@k averages every sample; with samples={samples} write "
            f"'mean@k' or 'mean@{samples}'"
        )
    if not 1 <= number <= samples:
        raise ConfigError(
            f"rewards: metric {short(metric)} needs 1 <= K <= samples ({samples}); raise samples= to estimate pass@K"
        )
    return Metric(kind, number, threshold)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``.

    Args:
        n: the samples drawn.
        c: how many of them are correct.
        k: the k of pass@k.

    Returns:
        The chance that ``k`` of the ``n`` samples, drawn without replacement, hold a correct one (1.0 when
        ``n - c < k``).

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.

    >>> pass_at_k(4, 1, 2)
    0.5
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
