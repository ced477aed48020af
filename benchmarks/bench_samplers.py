"""Samplers inside ``search``: today's moves, the race, the built-in TPE alone and in the race (and, with
``--optuna``, Optuna's TPESampler), on agents fine-tuned from one base at different strengths, 3, 5 and 8 agents,
budgets 10, 20 and 60 (full evaluations' worth of prompts), 3 seeds; every winner scored on a TEST split never
used for choosing.

    nice -n 5 python benchmarks/bench_samplers.py [--agents 3 5 8] [--budgets 10 20 60] [--seeds 0 1 2]
                                                 [--optuna] [--out runs/bench_samplers.json]
    nice -n 5 python benchmarks/bench_samplers.py --rl-demo 3 8 --seeds 0     # the RL demo's agents instead

The problem is small on purpose (a 2-core machine shared with other jobs): a two-layer MLP (``--dim`` inputs,
``--hidden`` units, ``--classes`` outputs) over state dicts; each task a random teacher on its own region of the
inputs; the base trained briefly on every task, each agent from the base on its own task with its own number of
steps (some agents under-trained, as RL runs stopped early: their task vectors want weights above 1, others
over-trained). An evaluation scores prompts one by one (``search``'s prompt protocol): a prompt is 1 when the
merged model classifies it right; the objective is the mean over tasks of each task's accuracy on the selection
split. The same agents, base and splits for every row of a (agents, seed) pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ram_live  # noqa: E402

SHARED = 4  # input dimensions every task reads (where the agents' updates conflict)
ROWS: dict[str, dict[str, Any]] = {
    "moves (today)": {"sampler": "moves"},
    "race (today)": {"sampler": "moves", "fidelity": "halving"},
    "tpe": {"sampler": "tpe"},
    "tpe + race": {"sampler": "tpe", "fidelity": "halving"},
}


def _forward(sd: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ sd["l1.weight"].T + sd["l1.bias"]) @ sd["l2.weight"].T + sd["l2.bias"]


class Problem:
    """Base, agents and splits for ``n`` tasks (seeded)."""

    def __init__(self, n: int, seed: int, dim: int, hidden: int, classes: int, n_sel: int, n_test: int) -> None:
        g = torch.Generator().manual_seed(1000 * n + seed)
        self.tasks = [f"t{i}" for i in range(n)]
        self.teachers = [torch.randn(dim, classes, generator=g) for _ in range(n)]
        self.masks = []
        block = (dim - SHARED) // n
        for i in range(n):  # each task reads a block of the inputs of its own and a few every task reads
            m = torch.zeros(dim)
            m[i * block : (i + 1) * block] = 1.0
            m[dim - SHARED :] = 1.0
            self.masks.append(m)
        self.g = g
        self.dim, self.classes = dim, classes
        base = {
            "l1.weight": torch.randn(hidden, dim, generator=g) / dim**0.5,
            "l1.bias": torch.zeros(hidden),
            "l2.weight": torch.randn(classes, hidden, generator=g) / hidden**0.5,
            "l2.bias": torch.zeros(classes),
        }
        mix = [self.data(t, 200) for t in range(n)]
        self.base = self.train(base, torch.cat([x for x, _ in mix]), torch.cat([y for _, y in mix]), 30, 0.05)
        # the agents' strengths: under-trained (few steps) to over-trained, cycled over the agents
        steps = [15, 60, 240, 30, 120]
        self.agents = {}
        for t in range(n):
            x, y = self.data(t, 400)
            self.agents[self.tasks[t]] = self.train(self.base, x, y, steps[t % len(steps)], 0.1)
        self.sel = [self.data(t, n_sel) for t in range(n)]
        self.test = [self.data(t, n_test) for t in range(n)]

    def data(self, t: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(k, self.dim, generator=self.g) * self.masks[t]
        x = x + 0.5 * self.masks[t]  # where the task lives
        return x, (x @ self.teachers[t]).argmax(1)

    @staticmethod
    def train(sd: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, steps: int, lr: float) -> dict:
        p = {k: v.clone().requires_grad_(True) for k, v in sd.items()}
        opt = torch.optim.SGD(p.values(), lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(_forward(p, x), y).backward()
            opt.step()
        return {k: v.detach() for k, v in p.items()}


class Accuracy:
    """Mean over tasks of each task's accuracy, prompt by prompt (the prompt protocol of ``search``)."""

    def __init__(self, splits: list[tuple[torch.Tensor, torch.Tensor]], tasks: list[str]) -> None:
        self.x = torch.cat([x for x, _ in splits])
        self.y = torch.cat([y for _, y in splits])
        self.tasks = [t for t, (x, _) in zip(tasks, splits) for _ in range(len(x))]

    def prompt_tasks(self) -> list[str]:
        return list(self.tasks)

    def prompt_scores(self, merged: dict[str, torch.Tensor], indices: Any) -> list[float]:
        idx = torch.tensor([int(i) for i in indices], dtype=torch.long)
        with torch.no_grad():
            hit = _forward(merged, self.x[idx]).argmax(1) == self.y[idx]
        return hit.double().tolist()

    def aggregate(self, values: dict[int, float | None]) -> tuple[float, dict[str, float]]:
        groups: dict[str, list[float]] = {}
        for i, v in values.items():
            if v is not None:
                groups.setdefault(self.tasks[i], []).append(v)
        per = {t: sum(v) / len(v) for t, v in groups.items()}
        return sum(per.values()) / len(per), per

    def __call__(self, merged: dict[str, torch.Tensor]) -> float:
        return self.aggregate(dict(enumerate(self.prompt_scores(merged, range(len(self.tasks))))))[0]


