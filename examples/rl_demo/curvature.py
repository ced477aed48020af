"""Curvature-aware RAM in the demo: the curvature rows, the tuned TIES baseline, the extrapolation
control and the lines they print.

The specialists' snapshots carry their importances (``train.grpo``: Adam's raw ``exp_avg_sq``; the SGD agent a
policy Fisher), so ``merge(store.latest_all(), method="ram", importance="stored")`` is curvature-aware
(``MergeInfo.extra["importance"] == "stored"``); the plain RAM rows pass no ``importance`` (None: plain
RAM). Nothing here reads
the test prompts to choose anything: the tuned rows choose on the validation prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ram_live import merge

from .lang import accuracy
from .train import TIES_GRID

Data = dict[str, tuple[Tensor, Tensor]]
CURVATURE = ("RAM (curvature)", "RAM+ (curvature)", "RAM (curvature, bc)")
EXTRAPOLATION_CONTROL = (0.5, 1.0, 2.0)


def val_mean(model: nn.Module, val: Data) -> float:
    v = accuracy(model, val)
    return sum(v.values()) / len(v)


def tuned_ties(
    agents: Mapping[str, Any], base: nn.Module, val: Data, grid: tuple[float, ...] = TIES_GRID
) -> tuple[float, dict[float, float]]:
    """TIES' density chosen on the validation prompts (ties broken towards the sparser density)."""
    scores = {d: val_mean(merge(agents, base=base, method="ties", density=d), val) for d in grid}
    return max(grid, key=lambda d: (scores[d], -d)), scores


def curvature_rows(
    agents: Mapping[str, Any],
    base: nn.Module,
    bias_corrected: Mapping[str, Mapping[str, Tensor]],
    score: Callable[[str, nn.Module, float], None],
    out: Path,
) -> dict[str, dict[str, Any]]:
    """The three curvature rows, scored through ``score(label, model, seconds)``:

    * ``RAM (curvature)`` / ``RAM+ (curvature)``: the importances stored with the snapshots (raw ``exp_avg_sq``,
      one-byte codes); the RAM output is saved as ``merged_ram_curvature.safetensors``;
    * ``RAM (curvature, bc)``: float32 importances kept in memory, Adam's bias-corrected by 1/(1 − β₂^step).

    Returns each row's merge options and what ``MergeInfo.extra["importance"]`` said."""
    from safetensors.torch import save_file

    used: dict[str, dict[str, Any]] = {}
    for label, method, imp in (
        (CURVATURE[0], "ram", "stored"),
        (CURVATURE[1], "ram_plus", "stored"),
        (CURVATURE[2], "ram", bias_corrected),
    ):
        t0 = time.perf_counter()
        merged, info = merge(agents, base=base, method=method, importance=imp, return_info=True)
        sec = time.perf_counter() - t0
        how = info.extra.get("importance")
        if how != ("stored" if imp == "stored" else "given"):
            raise RuntimeError(f"{label}: the merge used importances {how!r} (every snapshot should carry them)")
        score(label, merged, sec)
        used[label] = {
            "method": method,
            "importance": "stored (raw exp_avg_sq)" if imp == "stored" else "given (bias-corrected, float32)",
            "merge_info": how,
            "lambdas": dict(info.lambdas or {}),
        }
        if label == CURVATURE[0]:
            save_file(
                {k: v.contiguous() for k, v in merged.state_dict().items()},
                str(out / "merged_ram_curvature.safetensors"),
            )
    return used


def extrapolation_line(by_agent: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """``{agent: {s: scores}}`` as one line: test mean / own task for each s."""
    return "; ".join(
        f"{a}: " + ", ".join(f"s={k} {v['mean']:.3f}/{v[a]:.3f}" for k, v in by.items()) for a, by in by_agent.items()
    )
