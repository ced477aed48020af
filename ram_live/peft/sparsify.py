"""Activity rules for dense LoRA ΔW: which entries of an adapter's ΔW count as updated."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .. import functional as F
from ..errors import ConfigError
from ..methods import RAM_METHODS as RAM_FAMILY


@dataclass(frozen=True)
class TopK:
    """Keep, per adapter and per module, the ``density`` fraction of ΔW entries of largest magnitude (k =
    int(density · numel), entries tied with the k-th magnitude kept); the rest count as "not updated".

    Attributes:
        density: the fraction kept, in (0, 1] (1: keep all).

    Raises:
        ConfigError: ``density`` is not a number in (0, 1].

    >>> ram_merge_adapters(peft_model, ["code", "tool"], sparsify=TopK(0.3))   # doctest: +SKIP
    """

    density: float = 0.2

    def __post_init__(self) -> None:
        if not (isinstance(self.density, (int, float)) and 0.0 < self.density <= 1.0):
            raise ConfigError(f"TopK.density must be in (0, 1], got {self.density!r}")

    def cut(self, delta: Tensor) -> float | None:
        """The magnitude cut of one adapter's ΔW for one module.

        Args:
            delta: the module's ΔW.

        Returns:
            The k-th largest |Δ|: entries with |Δ| below it are dropped (``None``: keep all, density 1;
            ``inf``: keep none, k = 0).
        """
        return F.magnitude_threshold(delta, self.density)

    def __str__(self) -> str:
        return f"topk(density={self.density:g})"


@dataclass(frozen=True)
class RelativeThreshold:
    """Keep, per adapter and per module, the ΔW entries with |Δ| > ``threshold`` · RMS(ΔW of that module);
    for Gaussian-like deltas threshold 1.0 keeps ≈ 32 %, 2.0 keeps ≈ 4.6 %.

    Attributes:
        threshold: the multiple of the module's RMS an entry must exceed; >= 0 (0: keep every non-zero entry).

    Raises:
        ConfigError: ``threshold`` is not a number >= 0.

    >>> ram_merge_adapters(peft_model, ["code", "tool"], sparsify=RelativeThreshold(2.0))   # doctest: +SKIP
    """

    threshold: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and self.threshold >= 0.0):
            raise ConfigError(f"RelativeThreshold.threshold must be >= 0, got {self.threshold!r}")

    def cut(self, delta: Tensor) -> float | None:
        """The magnitude cut of one adapter's ΔW for one module.

        Args:
            delta: the module's ΔW.

        Returns:
            The cut: entries with |Δ| below it are dropped. The rule is strict (|Δ| > t, t = threshold · RMS): the
            cut is the next float above t, so that |Δ| == t is dropped too. ``None`` (keep all) when t is 0
            (threshold 0, or ΔW = 0).
        """
        t = float(self.threshold * delta.float().pow(2).mean().sqrt())
        return math.nextafter(t, math.inf) if t > 0 else None

    def __str__(self) -> str:
        return f"relative(threshold={self.threshold:g}×rms)"


SparsifyRule = TopK | RelativeThreshold

#: The rule ``sparsify="auto"`` uses for the RAM family; chosen by ``examples/lora_activity_experiment.py``
#: (see the README section "LoRA / PEFT adapters").
RECOMMENDED_SPARSIFY: SparsifyRule = TopK(0.5)


def sparsify_rule(sparsify: Any, method: str) -> SparsifyRule | None:
    if sparsify == "auto":
        return RECOMMENDED_SPARSIFY if method in RAM_FAMILY else None
    if sparsify is None or sparsify in ("none", "dense"):
        return None
    if isinstance(sparsify, (TopK, RelativeThreshold)):
        return sparsify
    if sparsify == "topk":
        return TopK()
    if sparsify == "relative":
        return RelativeThreshold()
    if isinstance(sparsify, tuple) and len(sparsify) == 2 and sparsify[0] in ("topk", "relative"):
        return TopK(sparsify[1]) if sparsify[0] == "topk" else RelativeThreshold(sparsify[1])
    raise ConfigError(
        f"sparsify must be 'auto', None, 'topk', 'relative', ('topk', density), ('relative', threshold), TopK(...) "
        f"or RelativeThreshold(...); got {sparsify!r}"
    )
