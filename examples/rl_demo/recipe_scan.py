"""Recipe scan for the sparse regime: one base, one specialist per (task, recipe), its bf16 density and
its own-task gain; the changed-entry masks are kept so unique shares can be computed for any choice of three.

Run: ``python -m rl_demo.recipe_scan --out runs/scan_s0 --seed 0 [--target 0.6] [--tasks shift,rev,sort]``
(from ``examples/``). Prints one line per recipe and writes ``scan.json`` and ``masks.pt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from ram_live.store import SnapshotStore

from .lang import accuracy, make_prompts
from .train import QUICK, Recipe, bf16_state, grpo, train_base

GRID = [
    Recipe("adam", 1e-6, 30),
    Recipe("adam", 3e-6, 30),
    Recipe("adam", 1e-5, 30),
    Recipe("adam", 3e-5, 30),
    Recipe("adam", 1e-4, 30),
    Recipe("sgd", 3e-4, 30),
    Recipe("sgd", 1e-3, 30),
    Recipe("sgd", 3e-3, 30),
]


def parse_recipe(text: str) -> Recipe:
    opt, lr, steps = text.split(":")
    return Recipe(opt, float(lr), int(steps))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.4, help="SFT target accuracy per task")
    ap.add_argument("--sft-steps", type=int, default=400)
    ap.add_argument("--tasks", default="shift,rev,sort")
    ap.add_argument("--scan", default="", help="tasks to train specialists for (default: all of --tasks)")
    ap.add_argument("--prompts", type=int, default=0, help="prompts per RL step (default: the quick setting's)")
    ap.add_argument("--width", default="96,256", help="hidden,intermediate")
    ap.add_argument("--replay", type=float, default=0.125, help="SFT replay share once a task reached target")
    ap.add_argument("--base-only", action="store_true", help="train and score the base only")
    ap.add_argument("--recipes", default="", help="optimizer:lr:steps,... (default: the built-in grid)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tasks = tuple(args.tasks.split(","))
    grid = [parse_recipe(r) for r in args.recipes.split(",")] if args.recipes else GRID
    s = QUICK.__class__(
        **{
            **vars(QUICK),
            "sft_steps": args.sft_steps,
            "prompts_per_step": args.prompts or QUICK.prompts_per_step,
            "hidden": int(args.width.split(",")[0]),
            "intermediate": int(args.width.split(",")[1]),
        }
    )
    args.out.mkdir(parents=True, exist_ok=True)
    val = {t: make_prompts(t, torch.Generator().manual_seed(20_000 + args.seed), 200) for t in tasks}
    base, info = train_base(dataclasses.replace(s, sft_replay=args.replay), args.seed, val, target=args.target)
    base_acc = accuracy(base, val)
    print(f"\nbase: SFT {info}, val acc {base_acc}", flush=True)
    if args.base_only:
        return []
    bsd = base.state_dict()
    numel = sum(v.numel() for v in bsd.values())
    rows, masks = [], {}
    for task in tuple(args.scan.split(",")) if args.scan else tasks:
        for j, r in enumerate(grid):
            store = SnapshotStore(args.out / "store" / f"{task}_{j}", durable=False)
            model = grpo(base, task, r, s, seed=args.seed * 100 + 1, store=store, return_model=True)
            sd = bf16_state(model)
            mask = {k: sd[k] != bsd[k] for k in bsd}
            dens = sum(int(m.sum()) for m in mask.values()) / numel
            acc = accuracy(model.to(torch.bfloat16), {task: val[task]})[task]
            row = {
                "task": task,
                "optimizer": r.optimizer,
                "lr": r.lr,
                "steps": r.steps,
                "density": dens,
                "base_acc": base_acc[task],
                "acc": acc,
                "gain": acc - base_acc[task],
            }
            rows.append(row)
            masks[f"{task}|{r.optimizer}|{r.lr}|{r.steps}"] = torch.cat([m.flatten() for m in mask.values()])
            print(
                f"\n{task:<6}{r.optimizer:<6}{r.lr:<8g}{r.steps:>4}  density {dens:6.2%}  "
                f"acc {base_acc[task]:.3f} -> "
                f"{acc:.3f} ({acc - base_acc[task]:+.3f})",
                flush=True,
            )
    (args.out / "scan.json").write_text(json.dumps({"base": base_acc, "sft": info, "rows": rows}, indent=1))
    torch.save(masks, args.out / "masks.pt")
    return rows


if __name__ == "__main__":
    main()
