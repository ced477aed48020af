"""Tables over seeds: mean ± sample std of every accuracy row, the probe (density, unique share,
overlap histogram) and the search rows, from several ``results.json``.

Run: ``python -m rl_demo.aggregate runs/sparse3_s0 runs/sparse3_s1 runs/sparse3_s2`` (from ``examples/``).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def ms(xs: list[float], pct: bool = True) -> str:
    """``mean ± sample std`` (in % by default); one value: the value alone."""
    k = 100.0 if pct else 1.0
    if len(xs) == 1:
        return f"{k * xs[0]:.1f}"
    return f"{k * statistics.mean(xs):.1f} ± {k * statistics.stdev(xs):.1f}"


def load(dirs: list[str]) -> list[dict[str, Any]]:
    return [json.loads((Path(d) / "results.json").read_text()) for d in dirs]


def accuracy_table(runs: list[dict[str, Any]]) -> str:
    tasks = runs[0]["tasks"]
    head = "| method | " + " | ".join(tasks) + " | mean | mean per seed |"
    lines = [head, "|" + "---|" * (len(tasks) + 3)]
    for name in runs[0]["accuracy"]:
        if not all(name in r["accuracy"] for r in runs):
            continue
        cells = [ms([r["accuracy"][name][t] for r in runs]) for t in [*tasks, "mean"]]
        per = " / ".join(f"{100 * r['accuracy'][name]['mean']:.1f}" for r in runs)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {per} |")
    return "\n".join(lines)


def probe_table(runs: list[dict[str, Any]]) -> str:
    tasks = runs[0]["tasks"]
    lines = ["| agent | recipe | changed (bf16) | unique share | gain on own task (points) |", "|---|---|---|---|---|"]
    for t in tasks:
        r0 = runs[0]["settings"]["recipes"][t]
        recipe = f"{r0['optimizer']} {r0['lr']:g} × {r0['steps']}"
        gain = [r["accuracy"][f"specialist {t}"][t] - r["accuracy"]["base"][t] for r in runs]
        lines.append(
            f"| {t} | {recipe} | {ms([r['density'][t] for r in runs])} | "
            f"{ms([r['unique_share'][t] for r in runs])} | {ms(gain)} |"
        )
    hists = [[h / sum(r["probe"]["histogram"]) for h in r["probe"]["histogram"]] for r in runs]
    lines.append("")
    lines.append(
        "overlap count c = 0…N (share of all entries): "
        + " / ".join(ms([h[c] for h in hists]) for c in range(len(hists[0])))
    )
    return "\n".join(lines)


def search_table(runs: list[dict[str, Any]]) -> str:
    if not runs[0].get("search"):
        return ""
    lines = ["| search row | test mean | selection | evaluations | chosen method (per seed) |", "|---|---|---|---|---|"]
    for label in runs[0]["search"]:
        rows = [r["search"][label] for r in runs if label in r.get("search", {})]
        lines.append(
            f"| {label} | {ms([x['test']['mean'] for x in rows])} | {ms([x['selection'] for x in rows])} | "
            + " / ".join(str(x["evaluations"]) for x in rows)
            + " | "
            + " / ".join(str(x["best"].get("method")) for x in rows)
            + " |"
        )
    for split, get in (("test mean", lambda x: x["test"]["mean"]), ("selection", lambda x: x["selection"])):
        gaps = []
        for r in runs:
            fam = [get(v) for k, v in r["search"].items() if k != "search"]
            if fam:
                gaps.append(get(r["search"]["search"]) - max(fam))
        if gaps:
            lines.append("")
            lines.append(
                f"search − best family searched alone ({split}, points, per seed): "
                + " / ".join(f"{100 * g:+.1f}" for g in gaps)
            )
    return "\n".join(lines)


#: The paired differences of the mean accuracy that the readings quote (rows present in every run only).
PAIRS = (
    ("RAM", "TA (1/N)"),
    ("RAM", "TIES"),
    ("RAM", "DARE+TIES"),
    ("RAM", "TA (tuned)"),
    ("RAM+", "RAM"),
    ("RAM (sign)", "RAM"),
    ("RAM+ (sign)", "RAM+"),
    ("RAM (sign)", "TIES"),
    ("RAM (sign)", "TA (tuned)"),
)


def paired_table(groups: list[list[dict[str, Any]]]) -> str:
    """Per N (one group of seeds each): each pair's difference of the mean accuracy, per seed, in points."""
    pairs = [(a, b) for a, b in PAIRS if all(a in r["accuracy"] and b in r["accuracy"] for g in groups for r in g)]
    lines = ["| N | " + " | ".join(f"{a} − {b}" for a, b in pairs) + " |", "|---|" + "---|" * len(pairs)]
    for g in groups:
        cells = [
            " / ".join(f"{100 * (r['accuracy'][a]['mean'] - r['accuracy'][b]['mean']):+.1f}" for r in g)
            for a, b in pairs
        ]
        lines.append(f"| {g[0]['agents']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def versus_n(groups: list[list[dict[str, Any]]]) -> str:
    """Every row's mean accuracy (mean ± std over seeds) against N; mean unique share and c-histogram per N."""
    ns = [g[0]["agents"] for g in groups]
    lines = ["| method | " + " | ".join(f"N = {n}" for n in ns) + " |", "|---|" + "---|" * len(ns)]
    names = [k for k in groups[-1][0]["accuracy"] if not k.startswith("specialist")]
    for name in ["specialists (mean over agents)", *names]:
        cells = []
        for g in groups:
            if name.startswith("specialists"):
                xs = [
                    statistics.mean(v["mean"] for k, v in r["accuracy"].items() if k.startswith("specialist"))
                    for r in g
                ]
            else:
                xs = [r["accuracy"][name]["mean"] for r in g if name in r["accuracy"]]
            cells.append(ms(xs) if xs else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for g in groups:
        hist = [[h / sum(r["probe"]["histogram"]) for h in r["probe"]["histogram"]] for r in g]
        uniq = {t: ms([r["unique_share"][t] for r in g]) for t in g[0]["tasks"]}
        dens = {t: ms([r["density"][t] for r in g]) for t in g[0]["tasks"]}
        lines.append(
            f"N = {g[0]['agents']}: changed "
            + ", ".join(f"{t} {v}" for t, v in dens.items())
            + "; unique share "
            + ", ".join(f"{t} {v}" for t, v in uniq.items())
            + "; c = 0…N: "
            + " / ".join(ms([h[c] for h in hist]) for c in range(len(hist[0])))
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    argv = argv if argv is not None else sys.argv[1:]
    if argv and argv[0] == "--vs-n":  # --vs-n "runs/a_s?" "runs/b_s?" ...: one glob per N
        import glob

        groups = [load(sorted(glob.glob(pattern))) for pattern in argv[1:]]
        text = versus_n(groups) + "\n\n" + paired_table(groups)
        print(text)
        return text
    runs = load(argv)
    head = (
        f"regime {runs[0].get('regime', 'dense')}, N = {runs[0].get('agents', 3)}, seeds "
        + ", ".join(str(r["seed"]) for r in runs)
        + (", --quick" if runs[0]["quick"] else "")
    )
    text = "\n\n".join(
        x for x in (head, probe_table(runs), accuracy_table(runs), paired_table([runs]), search_table(runs)) if x
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
