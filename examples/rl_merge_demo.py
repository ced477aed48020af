"""RL demo, end to end on CPU: a tiny base LM, three GRPO-trained specialists, the probe, every merge method scored.

1. Base: a tiny Llama (built from a config, nothing downloaded) trained briefly by supervised learning on a
   synthetic token language with three task formats whose answers are checkable: ``shift`` (every digit + 3 mod
   10), ``rev`` (reverse 5 digits), ``sort`` (sort 5 digits). It is partly competent, and stored in bf16.
2. Specialists: one per task, trained from the base by on-policy RL with a verifiable reward (GRPO-style: a group
   of sampled answers per prompt, group-normalised advantages, exact-match reward, no KL term), float32 master
   weights, snapshotted in bf16 into ram_live's :class:`~ram_live.store.SnapshotStore` (``<out>/store``) every few
   steps. Recipes differ per task (optimiser, learning rate, steps), so the task vectors come out with different
   densities: the probe measures them.
3. Probe: density, unique/shared shares, ρ and λ per agent (printed, ``probe.png``).
4. Merge (the agents are the store's latest snapshots) and score: greedy exact-match accuracy per task on held-out
   prompts for the base, each specialist, task arithmetic (1/N, and a scale tuned on a separate validation set),
   TIES, DARE+TA, DARE+TIES, RAM, RAM+, RAM+s; the mean; merge seconds per method. Printed, and written as
   ``results.json`` and ``results.png``. ``merged_ram.safetensors`` / ``merged_ram_plus.safetensors`` keep the
   RAM and RAM+ outputs, ``base.safetensors`` the base (for checks).
5. Select (``--search``, ``ram_live.search``): the merge that scores best on a *selection* split (its own prompts,
   none of them a test prompt) within ``--search-budget`` evaluations, re-made with ``merge(**best)`` and scored
   on the test prompts: the ``search`` row (``search.png``: every candidate's selection score;
   ``merged_search.safetensors``: the winner). ``--search-study`` adds each
   baseline family searched alone under the same budget (TA, TIES, DARE-TIES), the over-trained-agent scenario
   (``--overtrain`` agent's τ × ``--overtrain-factor``: defaults, the settings selected above applied unchanged,
   and re-selected) and every agent alone extrapolated (base + s·τ, s = 1, 2, 4), to see how much of a gain is
   extrapolation. The test prompts are never used to choose anything.

Curvature-aware RAM: every snapshot carries the agent's importances (Adam/AdamW: ``exp_avg_sq`` from
the live optimizer; the SGD agent: a Fisher of its final policy), and three rows use them: ``RAM (curvature)``,
``RAM+ (curvature)`` (the stored raw ``exp_avg_sq``) and ``RAM (curvature, bc)`` (bias-corrected, float32); the
plain RAM rows pass no ``importance`` (None: plain RAM). ``--converged``: every agent Adam at lr 1e-4, trained until its
selection-split accuracy plateaus, with the tuned baselines (``--tuned-baselines``: TA on a finer scale grid,
TIES' density, both chosen on the validation prompts) and the extrapolation control (``--extrapolation``: each
agent alone, base + s·τ, s = 0.5, 1, 2).

Regimes and N: ``--regime dense`` (default) is everything above; ``--regime sparse`` is the paper's
regime produced by training (``rl_demo/regimes.py``: recipes whose bf16 task vectors change few entries for one
agent and many for another; the probe is printed next to the paper's numbers). ``--agents N`` (3..8) adds tasks
of the same kind (``comp``, ``rot``, ``sortd``, ``swap``, ``dbl``; ``rl_demo/lang.py``), one specialist each, in
either regime. ``--families``: the ``search`` row and each baseline family searched alone (same budget), without
the over-trained scenario. ``python -m rl_demo.aggregate DIR...`` (from ``examples/``) tabulates seeds.

Seeds are fixed (``--seed``): two runs print the same table (merge times aside). ``--quick`` is the CI setting.
``--rsweep`` adds RAM+ at r ∈ {0, 0.05, 0.1, 0.15, 0.2} on the same agents.

Run: ``python examples/rl_merge_demo.py --out runs/rl_demo [--quick] [--seed 0] [--search]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.utils import logging as hf_logging

from ram_live import merge, probe
from ram_live.store import SnapshotStore

from rl_demo import selection as sel_
from rl_demo import curvature as curv_
from rl_demo import regimes, reuse
from rl_demo.lang import ALL_TASKS, accuracy, make_prompts, tasks_for
from rl_demo.studies import eps_sweep, module_of, plot_results, sign_agreement
from rl_demo.train import (
    CONVERGED_QUICK_RECIPE,
    CONVERGED_RECIPE,
    R_SWEEP,
    SGD_RECIPES,
    TA_GRID,
    TA_GRID_FINE,
    density_study,
    grpo,
    stage,
    train_base,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/rl_demo"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="CI setting (about a minute on 2 cores)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 was faster on a busy 2-core box)")
    parser.add_argument(
        "--density-study",
        action="store_true",
        help="also: density of one task's vector vs optimiser / lr, fp32 vs bf16 storage",
    )
    parser.add_argument(
        "--recipes",
        choices=("mixed", "sgd"),
        default="mixed",
        help="mixed: SGD / Adam / AdamW per task (default); sgd: SGD lr 1e-3 for every agent",
    )
    parser.add_argument("--eps-sweep", action="store_true", help="also RAM/RAM+ at activity thresholds ε > 1e-5")
    parser.add_argument("--rsweep", action="store_true", help="also RAM+ at r in 0, 0.05, 0.1, 0.15, 0.2")
    parser.add_argument(
        "--search",
        action="store_true",
        help="also the search row: ram_live.search on the selection split (default space)",
    )
    parser.add_argument("--search-budget", type=int, default=60, help="evaluations of each search")
    parser.add_argument(
        "--search-study",
        action="store_true",
        help="--search, and each baseline family searched alone (same budget), the over-trained-"
        "agent scenario, single agents extrapolated",
    )
    parser.add_argument(
        "--regime",
        choices=("dense", "sparse"),
        default="dense",
        help="dense: today's recipes (default); sparse: the paper's regime (rl_demo/regimes.py)",
    )
    parser.add_argument("--agents", type=int, default=3, help="number of tasks / specialists, 3..8")
    parser.add_argument(
        "--families",
        action="store_true",
        help="--search, and each baseline family searched alone (same budget); no scenario study",
    )
    parser.add_argument("--overtrain", choices=ALL_TASKS, default="rev", help="the over-trained agent (--search-study)")
    parser.add_argument("--overtrain-factor", type=float, default=5.0, help="its task vector's factor (--search-study)")
    parser.add_argument(
        "--converged",
        action="store_true",
        help="every agent Adam (lr 1e-4) until its selection accuracy plateaus; implies "
        "--tuned-baselines --extrapolation",
    )
    parser.add_argument(
        "--tuned-baselines",
        action="store_true",
        help="TA (tuned) on a finer scale grid and a TIES (tuned) row (density), both on validation",
    )
    parser.add_argument(
        "--extrapolation",
        action="store_true",
        help="each agent alone, base + s·τ for s = 0.5, 1, 2 (the control for convergence)",
    )
    parser.add_argument(
        "--reuse-trained",
        action="store_true",
        help="take the base and specialists an earlier run with the same seed and settings left in "
        "--out (trained.json/.pt, base.safetensors, store/) instead of training them again",
    )
    parser.add_argument(
        "--train-only",
        action="store_true",
        help="train the base and specialists, keep them in --out (for --reuse-trained), stop",
    )
    args = parser.parse_args(argv)
    if args.converged and args.recipes != "mixed":
        parser.error("--converged sets every agent's recipe: not with --recipes")
    if not 3 <= args.agents <= len(ALL_TASKS):
        parser.error(f"--agents is 3..{len(ALL_TASKS)}")
    if args.regime == "sparse" and (args.recipes != "mixed" or args.converged):
        parser.error("--regime sparse sets every agent's recipe: not with --recipes / --converged")
    tasks = tasks_for(args.agents)
    if args.overtrain not in tasks:
        parser.error(f"--overtrain is one of {tasks}")
    n = len(tasks)
    args.tuned_baselines |= args.converged
    args.extrapolation |= args.converged
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    s, sft_target = regimes.settings(args.regime, tasks, args.quick)
    if args.recipes == "sgd":
        s = dataclasses.replace(
            s,
            recipes={
                t: dataclasses.replace(SGD_RECIPES[t], steps=s.recipes[t].steps)
                if t in SGD_RECIPES
                else dataclasses.replace(s.recipes[t], optimizer="sgd", lr=0.001, weight_decay=0.0)
                for t in tasks
            },
        )
    if args.converged:
        r = CONVERGED_QUICK_RECIPE if args.quick else CONVERGED_RECIPE
        s = dataclasses.replace(s, recipes={t: r for t in tasks})
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # held-out test prompts (never trained on: the RL/SFT generators use other seeds; overlap is chance only)
    g_test = torch.Generator().manual_seed(10_000 + args.seed)
    test = {t: make_prompts(t, g_test, s.n_eval) for t in tasks}
    g_val = torch.Generator().manual_seed(20_000 + args.seed)
    val = {t: make_prompts(t, g_val, s.n_val) for t in tasks}
    # the selection split of search: its own generator, and no digit string of a test prompt
    sel = sel_.selection_split(test, s.n_sel, args.seed)

    # 1. base, 2. specialists through the snapshot store (or both as an earlier run with these settings left them)
    t0 = time.perf_counter()
    trained = reuse.load(out, args, s, tasks, sft_target) if args.reuse_trained else None
    if trained is not None:
        base, store, rl, kept, sft_info = trained
        timings["reused_training"] = time.perf_counter() - t0
        print(f"reusing the base and specialists trained earlier in {out}")
    else:
        reuse.forget(out)
        base, sft_info = train_base(s, args.seed, val, target=sft_target)
        timings["base_sft"] = time.perf_counter() - t0
        store_dir = out / "store"
        if store_dir.exists():
            shutil.rmtree(store_dir)
        store = SnapshotStore(store_dir, durable=False)
        rl: dict[str, Any] = {}
        kept: dict[str, dict[str, Any]] = {t: {} for t in tasks}  # each agent's final importances (raw, bias-corr.)
        t0 = time.perf_counter()
        for i, task in enumerate(tasks):
            rl[task] = grpo(
                base,
                task,
                s.recipes[task],
                s,
                seed=args.seed * 100 + i + 1,
                store=store,
                sel=sel[task],
                keep=kept[task],
            )
        timings["rl"] = time.perf_counter() - t0
        reuse.save(out, args, s, tasks, sft_target, base, rl, kept, sft_info)
    if args.train_only:
        print(f"trained; kept in {out} for --reuse-trained")
        return {"trained": str(out)}
    from safetensors.torch import save_file

    agents = store.latest_all(tasks)

    dstudy: list[dict[str, Any]] = []
    if args.density_study:
        dstudy = density_study(base, s, args.seed, out)
        print("\ndensity of the sort agent's task vector (30 GRPO steps) vs recipe:")
        print(f"{'optimizer':<10}{'lr':>8}{'fp32 |τ|>1e-5':>15}{'bf16 changed':>14}{'sort acc':>10}")
        for row in dstudy:
            print(
                f"{row['optimizer']:<10}{row['lr']:>8g}{row['density_fp32']:>15.1%}{row['density_bf16']:>14.1%}"
                f"{row['sort_acc_bf16']:>10.3f}"
            )

    # 3. probe
    report = probe(agents, base=base)
    print("\n" + report.table())
    report.plot(str(out / "probe.png"))
    print(regimes.paper_table(report, {t: agents[t].density for t in tasks}))
    signs = sign_agreement(agents, base)
    print(
        f"entries changed by ≥ 2 agents: {signs['shared_entries']:,}; all changing agents agree in sign on "
        f"{signs['sign_agree_share']:.1%} of them"
    )

    # 4. merge and score
    t0 = time.perf_counter()
    rows: dict[str, dict[str, float]] = {}
    seconds: dict[str, float | None] = {}
    options_used: dict[str, Any] = {}
    lambdas: dict[str, Any] = {}

    def score(name: str, model: nn.Module, sec: float | None) -> None:
        rows[name], seconds[name] = sel_.scored(model, test), sec

    score("base", base, None)
    for t in tasks:
        score(f"specialist {t}", module_of(base, agents[t].to_state_dict()), None)

    # tuned TA scale: chosen on the validation prompts (not the test prompts)
    val_scores = {}
    ta_grid = TA_GRID_FINE if args.tuned_baselines else TA_GRID
    for sc in ta_grid:
        m = merge(agents, base=base, method="task_arithmetic", scale=sc)
        v = accuracy(m, val)
        val_scores[sc] = sum(v.values()) / n
    best_scale = max(ta_grid, key=lambda x: (val_scores[x], -x))
    methods = regimes.methods(n)
    n_methods = len(methods) + (len(R_SWEEP) if args.rsweep else 0)
    for j, (label, method, opts) in enumerate(methods, 1):
        opts = dict(opts)
        if label == "TA (tuned)":
            opts["scale"] = best_scale
        t1 = time.perf_counter()
        merged, info = merge(agents, base=base, method=method, return_info=True, **opts)
        sec = time.perf_counter() - t1
        score(label, merged, sec)
        options_used[label] = {"method": method, **opts}
        if info.lambdas:
            lambdas[label] = dict(info.lambdas)
        if label in ("RAM", "RAM+"):  # the paper's rule (not the sign rows, which use the same methods)
            save_file(
                {k: v.contiguous() for k, v in merged.state_dict().items()}, str(out / f"merged_{method}.safetensors")
            )
        stage("merge+score", j, n_methods, t0, label)
    ties_val: dict[float, float] = {}
    if args.tuned_baselines:
        density, ties_val = curv_.tuned_ties(agents, base, val)
        t1 = time.perf_counter()
        merged = merge(agents, base=base, method="ties", density=density)
        score("TIES (tuned)", merged, time.perf_counter() - t1)
        options_used["TIES (tuned)"] = {"method": "ties", "density": density}
    curvature = curv_.curvature_rows(agents, base, {t: kept[t]["bias_corrected"] for t in tasks}, score, out)
    options_used.update({k: {"method": v["method"], "importance": v["importance"]} for k, v in curvature.items()})
    sweep: dict[str, Any] = {}
    if args.rsweep:
        counts = None  # the first RAM+ merge counts ρ's inputs; the others reuse them (one pass each)
        for j, r in enumerate(R_SWEEP, len(methods) + 1):
            merged, info = merge(agents, base=base, method="ram_plus", r=r, return_info=True, statistics=counts)
            counts = info.statistics
            acc = accuracy(merged, test)
            acc["mean"] = sum(acc[t] for t in tasks) / n
            sweep[str(r)] = {"acc": acc, "lambdas": dict(info.lambdas or {})}
            stage("merge+score", j, n_methods, t0, f"RAM+ r={r}")
    timings["merge_and_score"] = time.perf_counter() - t0

    # 5. selection on the selection split (ram_live.search), scored on the test prompts
    searched: dict[str, Any] = {}
    study: dict[str, Any] = {}
    if args.search or args.search_study or args.families:
        t0 = time.perf_counter()
        searched = sel_.search_rows(
            agents,
            base,
            sel,
            test,
            budget=args.search_budget,
            seed=args.seed,
            families=args.search_study or args.families,
        )
        for label, row in searched.items():
            rows[label], seconds[label] = row["test"], row["seconds"]["merge"] / max(row["evaluations"], 1)
        searched["search"]["result"].plot(str(out / "search.png"))
        winner = merge(agents, base=base, **searched["search"]["best"])
        save_file({k: v.contiguous() for k, v in winner.state_dict().items()}, str(out / "merged_search.safetensors"))
        timings["search"] = time.perf_counter() - t0
        if args.search_study:
            t0 = time.perf_counter()
            study["extrapolation"] = sel_.extrapolated(agents, base, test)
            study["overtrained"] = sel_.overtrained_study(
                agents,
                base,
                sel,
                test,
                searched,
                name=args.overtrain,
                factor=args.overtrain_factor,
                budget=args.search_budget,
                seed=args.seed,
            )
            timings["search_study"] = time.perf_counter() - t0
    extrapolation: dict[str, Any] = {}
    if args.extrapolation:
        t0 = time.perf_counter()
        extrapolation = sel_.extrapolated(agents, base, test, scales=curv_.EXTRAPOLATION_CONTROL)
        timings["extrapolation"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    eps_rows = eps_sweep(agents, base, test) if args.eps_sweep else {}
    if eps_rows:
        print(
            "RAM / RAM+ mean accuracy vs activity threshold ε: "
            + ", ".join(f"ε={e}: {v['ram']['mean']:.3f} / {v['ram_plus']['mean']:.3f}" for e, v in eps_rows.items())
        )
    timings["eps_sweep"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    # table
    head = f"{'method':<21}" + "".join(f"{t:>8}" for t in tasks) + f"{'mean':>8}{'merge s':>9}"
    lines = [head, "-" * len(head)]
    for name, acc in rows.items():
        sec = seconds[name]
        lines.append(
            f"{name:<21}"
            + "".join(f"{acc[t]:>8.3f}" for t in tasks)
            + f"{acc['mean']:>8.3f}"
            + (f"{sec:>9.3f}" if sec is not None else f"{'-':>9}")
        )
    print(f"\ngreedy exact-match accuracy on held-out prompts (n = {s.n_eval} per task)")
    print("\n".join(lines))
    print(
        f"TA tuned scale = {best_scale} (validation means: "
        + ", ".join(f"{k}: {v:.3f}" for k, v in val_scores.items())
        + ")"
    )
    if ties_val:
        print(
            f"TIES tuned density = {options_used['TIES (tuned)']['density']} (validation means: "
            + ", ".join(f"{k}: {v:.3f}" for k, v in ties_val.items())
            + ")"
        )
    if args.converged:
        print(
            "converged agents, steps (max "
            + f"{next(iter(s.recipes.values())).steps}): "
            + ", ".join(f"{t} {rl[t]['steps']}" for t in tasks)
        )
    if extrapolation:
        print(
            "each agent alone, extrapolated (base + s·τ), test mean / own task: "
            + curv_.extrapolation_line(extrapolation)
        )
    for label, lam in lambdas.items():
        print(f"λ {label}: " + ", ".join(f"{k} {v:.4f}" for k, v in lam.items()))
    if sweep:
        print("RAM+ r sweep (α = 2): " + ", ".join(f"r={r}: {v['acc']['mean']:.3f}" for r, v in sweep.items()))
    for label, row in searched.items():
        print(f"{label}: {sel_.line(row)}")
    if study:
        ot = study["overtrained"]
        print(f"\nover-trained scenario: {ot['agent']}'s task vector × {ot['factor']:g}")
        sel_.print_table("defaults (no selection)", ot["defaults"])
        sel_.print_table("frozen (settings selected on the normal agents, applied unchanged)", ot["frozen"])
        sel_.print_table("re-selected (search on the over-trained agents)", ot["reselected"])
        print(
            "\neach agent alone, extrapolated (base + s·τ), test mean / own task: "
            + "; ".join(
                f"{a}: " + ", ".join(f"s={k} {v['mean']:.3f}/{v[a]:.3f}" for k, v in by.items())
                for a, by in study["extrapolation"].items()
            )
        )
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    result = {
        "seed": args.seed,
        "quick": args.quick,
        "recipes": args.recipes,
        "threads": args.threads,
        "converged": args.converged,
        "tuned_baselines": args.tuned_baselines,
        "ties_validation": {str(k): v for k, v in ties_val.items()},
        "curvature": curvature,
        "extrapolation": extrapolation,
        "settings": {
            "sft_steps": s.sft_steps,
            "recipes": {t: vars(r) for t, r in s.recipes.items()},
            "prompts_per_step": s.prompts_per_step,
            "group": s.group,
            "n_eval": s.n_eval,
        },
        "parameters": sum(p.numel() for p in base.parameters()),
        "sft": sft_info,
        "rl": rl,
        "accuracy": rows,
        "merge_seconds": seconds,
        "options": options_used,
        "lambdas": lambdas,
        "ta_validation": {str(k): v for k, v in val_scores.items()},
        "ta_tuned_scale": best_scale,
        "probe": {"agents": report.to_dict()["agents"], "histogram": report.histogram},
        "density": {t: agents[t].density for t in tasks},
        "regime": args.regime,
        "agents": n,
        "tasks": list(tasks),
        "sft_target": sft_target,
        "unique_share": {t: report.agents[t].unique_share for t in tasks},
        "sign_agreement": signs,
        "r_sweep": sweep,
        "eps_sweep": eps_rows,
        "density_study": dstudy,
        "timings": timings,
        "selection_prompts": s.n_sel,
        "search_budget": args.search_budget if searched else None,
        "search": {k: sel_.summary(v) for k, v in searched.items()},
        "search_study": {
            "extrapolation": study.get("extrapolation", {}),
            "overtrained": {
                k: ({r: sel_.summary(x) for r, x in v.items()} if isinstance(v, dict) else v)
                for k, v in study.get("overtrained", {}).items()
            },
        },
    }
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    plot_results(out / "results.png", rows)
    print(f"wrote {out / 'results.json'}, {out / 'results.png'}, {out / 'probe.png'}")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
