"""The demo's two regimes and its N-agent settings.

* ``dense`` (default): today's recipes (SGD / Adam / AdamW per task); extra tasks of ``--agents`` > 3 cycle those
  three recipes. The 3-agent dense run is bit-identical to the demo before this module existed.
* ``sparse``: the paper's regime, produced by training, not by masking: float32 master weights, bf16 snapshots,
  learning rates × steps small next to the weights' bf16 ULP, so most entries never move by half a ULP and keep
  their stored value. Recipes were chosen by their densities / unique shares (benchmarks/quality.md lists every
  recipe tried), never by merge scores.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .train import DEFAULT, QUICK, SFT_TARGET, Recipe, Settings

# the paper's three agents (Qwen2.5-7B-Instruct): share of all parameters changed, unique share of the changed ones
PAPER = {"coding": (0.032, 0.063), "tool use": (0.462, 0.408), "memory": (0.543, 0.475)}

_DENSE_CYCLE = ("shift", "rev", "sort")  # task whose dense recipe an extra task takes: comp, rot, sortd, swap, dbl
# Sparse regime: every agent SGD, learning rates up to 75× apart. SGD moves an entry by lr·|g| per step, so a small
# lr (4e-5) leaves all but the entries with the largest |g|/|w| below half a bf16 ULP (the sparse agents: shift,
# swap); 1e-3..3e-3 moves 20-55 % of the entries. (Adam moves every entry with a gradient by ~lr per step, so in bf16
# it only keeps changes to small |w|: dense or useless at any lr scanned; see benchmarks/quality.md.)
SPARSE: dict[str, Recipe] = {
    "shift": Recipe("sgd", 4e-5, 30),
    "rev": Recipe("sgd", 3e-3, 30),
    "sort": Recipe("sgd", 2e-3, 40),
    "comp": Recipe("sgd", 3e-3, 30),
    "rot": Recipe("sgd", 1e-3, 30),
    "sortd": Recipe("sgd", 2e-3, 40),
    "swap": Recipe("sgd", 4e-5, 30),
    "dbl": Recipe("sgd", 1e-3, 30),
}
SPARSE_SFT_TARGET = SFT_TARGET
# the base must stay partly competent on every task: a task that reached the target keeps 1/32 of its batch (1/8
# lifts shift to 90-100 %, leaving its specialist nothing to gain; 0 lets it be forgotten)
SPARSE_SFT_REPLAY = 1 / 32


def settings(regime: str, tasks: tuple[str, ...], quick: bool) -> tuple[Settings, float]:
    """The demo's settings and SFT target for ``regime`` and these tasks."""
    s = QUICK if quick else DEFAULT
    if regime == "dense":
        recipes = {t: s.recipes[t] if t in s.recipes else s.recipes[_DENSE_CYCLE[i % 3]] for i, t in enumerate(tasks)}
        return dataclasses.replace(s, recipes=recipes), SFT_TARGET
    recipes = {t: SPARSE[t] for t in tasks}
    return dataclasses.replace(s, recipes=recipes, sft_replay=SPARSE_SFT_REPLAY), SPARSE_SFT_TARGET


def methods(n: int) -> list[tuple[str, str, dict[str, Any]]]:
    """The fixed merge rows: TA/DARE+TA at 1/N; TIES/DARE at the paper's/PEFT's usual densities."""
    return [
        ("TA (1/N)", "task_arithmetic", {"scale": 1 / n}),
        ("TA (tuned)", "task_arithmetic", {}),  # scale filled in from the validation grid
        ("TIES", "ties", {"density": 0.2}),
        ("DARE+TA", "dare_linear", {"density": 0.5, "scale": 1 / n}),
        ("DARE+TIES", "dare_ties", {"density": 0.5}),
        ("RAM", "ram", {}),
        ("RAM+", "ram_plus", {}),
        ("RAM+s", "ram_plus_soft", {}),
        ("RAM (sign)", "ram", {"shared": "sign"}),  # conflict-aware shared region (not the paper's rule)
        ("RAM+ (sign)", "ram_plus", {"shared": "sign"}),
    ]


def paper_table(report: Any, density: dict[str, float]) -> str:
    """The probe's density (bf16: stored value changed) and unique share per agent, next to the paper's three."""
    lines = [f"{'agent':<10}{'changed (bf16)':>15}{'|τ|>1e-5':>10}{'unique share':>14}{'ρ':>8}   paper"]
    paper = list(PAPER.items())
    for i, (t, a) in enumerate(report.agents.items()):
        ref = f"{paper[i][0]}: {paper[i][1][0]:.1%} / {paper[i][1][1]:.1%}" if i < len(paper) else ""
        lines.append(f"{t:<10}{density[t]:>15.1%}{a.density:>10.1%}{a.unique_share:>14.1%}{a.rho:>8.2f}   {ref}")
    hist = report.histogram
    total = sum(hist)
    lines.append("overlap count c = 0…N, share of entries: " + " / ".join(f"{h / total:.1%}" for h in hist))
    return "\n".join(lines)
