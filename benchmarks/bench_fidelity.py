"""Multi-fidelity selection on the RL demo's agents: ``search`` with a budget of twenty full evaluations'
worth of prompts (``"20x"``) with and without the race (``fidelity="halving"``), today's search at 20 and 60
candidates, and each baseline family searched alone at 20, on the same selection split; every winner scored on the
test prompts (never used for choosing).

    python benchmarks/bench_fidelity.py [--regimes dense sparse] [--agents 3 8] [--seeds 0 1 2] [--full]
                                        [--n-sel N] [--out runs/bench_fidelity] [--table-only]
                                        [--parallel-on dense:8:0]

The agents are the demo's own (``examples/rl_merge_demo.py --train-only --reuse-trained``, ``--quick`` settings
unless ``--full``), trained once into ``<out>/train/<regime><N>[q]_s<seed>`` and reused after; the test and
selection prompts are made as the demo makes them. One JSON per run, ``<out>/<regime><N>[q]_s<seed>.json`` (every
row, with the search's history), then a markdown table over seeds (mean ± sample std): the winner's test mean
accuracy, its selection score, the gap, prompt-evaluations spent (in full evaluations' worth), candidates scored,
wall seconds; and how many prompt-evaluations the raced search took to reach the 60-candidate search's selection
score (its best full-fidelity trial, cumulative prompts; "not reached" within its budget). Where ``search`` takes
``parallel=``, one setting (``--parallel-on``) also runs the two ``"20x"`` searches with ``parallel=1`` and ``2``
back to back: wall seconds, and whether the trials are the same.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host import cpu_label  # noqa: E402
from rl_demo import regimes, reuse  # noqa: E402
from rl_demo.lang import make_prompts, tasks_for  # noqa: E402
from rl_demo.selection import FAMILY_SPACES, selection_split, search_row, summary  # noqa: E402

# label -> search_row's keyword arguments (budget, fidelity, space); every searched method on the same split
ROWS: dict[str, dict[str, Any]] = {
    "20x full": {"budget": "20x"},
    "20x halving": {"budget": "20x", "fidelity": "halving"},
    "20 (today)": {"budget": 20},
    "60 (today)": {"budget": 60},
    **{f"{name} alone 20": {"budget": 20, "space": space} for name, space in FAMILY_SPACES.items()},
}
REFERENCE = "60 (today)"  # the selection score the raced search is asked to reach
RACED = "20x halving"
# Scores equal as fractions of prompts (the same number right, split otherwise over tasks) differ by ~1e-8 after the
# per-task float32 means; reaching a score allows that much (one prompt is ≥ 1/(8·300) of the mean here).
TOLERANCE = 1e-6


def run_name(regime: str, n: int, seed: int, quick: bool) -> str:
    return f"{regime}{n}{'q' if quick else ''}_s{seed}"


def trained(regime: str, n: int, seed: int, quick: bool, threads: int, folder: Path) -> tuple[Any, Any]:
    """The demo's base and agents (its store's latest snapshots) for this run, trained by the demo if not kept."""
    tasks = tasks_for(n)
    s, target = regimes.settings(regime, tasks, quick)
    args = argparse.Namespace(seed=seed, threads=threads)
    got = reuse.load(folder, args, s, tasks, target)
    if got is None:
        cmd = [
            sys.executable,
            str(ROOT / "examples" / "rl_merge_demo.py"),
            "--regime",
            regime,
            "--agents",
            str(n),
            "--seed",
            str(seed),
            "--threads",
            str(threads),
            "--train-only",
            "--reuse-trained",
            "--out",
            str(folder),
        ]
        if quick:
            cmd.append("--quick")
        print("training:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        got = reuse.load(folder, args, s, tasks, target)
        assert got is not None, f"{folder}: the demo did not leave a finished training"
    base, store = got[0], got[1]
    return base, store.latest_all(tasks)


def splits(regime: str, n: int, seed: int, quick: bool, n_sel: int | None) -> tuple[dict, dict, int]:
    """The demo's test prompts and selection split (same generators and seeds as ``rl_merge_demo.py``)."""
    tasks = tasks_for(n)
    s, _ = regimes.settings(regime, tasks, quick)
    g_test = torch.Generator().manual_seed(10_000 + seed)
    test = {t: make_prompts(t, g_test, s.n_eval) for t in tasks}
    per_task = s.n_sel if n_sel is None else n_sel
    return test, selection_split(test, per_task, seed), per_task


