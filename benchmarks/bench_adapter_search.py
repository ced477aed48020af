"""Benchmark: ``ram_live.search`` over LoRA adapters against the paper's fixed defaults, on a selection split and a
separate test split.

The set-up of ``examples/lora_activity_experiment.py`` (imported from it; CPU, one thread, nothing downloaded): a
tiny Llama (hidden 128, 2 layers) "pre-trained" 100 steps on generic data, then one LoRA adapter per synthetic task
(``count``, ``route``, ``lookup``; r = 16 on every linear layer, ``--steps`` AdamW steps with generic replay). A
merged model's score on a split is the mean over the tasks of the share of the specialist's loss improvement it
keeps, gain = (L_base − L_merged) / (L_base − L_specialist) (100 % = that task's own adapter, 0 % = the base); the
worst task's gain is reported next to it.

Per seed, with the same adapters:

* **search**: ``search(peft_model, adapters=tasks, evaluate=gain on the selection split, budget=--budget)`` (the
  adapter default space: RAM+ r × α, the activity rule's density, λ, leave-one-out, activity; task arithmetic,
  TIES, DARE-TIES), its winner re-made with ``ram_merge_adapters(model, tasks, into_base=True, **result.best)``
  and scored on the test split; also the best RAM-side trial and the best baseline trial of the same search;
* **fixed**: RAM+ at the paper's defaults with the recommended rule (``ram_merge_adapters(model, tasks,
  into_base=True)``: r = 0.1, α = 2, TopK(0.5)), RAM (λ = 1) with TopK(0.5), the plain mean (``linear``) and the
  sum (``task_arithmetic``).

Selection split: 128 sequences per task (seed 20 000 + s); test split: 256 per task (seed 10 000 + s, the
experiment's held-out set). Mean ± sample std over seeds.

Run: ``python benchmarks/bench_adapter_search.py [--seeds 3] [--steps 80] [--budget 60] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import lora_activity_experiment as exp  # noqa: E402
from _host import cpu_label  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import ram_live  # noqa: E402
from ram_live.peft import ram_merge_adapters  # noqa: E402
from ram_live.selection.adapters import ADAPTER_SPACE  # noqa: E402

FIXED = {
    "RAM+ r=0.1 α=2, TopK(0.5) (paper defaults, ram_merge_adapters' default)": {},
    "RAM, TopK(0.5)": {"method": "ram"},
    "mean (linear)": {"method": "linear"},
    "sum (task_arithmetic)": {"method": "task_arithmetic"},
}


#: The RAM arm of the adapter default space (the search "RAM arm only").
RAM_ONLY = {
    k: v for k, v in ADAPTER_SPACE.items() if k in ("ram_plus", "sparsify", "lambdas", "leave_one_out", "activity")
}


class Gain:
    """A split's score of a merged model: the mean (or the worst) gain over the tasks."""

    def __init__(
        self, held_out: dict[str, Any], base: dict[str, float], specialist: dict[str, float], objective: str = "mean"
    ) -> None:
        self.held_out, self.base, self.specialist, self.objective = held_out, base, specialist, objective

    def tasks(self, model: torch.nn.Module) -> dict[str, float]:
        losses = exp.evaluate(model, self.held_out)
        return {n: (self.base[n] - losses[n]) / (self.base[n] - self.specialist[n]) for n in self.held_out}

    def __call__(self, model: torch.nn.Module) -> float:
        gains = self.tasks(model).values()
        return statistics.mean(gains) if self.objective == "mean" else min(gains)


