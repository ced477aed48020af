"""Held-out merge selection in the demo: a selection split disjoint from the test prompts, ``ram_live.search``
rows (the default space, and each baseline family alone under the same budget), the over-trained-agent scenario
(defaults, frozen and re-selected settings) and single agents extrapolated (base + s·τ).

The test prompts are only ever scored, never used for choosing: every choice reads the selection split.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ram_live import merge

from .lang import accuracy, make_prompts
from .train import N, stage

Data = dict[str, tuple[Tensor, Tensor]]

# Each baseline family alone, as ``space=`` of ram_live.search, under the same budget as the full search: task
# arithmetic (its scale grid, then per-agent weights by coordinate ascent), TIES and DARE-TIES on a density ×
# scale grid of 60 (their default grids hold 9, which would leave them most of the budget unused).
_GRID60 = {"density": [0.1, 0.2, 0.3, 0.5, 0.7, 0.9], "scale": [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0]}
FAMILY_SPACES: dict[str, Any] = {"TA": ["task_arithmetic", "ta_weights"], "TIES": {"ties": _GRID60},
                                 "DARE-TIES": {"dare_ties": _GRID60}}
# Fixed settings scored in the over-trained scenario ("defaults": no selection at all).
DEFAULTS: dict[str, dict[str, Any]] = {
    "sum (TA 1.0)": {"method": "task_arithmetic", "scale": 1.0},
    "TA (1/N)": {"method": "task_arithmetic", "scale": 1 / N},
    "TIES": {"method": "ties", "density": 0.2},
    "DARE+TIES": {"method": "dare_ties", "density": 0.5},
    "RAM+": {"method": "ram_plus"},
}
EXTRAPOLATION_SCALES = (1.0, 2.0, 4.0)


def selection_split(test: Data, n: int, seed: int) -> Data:
    """``n`` prompts per task from their own generator, none of whose digit strings is a test prompt's."""
    out: Data = {}
    for i, task in enumerate(test):
        taken = {tuple(row) for row in test[task][0][:, 1:].tolist()}
        g = torch.Generator().manual_seed(40_000 + 10 * seed + i)
        prompts, answers = [], []
        while sum(len(p) for p in prompts) < n:
            p, a = make_prompts(task, g, n)
            keep = torch.tensor([tuple(row) not in taken for row in p[:, 1:].tolist()])
            prompts.append(p[keep])
            answers.append(a[keep])
        out[task] = (torch.cat(prompts)[:n], torch.cat(answers)[:n])
    return out


def scored(model: nn.Module, data: Data) -> dict[str, float]:
    acc = accuracy(model, data)
    acc["mean"] = sum(acc[t] for t in data) / len(data)
    return acc


def mean_accuracy(data: Data) -> Callable[[nn.Module], float]:
    """The user's evaluation for ``search``: mean greedy accuracy over the tasks on ``data``."""
    return lambda model: scored(model, data)["mean"]


def search_row(agents: Mapping[str, Any], base: nn.Module, sel: Data, test: Data, *, budget: int, seed: int,
               space: Any = None) -> dict[str, Any]:
    """One ``ram_live.search`` on the selection split; the winner re-made with ``merge(**best)`` and scored on
    the test prompts. Times: search wall, evaluate, and the rest (overhead)."""
    from ram_live import search

    t0 = time.perf_counter()
    name = "search" if space is None else f"search {next(iter(space))}"
    best = [float("-inf"), 0]  # best score so far, evaluations so far

    def progress(trial: Any) -> None:
        if trial.score is not None:
            best[0], best[1] = max(best[0], trial.score), best[1] + 1
        stage(name[:14], best[1], budget, t0, f"best {best[0]:.3f}")

    result = search(agents, base=base, evaluate=mean_accuracy(sel), budget=budget, seed=seed, space=space,
                    progress=progress)
    if best[1] < budget:  # the space ran out before the budget: end the bar's line
        stage(name[:14], budget, budget, t0, f"best {best[0]:.3f} ({best[1]} evaluations)")
    wall = time.perf_counter() - t0
    merged = merge(agents, base=base, **result.best)
    best_trial = result.best_trial
    baseline = result.best_baseline
    return {
        "best": result.best, "selection": result.best_score, "test": scored(merged, test),
        "evaluations": len(result.scored), "extrapolation": best_trial.extrapolation,
        "best_baseline": None if baseline is None else {"method": baseline.method, **baseline.options,
                                                        "selection": baseline.score},
        "best_ram": None if result.best_ram is None else {**result.best_ram.candidate,
                                                          "selection": result.best_ram.score},
        "seconds": {"wall": wall, "merge": result.merge_seconds, "evaluate": result.evaluate_seconds,
                    "overhead": wall - result.evaluate_seconds, "overhead_reported": result.overhead_seconds},
        "overhead_share": (wall - result.evaluate_seconds) / wall if wall > 0 else 0.0,
        "result": result,
    }