def trace(result: Any, n_prompts: int) -> list[dict[str, Any]]:
    """Per trial: cumulative prompts scored so far, its share seen, score, and the best full-fidelity score so far."""
    out, prompts, best = [], 0, None
    for t in result.history:
        if t.score is not None:
            prompts += round(t.fidelity * n_prompts)
            if t.fidelity >= 1.0:
                best = t.score if best is None else max(best, t.score)
        out.append(
            {
                "index": t.index,
                "family": t.family,
                "fidelity": t.fidelity,
                "score": t.score,
                "stop": t.stop,
                "prompts": prompts,
                "best_full": best,
            }
        )
    return out


def reach(steps: list[dict[str, Any]], target: float) -> int | None:
    """The cumulative prompts at which the best full-fidelity trial first scores ≥ ``target`` (None: never)."""
    for step in steps:
        if step["best_full"] is not None and step["best_full"] >= target - TOLERANCE:
            return step["prompts"]
    return None


def library() -> dict[str, Any]:
    """Where ram_live is imported from, its commit (git, or a ``COMMIT`` file beside it in an exported copy:
    ``git archive HEAD | tar -x -C DIR``, which keeps a long run away from edits made meanwhile) and whether
    ram_live/ differs from that commit."""
    import ram_live

    where = Path(ram_live.__file__).resolve().parents[1]

    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=where, capture_output=True, text=True, check=False).stdout.strip()

    stamp = where / "COMMIT"
    commit = stamp.read_text().strip() if stamp.exists() else git("rev-parse", "HEAD")
    changed = [] if stamp.exists() else git("status", "--short", "ram_live").splitlines()
    return {"path": str(where), "commit": commit, "ram_live_changed": changed}