def one_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(seed)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    base = exp.pretrain(base, seed, 100, 3e-3)
    splits = {"selection": (20_000, 128), "test": (10_000, 256)}
    held = {
        split: {n: task(torch.Generator().manual_seed(s0 + seed), size) for n, task in exp.TASKS.items()}
        for split, (s0, size) in splits.items()
    }
    base_loss = {split: exp.evaluate(base, h) for split, h in held.items()}
    model = exp.train_adapters(base, seed, args.steps, 1e-2)
    names = list(exp.TASKS)
    spec: dict[str, dict[str, float]] = {split: {} for split in held}
    for name in names:
        model.set_adapter(name)
        for split, h in held.items():
            spec[split][name] = exp.evaluate(model, h)[name]
    test = Gain(held["test"], base_loss["test"], spec["test"])
    out: dict[str, Any] = {"seed": seed, "rows": {}, "searches": {}}

    def row(label: str, merged: torch.nn.Module) -> None:
        tasks = test.tasks(merged)
        selection = Gain(held["selection"], base_loss["selection"], spec["selection"]).tasks(merged)
        out["rows"][label] = {
            "test": statistics.mean(tasks.values()),
            "worst": min(tasks.values()),
            "selection": statistics.mean(selection.values()),
            "selection_worst": min(selection.values()),
            "tasks": tasks,
        }

    for objective in args.objectives:
        select = Gain(held["selection"], base_loss["selection"], spec["selection"], objective)
        for what, space in (("search", None), ("search, RAM arm only", RAM_ONLY)):
            t0 = time.perf_counter()
            result = ram_live.search(model, adapters=names, evaluate=select, budget=args.budget, seed=seed, space=space)
            seconds = time.perf_counter() - t0
            best = ram_merge_adapters(model, names, into_base=True, **result.best)
            assert select(best) == result.best_score, "the re-made winner scores what the search scored"
            row(f"{what} ({objective} objective): winner", best)
            if space is None and result.best_ram is not None:
                row(
                    f"{what} ({objective} objective): best RAM-side trial",
                    ram_merge_adapters(model, names, into_base=True, **result.best_ram.candidate),
                )
            out["searches"][f"{what} ({objective})"] = {
                "seconds": seconds,
                "winner": result.best_trial.label(),
                "budgets": result.budgets,
                "best_ram": result.best_ram.label() if result.best_ram else None,
                "sparsify_trials": [
                    (str(t.options.get("sparsify")), t.score) for t in result.history if t.family == "sparsify"
                ],
                "table": result.table(),
            }
    for label, options in FIXED.items():
        row(label, ram_merge_adapters(model, names, into_base=True, warn_dense=False, **options))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument(
        "--objectives",
        nargs="+",
        default=["mean", "worst"],
        choices=["mean", "worst"],
        help="what the selection split's score is: the mean gain over the tasks, or the worst",
    )
    parser.add_argument("--json", default=None, help="write every number here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the experiment: tensors this small gain nothing from more threads
    t_start = time.perf_counter()
    seeds = []
    for seed in range(args.seeds):
        seeds.append(one_seed(seed, args))
        print(f"seed {seed} ({time.perf_counter() - t_start:.0f} s)", flush=True)
        for what, s in seeds[-1]["searches"].items():
            print(
                f"  {what} ({s['seconds']:.0f} s): winner {s['winner']}; best RAM {s['best_ram']}; sparsify "
                f"moves {[(r, round(x, 4)) for r, x in s['sparsify_trials']]}; budgets {s['budgets']}",
                flush=True,
            )
    print(
        f"\n{cpu_label()}; {args.seeds} seeds, {args.steps} steps per adapter, budget {args.budget}; gain in % "
        "(mean over tasks / worst task), mean ± sample std over seeds\n"
    )
    print("| merge | test: mean gain | test: worst task | selection: mean gain | selection: worst task |")
    print("|---|---|---|---|---|")

    def cell(label: str, key: str) -> str:
        values = [100 * s["rows"][label][key] for s in seeds]
        return f"{statistics.mean(values):.1f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1f}"

    for label in seeds[0]["rows"]:
        print(
            f"| {label} | "
            + " | ".join(cell(label, k) for k in ("test", "worst", "selection", "selection_worst"))
            + " |"
        )
    fixed = next(iter(FIXED))
    for objective in args.objectives:
        key = "test" if objective == "mean" else "worst"
        for what in ("search", "search, RAM arm only"):
            label = f"{what} ({objective} objective): winner"
            paired = [100 * (s["rows"][label][key] - s["rows"][fixed][key]) for s in seeds]
            print(f"{label} − RAM+ defaults, test {objective} gain, per seed: {', '.join(f'{p:+.1f}' for p in paired)}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cpu": cpu_label(), "seeds": seeds}, indent=2))


if __name__ == "__main__":
    main()
