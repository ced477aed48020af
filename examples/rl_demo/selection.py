"""Held-out merge selection in the demo: a selection split disjoint from the test prompts, ``ram_live.search``
rows (the default space, and each baseline family alone under the same budget), the over-trained-agent scenario
(defaults, frozen and re-selected settings) and single agents extrapolated (base + s·τ).

The test prompts are only ever scored, never used for choosing: every choice reads the selection split.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ram_live import merge

from .lang import accuracy, generate, make_prompts
from .train import N, stage

Data = dict[str, tuple[Tensor, Tensor]]

# Each baseline family alone, as ``space=`` of ram_live.search, under the same budget as the full search: task
# arithmetic (its scale grid, then per-agent weights by coordinate ascent), TIES and DARE-TIES on a density ×
# scale grid of 60 (their default grids hold 9, which would leave them most of the budget unused).
_GRID60 = {"density": [0.1, 0.2, 0.3, 0.5, 0.7, 0.9], "scale": [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0]}
FAMILY_SPACES: dict[str, Any] = {
    "TA": ["task_arithmetic", "ta_weights"],
    "TIES": {"ties": _GRID60},
    "DARE-TIES": {"dare_ties": _GRID60},
}
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


class PromptAccuracy:
    """:func:`mean_accuracy` with ``search``'s prompt protocol (ram_live/selection/fidelity.py): prompts are numbered
    task by task in ``data``'s order; a prompt scores 1.0 when its greedy answer matches exactly, else 0.0.

    ``prompt_scores`` generates only the prompts asked for, one batch per task, in float32 on the model's stored
    weights (as :func:`~rl_demo.lang.accuracy`); ``aggregate`` is the mean over tasks of each task's mean, each
    task's mean taken in float32 as ``accuracy`` takes it, so that on every prompt (one batch per task) the score
    is bit for bit ``mean_accuracy(data)``'s.
    """

    def __init__(self, data: Data) -> None:
        self.data = data
        self.tasks = [t for t, (p, _) in data.items() for _ in range(len(p))]
        self.start: dict[str, int] = {}
        for i, t in enumerate(self.tasks):
            self.start.setdefault(t, i)

    def prompt_tasks(self) -> list[str]:
        return list(self.tasks)

    @torch.no_grad()
    def prompt_scores(self, model: nn.Module, indices: Any) -> list[float]:
        indices = [int(i) for i in indices]
        if not indices:
            return []
        m = model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
        m.eval()
        out: dict[int, float] = {}
        by_task: dict[str, list[int]] = {}
        for i in indices:
            by_task.setdefault(self.tasks[i], []).append(i)
        for task, ids in by_task.items():
            prompts, answers = self.data[task]
            rows = torch.tensor([i - self.start[task] for i in ids])
            hit = (generate(m, prompts[rows], answers.shape[1]) == answers[rows]).all(1)
            out.update(zip(ids, hit.float().tolist()))
        return [out[i] for i in indices]

    def aggregate(self, values: Mapping[int, float | None]) -> tuple[float, dict[str, float]]:
        groups: dict[str, list[float]] = {}
        for i, v in values.items():
            if v is not None:
                groups.setdefault(self.tasks[i], []).append(float(v))
        tasks = {t: float(torch.tensor(groups[t], dtype=torch.float32).mean()) for t in self.data if t in groups}
        return sum(tasks.values()) / len(tasks), tasks

    def __call__(self, model: nn.Module) -> float:
        return self.aggregate(dict(enumerate(self.prompt_scores(model, range(len(self.tasks))))))[0]


def search_row(
    agents: Mapping[str, Any],
    base: nn.Module,
    sel: Data,
    test: Data,
    *,
    budget: int | str,
    seed: int,
    space: Any = None,
    fidelity: Any = None,
    parallel: int = 1,
) -> dict[str, Any]:
    """One ``ram_live.search`` on the selection split (scored by :class:`PromptAccuracy`); the winner re-made with
    ``merge(**best)`` and scored on the test prompts. ``budget``: candidates (an int) or prompt-evaluations
    (``"20x"``); ``fidelity``, ``parallel``: as ``search``'s (``"halving"``: the race; ``parallel`` > 1: worker
    processes). Times: search wall, evaluate, and the rest (overhead); ``prompt_evaluations``: the prompts the
    trials were scored on, in all."""
    from ram_live import search

    t0 = time.perf_counter()
    name = "search" if space is None else f"search {next(iter(space))}"
    in_prompts = isinstance(budget, str)
    total = float(budget.strip().lower().rstrip("x")) if in_prompts else float(budget)
    shown = max(1, round(total))
    best = [float("-inf"), 0.0]  # best score so far, budget used so far

    def progress(trial: Any) -> None:
        if trial.score is not None:
            best[0], best[1] = max(best[0], trial.score), best[1] + (trial.fidelity if in_prompts else 1)
        stage(name[:14], min(shown, int(best[1] + 1e-9)), shown, t0, f"best {best[0]:.3f}")

    evaluate = PromptAccuracy(sel)
    more = {"parallel": parallel} if parallel != 1 else {}  # (a search without parallel= runs the rest)
    result = search(
        agents,
        base=base,
        evaluate=evaluate,
        budget=budget,
        seed=seed,
        space=space,
        progress=progress,
        fidelity=fidelity,
        **more,
    )
    if int(best[1] + 1e-9) < shown:  # the space (or the room for one more full candidate) ran out: end the line
        stage(name[:14], shown, shown, t0, f"best {best[0]:.3f} ({best[1]:.3g} spent)")
    wall = time.perf_counter() - t0
    merged = merge(agents, base=base, **result.best)
    best_trial = result.best_trial
    baseline = result.best_baseline
    return {
        "best": result.best,
        "selection": result.best_score,
        "test": scored(merged, test),
        "evaluations": len(result.scored),
        "extrapolation": best_trial.extrapolation,
        "budget": budget,
        "fidelity": None if fidelity is None else str(fidelity),
        "spent": result.spent,
        "prompt_evaluations": round(sum(t.fidelity for t in result.scored) * len(evaluate.tasks)),
        "full_fidelity": len(result.complete),
        "parallel": parallel,
        "best_baseline": None
        if baseline is None
        else {"method": baseline.method, **baseline.options, "selection": baseline.score},
        "best_ram": None
        if result.best_ram is None
        else {**result.best_ram.candidate, "selection": result.best_ram.score},
        "seconds": {
            "wall": wall,
            "merge": result.merge_seconds,
            "evaluate": result.evaluate_seconds,
            "overhead": wall - result.evaluate_seconds,
            "overhead_reported": result.overhead_seconds,
        },
        "overhead_share": (wall - result.evaluate_seconds) / wall if wall > 0 else 0.0,
        "result": result,
    }


def search_rows(
    agents: Mapping[str, Any],
    base: nn.Module,
    sel: Data,
    test: Data,
    *,
    budget: int,
    seed: int,
    families: bool,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """``search`` (the default space) and, with ``families``, each baseline family alone, same budget."""
    rows = {"search": search_row(agents, base, sel, test, budget=budget, seed=seed)}
    log(f"search: {line(rows['search'])}")
    if families:
        for name, space in FAMILY_SPACES.items():
            rows[f"search {name}"] = search_row(agents, base, sel, test, budget=budget, seed=seed, space=space)
            log(f"search {name}: {line(rows[f'search {name}'])}")
    return rows


def line(row: Mapping[str, Any]) -> str:
    return (
        f"selection {row['selection']:.3f}, test {row['test']['mean']:.3f}, {row['evaluations']} evaluations, "
        f"overhead {row['overhead_share']:.1%} of {row['seconds']['wall']:.1f} s; best {row['best']}"
    )


def overtrained(agents: Mapping[str, Any], base: nn.Module, name: str, factor: float) -> dict[str, dict[str, Tensor]]:
    """The agents as state dicts, with ``name`` replaced by base + factor·τ (computed in float32, stored in the
    agents' dtype)."""
    b = base.state_dict()
    out = {}
    for agent, snap in agents.items():
        sd = dict(snap) if isinstance(snap, Mapping) else dict(snap.to_state_dict())
        if agent == name:
            sd = {
                k: (b[k].float() + factor * (v.float() - b[k].float())).to(v.dtype) if v.is_floating_point() else v
                for k, v in sd.items()
            }
        out[agent] = sd
    return out


def extrapolated(
    agents: Mapping[str, Any], base: nn.Module, test: Data, scales: tuple[float, ...] = EXTRAPOLATION_SCALES
) -> dict[str, dict[str, dict[str, float]]]:
    """Each agent alone, extrapolated: base + s·τ_agent scored on the test prompts (s = 1 is the specialist)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for agent, snap in agents.items():
        out[agent] = {}
        for s in scales:
            sd = overtrained({agent: snap}, base, agent, s)[agent]
            model = merge({agent: sd}, base=base, method="task_arithmetic", scale=1.0)
            out[agent][f"{s:g}"] = scored(model, test)
    return out


def overtrained_study(
    agents: Mapping[str, Any],
    base: nn.Module,
    sel: Data,
    test: Data,
    normal: Mapping[str, Any],
    *,
    name: str,
    factor: float,
    budget: int,
    seed: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One agent over-trained (τ × factor): the fixed defaults, the settings selected on the normal agents applied
    unchanged (frozen), and every search re-run on the over-trained agents (re-selected)."""
    ot = overtrained(agents, base, name, factor)
    fixed = {k: ({**v, "scale": 1 / len(agents)} if k == "TA (1/N)" else v) for k, v in DEFAULTS.items()}
    defaults = {
        label: {"options": opts, "test": scored(merge(ot, base=base, **opts), test)} for label, opts in fixed.items()
    }
    frozen = {
        label: {"options": row["best"], "test": scored(merge(ot, base=base, **row["best"]), test)}
        for label, row in normal.items()
    }
    reselected = search_rows(ot, base, sel, test, budget=budget, seed=seed, families=len(normal) > 1, log=log)
    for label, row in reselected.items():
        log(f"over-trained {name} × {factor:g}, re-selected {label}: {line(row)}")
    return {"agent": name, "factor": factor, "defaults": defaults, "frozen": frozen, "reselected": reselected}


def summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """A search row without the SearchResult object, its table and full history as JSON."""
    from ram_live.selection import to_json

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
        print(
            f"{label:<24}"
            + "".join(f"{acc[t]:>8.3f}" for t in tasks)
            + f"{acc['mean']:>8.3f}"
            + (f"{sel:>8.3f}" if sel is not None else f"{'-':>8}")
        )