def parallel_run(regime: str, n: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The two ``"20x"`` searches with ``parallel=1`` then ``2``, back to back, on one setting. The agents go in
    as state dicts: store snapshots hold open file handles that do not pickle for the workers (so the search has
    no stored-importance family here, unlike the main rows)."""
    name = run_name(regime, n, seed, args.quick)
    base, snaps = trained(regime, n, seed, args.quick, args.threads, args.out / "train" / name)
    agents = {t: dict(snap.to_state_dict()) for t, snap in snaps.items()}
    test, sel, per_task = splits(regime, n, seed, args.quick, args.n_sel)
    rows: dict[str, Any] = {}
    for label in ("20x full", "20x halving"):
        for workers in (1, 2):
            load0 = os.getloadavg()[0]
            row = search_row(agents, base, sel, test, seed=seed, parallel=workers, **ROWS[label])
            rows[f"{label} parallel={workers}"] = {
                "wall": row["seconds"]["wall"],
                "selection": row["selection"],
                "test": row["test"]["mean"],
                "scores": [t.score for t in row["result"].history],
                "load_before": load0,
                "load_after": os.getloadavg()[0],
            }
            print(
                f"{name} {label} parallel={workers}: {row['seconds']['wall']:.1f} s, selection {row['selection']:.3f}",
                flush=True,
            )
        one, two = rows[f"{label} parallel=1"], rows[f"{label} parallel=2"]
        two["same_trials_as_parallel_1"] = one["scores"] == two["scores"]
    return {
        "run": name,
        "regime": regime,
        "agents": n,
        "seed": seed,
        "selection_per_task": per_task,
        "inputs": "state dicts (no stored importances)",
        "threads": args.threads,
        "cpu": cpu_label(),
        "cpus": os.cpu_count(),
        "library": library(),
        "rows": rows,
    }


def parallel_table(res: dict[str, Any]) -> str:
    lines = [
        f"| {res['regime']} N={res['agents']} seed {res['seed']} | wall s, parallel=1 | wall s, parallel=2 | "
        "2 / 1 | same trials |",
        "|---|---|---|---|---|",
    ]
    for label in ("20x full", "20x halving"):
        one, two = res["rows"][f"{label} parallel=1"], res["rows"][f"{label} parallel=2"]
        lines.append(
            f"| {label} | {one['wall']:.1f} | {two['wall']:.1f} | {two['wall'] / one['wall']:.2f} | "
            f"{'yes' if two['same_trials_as_parallel_1'] else 'no'} |"
        )
    return "\n".join(lines)


def one_run(regime: str, n: int, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    name = run_name(regime, n, seed, args.quick)
    base, agents = trained(regime, n, seed, args.quick, args.threads, args.out / "train" / name)
    test, sel, per_task = splits(regime, n, seed, args.quick, args.n_sel)
    n_prompts = per_task * n
    rows: dict[str, Any] = {}
    for label, kwargs in ROWS.items():
        load0 = os.getloadavg()[0]
        row = search_row(agents, base, sel, test, seed=seed, **kwargs)
        steps = trace(row["result"], n_prompts)
        out = summary(row)
        out.update(
            {
                "label": label,
                "trace": steps,
                "load_before": load0,
                "load_after": os.getloadavg()[0],
                "gap": row["selection"] - row["test"]["mean"],
                "evaluations_worth": row["prompt_evaluations"] / n_prompts,
            }
        )
        rows[label] = out
        print(
            f"{name} {label:<20} test {row['test']['mean']:.3f} selection {row['selection']:.3f} "
            f"spent {out['evaluations_worth']:.2f}x {row['evaluations']} candidates "
            f"({row['full_fidelity']} full) {row['seconds']['wall']:.1f} s",
            flush=True,
        )
    target = rows[REFERENCE]["selection"]
    for row in rows.values():
        row["reach_reference_prompts"] = reach(row["trace"], target)
    same = [t["score"] for t in rows["20x full"]["trace"]] == [t["score"] for t in rows["20 (today)"]["trace"]]
    return {
        "run": name,
        "regime": regime,
        "agents": n,
        "seed": seed,
        "quick": args.quick,
        "selection_per_task": per_task,
        "prompts": n_prompts,
        "test_per_task": len(next(iter(test.values()))[0]),
        "threads": args.threads,
        "cpu": cpu_label(),
        "library": library(),
        "reference": REFERENCE,
        "reference_selection": target,
        "20x_full_equals_20": same,
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------------- tables


def stops(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Every candidate the race stopped, merged again and scored on every selection prompt (after the run, so
    that the run's times are untouched): its full score against its side's best at the time it was stopped (a
    *wrong stop*: it was not worse), and against the raced search's winner."""
    from ram_live import merge
    from ram_live.selection import from_json
    from ram_live.selection.fidelity import Halving
    from rl_demo.selection import PromptAccuracy

    regime, n, seed = run["regime"], run["agents"], run["seed"]
    name = run_name(regime, n, seed, run["quick"])
    base, agents = trained(regime, n, seed, run["quick"], run["threads"], args.out / "train" / name)
    _, sel, _ = splits(regime, n, seed, run["quick"], run["selection_per_task"])
    evaluate = PromptAccuracy(sel)
    history = run["rows"][RACED]["history"]["history"]
    winner = run["rows"][RACED]["selection"]
    out = []
    for t in history:
        if t["stop"] is None or t["score"] is None:
            continue
        options = from_json(t["options"])  # importance="stored", where chosen, re-makes the same merge
        full = evaluate(merge(agents, base=base, method=t["method"], **options))
        ref = max(
            h["score"]
            for h in history[: t["index"]]
            if h["side"] == t["side"] and h["fidelity"] >= 1.0 and h["score"] is not None
        )
        out.append(
            {
                "index": t["index"],
                "family": t["family"],
                "fidelity": t["fidelity"],
                "estimate": t["score"],
                "full": full,
                "reference": ref,
                "wrong_stop": full >= ref - TOLERANCE,
                "beats_winner": full > winner + TOLERANCE,
            }
        )
    first = max(1, math.ceil(Halving().fractions[0] * run["selection_per_task"] - 1e-9)) / run["selection_per_task"]
    return {
        "run": name,
        "regime": regime,
        "agents": n,
        "seed": seed,
        "winner": winner,
        "first_slice": first,
        "stopped": out,
    }


def stops_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | seed | stopped | at the 1st slice | at the 2nd | wrong stops (full ≥ its reference) | "
        "would have beaten the winner | full − estimate, mean (points) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["regime"], r["agents"], r["seed"])):
        st = r["stopped"]
        first = r["first_slice"]
        gaps = [100 * (x["full"] - x["estimate"]) for x in st]
        early = sum(x["fidelity"] <= first + 1e-9 for x in st)
        lines.append(
            f"| {r['regime']} N={r['agents']} | {r['seed']} | {len(st)} | {early} | {len(st) - early} | "
            f"{sum(x['wrong_stop'] for x in st)} | {sum(x['beats_winner'] for x in st)} | "
            f"{statistics.mean(gaps) if gaps else 0:+.1f} |"
        )
    return "\n".join(lines)


def ms(xs: list[float], k: float = 100.0, digits: int = 1) -> str:
    if not xs:
        return "–"
    if len(xs) == 1:
        return f"{k * xs[0]:.{digits}f}"
    return f"{k * statistics.mean(xs):.{digits}f} ± {k * statistics.stdev(xs):.{digits}f}"


def table(runs: list[dict[str, Any]]) -> str:
    """Mean ± std over seeds per setting and row, then the raced search's reach of the 60-candidate score."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["regime"], r["agents"]), []).append(r)
    lines = [
        "| setting | search | test mean % | selection % | gap (sel − test) | spent (× full eval) | "
        "candidates (full) | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (regime, n), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        for label in ROWS:
            got = [r["rows"][label] for r in rs if label in r["rows"]]
            if not got:
                continue
            cands = ms([g["evaluations"] for g in got], 1, 1)
            full = ms([g["full_fidelity"] for g in got], 1, 1)
            lines.append(
                f"| {regime} N={n} ({len(got)} seeds) | {label} | {ms([g['test']['mean'] for g in got])} | "
                f"{ms([g['selection'] for g in got])} | {ms([g['gap'] for g in got])} | "
                f"{ms([g['evaluations_worth'] for g in got], 1, 2)} | {cands} ({full}) | "
                f"{ms([g['seconds']['wall'] for g in got], 1, 1)} |"
            )
    lines += [
        "",
        "| setting | seed | 60 (today): selection %, its best found at (× full eval) | 20x halving: "
        "selection % | halving reaches the 60's score at (× full eval) | 60 / that | the 60's own / that | "
        "20x full reaches it at |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (regime, n), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        for r in sorted(rs, key=lambda r: r["seed"]):
            ref, raced = r["rows"][REFERENCE], r["rows"][RACED]
            for row in r["rows"].values():  # (again: JSONs written before TOLERANCE)
                row["reach_reference_prompts"] = reach(row["trace"], ref["selection"])
            own = ref["reach_reference_prompts"] / r["prompts"]
            got = raced["reach_reference_prompts"]
            at = "not reached" if got is None else f"{got / r['prompts']:.2f}"
            fewer = "–" if got is None else f"{60 * r['prompts'] / got:.1f}"
            fair = "–" if got is None else f"{ref['reach_reference_prompts'] / got:.1f}"
            plain = r["rows"]["20x full"]["reach_reference_prompts"]
            plain_at = "not reached" if plain is None else f"{plain / r['prompts']:.0f}"
            lines.append(
                f"| {regime} N={n} | {r['seed']} | {100 * ref['selection']:.1f}, {own:.0f} | "
                f"{100 * raced['selection']:.1f} | {at} | {fewer} | {fair} | {plain_at} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regimes", nargs="+", default=["dense", "sparse"], choices=["dense", "sparse"])
    parser.add_argument("--agents", nargs="+", type=int, default=[3, 8])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--full",
        dest="quick",
        action="store_false",
        help="the demo's default settings (default: --quick: 300 test, 100 selection prompts/task)",
    )
    parser.add_argument("--n-sel", type=int, default=None, help="selection prompts per task (default: the demo's)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (training and evaluation)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_fidelity")
    parser.add_argument("--redo", action="store_true", help="run again where a run's JSON is there")
    parser.add_argument("--table-only", action="store_true", help="only the table of the JSONs in --out")
    parser.add_argument(
        "--stops",
        action="store_true",
        help="after the runs: every candidate the race stopped, scored on every selection prompt",
    )
    parser.add_argument(
        "--parallel-on",
        default="dense:8:0",
        metavar="REGIME:N:SEED",
        help="the setting of the parallel=1 / 2 wall times ('none': skip them)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from ram_live import search

    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for regime in args.regimes:
        for n in args.agents:
            for seed in args.seeds:
                path = args.out / f"{run_name(regime, n, seed, args.quick)}.json"
                if path.exists() and not args.redo or args.table_only:
                    if path.exists():
                        runs.append(json.loads(path.read_text()))
                    continue
                t0 = time.perf_counter()
                res = one_run(regime, n, seed, args)
                res["wall_seconds"] = time.perf_counter() - t0
                path.write_text(json.dumps(res, indent=1, default=str) + "\n")
                print(f"wrote {path} ({res['wall_seconds']:.0f} s)", flush=True)
                runs.append(res)
    parallel = "parallel" in inspect.signature(search).parameters
    par = None
    if parallel and args.parallel_on != "none":
        regime, n, seed = args.parallel_on.split(":")
        path = args.out / f"parallel_{run_name(regime, int(n), int(seed), args.quick)}.json"
        if path.exists() and not args.redo or args.table_only:
            par = json.loads(path.read_text()) if path.exists() else None
        else:
            par = parallel_run(regime, int(n), int(seed), args)
            path.write_text(json.dumps(par, indent=1, default=str) + "\n")
    print(f"\n{cpu_label()}, {args.threads} torch thread(s); search accepts parallel=: {parallel}")
    if runs:
        print(table(runs))
    if par is not None:
        print()
        print(parallel_table(par))
    if args.stops and runs:
        checked = []
        for run in runs:
            path = args.out / f"stops_{run['run']}.json"
            if path.exists() and not args.redo:
                checked.append(json.loads(path.read_text()))
            elif not args.table_only:
                checked.append(stops(run, args))
                path.write_text(json.dumps(checked[-1], indent=1) + "\n")
        print()
        print(stops_table(checked))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