def one(problem: Problem, row: dict[str, Any], budget: int, seed: int) -> dict[str, Any]:
    sel = Accuracy(problem.sel, problem.tasks)
    test = Accuracy(problem.test, problem.tasks)
    kwargs = dict(row)
    sampler = kwargs.pop("sampler")
    if sampler == "optuna-tpe":
        import optuna

        sampler = optuna.samplers.TPESampler(seed=seed)
    t0 = time.perf_counter()
    result = ram_live.search(
        problem.agents,
        base=problem.base,
        evaluate=sel,
        budget=f"{budget}x",
        seed=seed,
        progress=False,
        sampler=sampler,
        **kwargs,
    )
    wall = time.perf_counter() - t0
    best = ram_live.merge(problem.agents, base=problem.base, **result.best)
    return {
        "test": test(best),
        "selection": result.best_score,
        "method": result.best["method"],
        "candidates": len(result.history),
        "spent": result.spent,
        "wall": wall,
    }


def rl_demo(agent_counts: list[int], seeds: list[int], folder: Path) -> list[dict[str, Any]]:
    """The RL demo's dense agents (``--quick``, trained by ``bench_fidelity.py``'s code into ``folder`` where
    missing): the race at 20x with the moves and with the TPE (the default), and today's 60 candidates; each
    winner's mean accuracy on the demo's test prompts (``rl_demo.selection``)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import bench_fidelity as bf
    from rl_demo.selection import PromptAccuracy, scored

    rows = {
        "20x race, moves": {"budget": "20x", "fidelity": "halving", "sampler": "moves"},
        "20x race, tpe (default)": {"budget": "20x", "fidelity": "halving"},
        "60, moves (today)": {"budget": 60},
    }
    out = []
    for n in agent_counts:
        for seed in seeds:
            name = bf.run_name("dense", n, seed, True)
            base, agents = bf.trained("dense", n, seed, True, 1, folder / name)
            test, sel, _ = bf.splits("dense", n, seed, True, None)
            for label, kwargs in rows.items():
                evaluate = PromptAccuracy(sel)
                r = ram_live.search(agents, base=base, evaluate=evaluate, seed=seed, progress=False, **kwargs)
                won = scored(ram_live.merge(agents, base=base, **r.best), test)["mean"]
                out.append({"agents": n, "seed": seed, "row": label, "selection": r.best_score, "test": won})
                print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", nargs="+", type=int, default=[3, 5, 8])
    parser.add_argument("--budgets", nargs="+", type=int, default=[10, 20, 60])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", default=list(ROWS))
    parser.add_argument("--optuna", action="store_true", help="also Optuna's TPESampler(seed) in the race")
    parser.add_argument("--dim", type=int, default=68)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--n-sel", type=int, default=60, help="selection prompts per task")
    parser.add_argument("--n-test", type=int, default=1000, help="test prompts per task")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_samplers.json")
    parser.add_argument(
        "--rl-demo",
        nargs="*",
        type=int,
        default=None,
        metavar="N",
        help="instead: the RL demo's dense agents (N agents each; trained into runs/bench_samplers_rl if missing)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.rl_demo is not None:
        runs = rl_demo(args.rl_demo or [3, 8], args.seeds, ROOT / "runs" / "bench_samplers_rl")
        rows = list(dict.fromkeys(r["row"] for r in runs))
        print(table(runs, rows, [0], args.rl_demo or [3, 8], key="row"))
        return
    rows = {k: ROWS[k] for k in args.rows}
    if args.optuna:
        rows["optuna TPE + race"] = {"sampler": "optuna-tpe", "fidelity": "halving"}
    runs: list[dict[str, Any]] = []
    for n in args.agents:
        for seed in args.seeds:
            problem = Problem(n, seed, args.dim, args.hidden, args.classes, args.n_sel, args.n_test)
            for budget in args.budgets:
                for label, row in rows.items():
                    res = one(problem, row, budget, seed)
                    runs.append({"agents": n, "seed": seed, "budget": budget, "row": label, **res})
                    print(json.dumps(runs[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=1) + "\n")
    print(table(runs, list(rows), args.budgets, args.agents))
    print(paired(runs, args.agents))


def paired(runs: list[dict[str, Any]], agents: list[int], row: str = "tpe + race", budget: int = 20) -> str:
    """The issue's test, seed by seed: ``row`` at ``budget``x (the default raced search) minus today's moves at 60
    full evaluations, test points, mean ± standard error over the seeds (and in how many seeds it is ahead); ``""``
    where the runs hold neither."""
    lines = []
    for n in agents:
        mine = {x["seed"]: x["test"] for x in runs if (x["agents"], x["budget"], x["row"]) == (n, budget, row)}
        today = {x["seed"]: x["test"] for x in runs if (x["agents"], x["budget"], x["row"]) == (n, 60, "moves (today)")}
        diffs = [100 * (mine[s] - today[s]) for s in sorted(set(mine) & set(today))]
        if not diffs:
            continue
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
        ahead = sum(d > 0 for d in diffs)
        lines.append(
            f"{n} agents: {row} at {budget}x minus moves (today) at 60x: {statistics.mean(diffs):+.2f} ± {se:.2f} "
            f"test points (mean ± se over {len(diffs)} seeds; ahead in {ahead})"
        )
    return "\n".join(lines)


def table(runs: list[dict[str, Any]], rows: list[str], budgets: list[int], agents: list[int], key: str = "") -> str:
    """Test accuracy (%) of each row's winner, mean ± sample std over seeds (``key="row"``: rows carry their
    budget)."""
    head = "| agents | budget | " + " | ".join(rows) + " |"
    lines = [head, "|" + "---|" * (len(rows) + 2)]
    for n in agents:
        for b in budgets:
            cells = []
            for r in rows:
                xs = [100 * x["test"] for x in runs if x["agents"] == n and (key or x["budget"] == b) and x["row"] == r]
                if not xs:
                    cells.append("–")
                    continue
                sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
                cells.append(f"{statistics.mean(xs):.1f} ± {sd:.1f}")
            shown = "per row" if key else f"{b}x"
            lines.append(f"| {n} | {shown} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