def search_rows(agents: Mapping[str, Any], base: nn.Module, sel: Data, test: Data, *, budget: int, seed: int,
                families: bool, log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """``search`` (the default space) and, with ``families``, each baseline family alone, same budget."""
    rows = {"search": search_row(agents, base, sel, test, budget=budget, seed=seed)}
    log(f"search: {line(rows['search'])}")
    if families:
        for name, space in FAMILY_SPACES.items():
            rows[f"search {name}"] = search_row(agents, base, sel, test, budget=budget, seed=seed, space=space)
            log(f"search {name}: {line(rows[f'search {name}'])}")
    return rows


def line(row: Mapping[str, Any]) -> str:
    return (f"selection {row['selection']:.3f}, test {row['test']['mean']:.3f}, {row['evaluations']} evaluations, "
            f"overhead {row['overhead_share']:.1%} of {row['seconds']['wall']:.1f} s; best {row['best']}")


def overtrained(agents: Mapping[str, Any], base: nn.Module, name: str, factor: float) -> dict[str, dict[str, Tensor]]:
    """The agents as state dicts, with ``name`` replaced by base + factor·τ (computed in float32, stored in the
    agents' dtype)."""
    b = base.state_dict()
    out = {}
    for agent, snap in agents.items():
        sd = dict(snap) if isinstance(snap, Mapping) else dict(snap.to_state_dict())
        if agent == name:
            sd = {k: (b[k].float() + factor * (v.float() - b[k].float())).to(v.dtype) if v.is_floating_point() else v
                  for k, v in sd.items()}
        out[agent] = sd
    return out


def extrapolated(agents: Mapping[str, Any], base: nn.Module, test: Data,
                 scales: tuple[float, ...] = EXTRAPOLATION_SCALES) -> dict[str, dict[str, dict[str, float]]]:
    """Each agent alone, extrapolated: base + s·τ_agent scored on the test prompts (s = 1 is the specialist)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for agent, snap in agents.items():
        out[agent] = {}
        for s in scales:
            sd = overtrained({agent: snap}, base, agent, s)[agent]
            model = merge({agent: sd}, base=base, method="task_arithmetic", scale=1.0)
            out[agent][f"{s:g}"] = scored(model, test)
    return out


def overtrained_study(agents: Mapping[str, Any], base: nn.Module, sel: Data, test: Data, normal: Mapping[str, Any],
                      *, name: str, factor: float, budget: int, seed: int,
                      log: Callable[[str], None] = print) -> dict[str, Any]:
    """One agent over-trained (τ × factor): the fixed defaults, the settings selected on the normal agents applied
    unchanged (frozen), and every search re-run on the over-trained agents (re-selected)."""
    ot = overtrained(agents, base, name, factor)
    fixed = {k: ({**v, "scale": 1 / len(agents)} if k == "TA (1/N)" else v) for k, v in DEFAULTS.items()}
    defaults = {label: {"options": opts, "test": scored(merge(ot, base=base, **opts), test)}
                for label, opts in fixed.items()}
    frozen = {label: {"options": row["best"], "test": scored(merge(ot, base=base, **row["best"]), test)}
              for label, row in normal.items()}
    reselected = search_rows(ot, base, sel, test, budget=budget, seed=seed, families=len(normal) > 1, log=log)
    for label, row in reselected.items():
        log(f"over-trained {name} × {factor:g}, re-selected {label}: {line(row)}")
    return {"agent": name, "factor": factor, "defaults": defaults, "frozen": frozen, "reselected": reselected}


def summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """A search row without the SearchResult object, its table and full history as JSON."""
    from ram_live.search import to_json

    out = {k: to_json(v) for k, v in row.items() if k != "result"}
    if "result" in row:
        out["history"] = row["result"].to_dict()
    return out


def print_table(title: str, rows: Mapping[str, Mapping[str, Any]]) -> None:
    """``{label: {"test": acc, ["selection": s]}}`` as a table."""
    tasks = [t for t in next(iter(rows.values()))["test"] if t != "mean"]
    head = f"{'setting':<24}" + "".join(f"{t:>8}" for t in tasks) + f"{'mean':>8}{'select':>8}"
    print(f"\n{title}\n{head}\n{'-' * len(head)}")
    for label, row in rows.items():
        acc, sel = row["test"], row.get("selection")
        print(f"{label:<24}" + "".join(f"{acc[t]:>8.3f}" for t in tasks) + f"{acc['mean']:>8.3f}"
              + (f"{sel:>8.3f}" if sel is not None else f"{'-':>8}"))
