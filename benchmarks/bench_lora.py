"""Benchmark: merging 3 LoRA adapters of rank 16 into one of rank 16 — ram_live's exact and randomized
re-factorisation against PEFT's ``add_weighted_adapter(..., combination_type="svd")``, in one run.

The model is a Llama built from a config (nothing downloaded) with ``--layers`` layers whose q/k/v/o projections
are ``--hidden`` × ``--hidden`` (``num_key_value_heads = num_attention_heads``); the three adapters target those
four projections, with random factors (``init_lora_weights=False``) of LoRA-like size.

Two merges, each timed end to end (ΔW extraction, merge, SVD, writing the new adapter into the live model):

* ``task_arithmetic`` with weights 1/3 — the merge PEFT's ``svd`` path computes (Σ w_t ΔW_t, then a full
  ``torch.linalg.svd`` and truncation), so all three produce approximations of the same ΔW*: PEFT's ``svd``
  (default ``full_matrices=True``), ram_live ``svd="exact"`` (``torch.linalg.svd(full_matrices=False)``) and
  ``svd="randomized"`` (``torch.svd_lowrank``, q = k + oversample columns, ``niter`` power iterations);
* ``ram_plus`` with the default activity rule (a full-rank ΔW*, the harder case for a randomized SVD).

Error = ‖ΔW* − B'A'‖_F / ‖ΔW*‖_F over all modules together, with ΔW* computed independently from the adapters'
factors (float64); "added error" = randomized error − exact error. Ratios are taken within the run.

Run: ``python benchmarks/bench_lora.py [--hidden 2048] [--layers 1] [--repeat 1] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
import warnings

import torch
from _host import cpu_label

warnings.filterwarnings("ignore")

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live.peft import lora_deltas, ram_merge_adapters  # noqa: E402

NAMES = ["code", "tool", "memory"]


def build(hidden: int, layers: int, rank: int, targets: list[str], seed: int = 0):
    torch.manual_seed(seed)
    heads = max(1, hidden // 128)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=64,
    )
    with torch.device("meta"):
        meta = LlamaForCausalLM(config)
    base = meta.to_empty(device="cpu")
    with torch.no_grad():
        for p in base.parameters():
            p.normal_(0, 0.02)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
    model = get_peft_model(base, cfg, adapter_name=NAMES[0])
    for name in NAMES[1:]:
        model.add_adapter(name, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * (0.01 if "lora_B" in n else 1.0 / math.sqrt(p.shape[-1])))
    return model.eval()


def truth(model, method: str) -> dict[str, torch.Tensor]:
    """ΔW* in float64 for task_arithmetic with weights 1/3 (independent of ram_live's merge)."""
    assert method == "task_arithmetic"
    deltas = [lora_deltas(model, n) for n in NAMES]
    return {k: sum(d[k].double() for d in deltas) / 3 for k in deltas[0]}


def adapter_delta(model, name: str) -> dict[str, torch.Tensor]:
    root = model.base_model.model
    return {k: root.get_submodule(k).get_delta_weight(name).detach().double() for k in lora_deltas(model, NAMES[0])}


def rel_error(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> float:
    num = sum(float((expected[k] - got[k]).pow(2).sum()) for k in expected)
    den = sum(float(expected[k].pow(2).sum()) for k in expected)
    return math.sqrt(num / den)


def timed(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj", help="comma-separated")
    parser.add_argument("--oversample", type=int, default=None)
    parser.add_argument("--niter", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="best of N timings")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    targets = args.targets.split(",")
    model = build(args.hidden, args.layers, args.rank, targets)
    n_modules = len(targets) * args.layers
    print(
        f"{n_modules} target modules of {args.hidden}x{args.hidden}, 3 adapters of rank {args.rank} -> rank "
        f"{args.rank}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{cpu_label()} x {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    weights = [1 / 3] * 3
    rows = []
    expected = truth(model, "task_arithmetic")

    def run(label: str, fn, name: str, reference: dict | None) -> dict:
        best = math.inf
        for i in range(args.repeat):
            if name in model.peft_config:
                model.delete_adapter(name)
            best = min(best, timed(fn))
        err = rel_error(reference, adapter_delta(model, name)) if reference is not None else None
        row = {"label": label, "seconds": best, "error": err}
        rows.append(row)
        print(f"  {label:<44} {best:8.2f} s" + (f"   rel. error {err:.6f}" if err is not None else ""), flush=True)
        return row

    print("task_arithmetic, weights 1/3 (the merge PEFT's svd path does):")
    peft_row = run(
        "PEFT add_weighted_adapter(svd)",
        lambda: model.add_weighted_adapter(NAMES, weights, "peft_svd", combination_type="svd", svd_rank=args.rank),
        "peft_svd",
        expected,
    )
    exact_row = run(
        "ram_live svd='exact'",
        lambda: ram_merge_adapters(
            model, NAMES, "exact", method="task_arithmetic", weights=weights, rank=args.rank, svd="exact"
        ),
        "exact",
        expected,
    )
    rand_row = run(
        f"ram_live svd='randomized' (niter={args.niter})",
        lambda: ram_merge_adapters(
            model,
            NAMES,
            "rand",
            method="task_arithmetic",
            weights=weights,
            rank=args.rank,
            svd="randomized",
            oversample=args.oversample,
            niter=args.niter,
        ),
        "rand",
        expected,
    )
    print("ram_plus, default activity rule (full-rank ΔW*; error against the exact truncation's ΔW*):")
    reports = {}

    def ram(label: str, svd: str):
        def go():
            _, reports[label] = ram_merge_adapters(
                model,
                NAMES,
                label,
                method="ram_plus",
                rank=args.rank,
                svd=svd,
                oversample=args.oversample,
                niter=args.niter,
                return_info=True,
            )

        return go

    ram_exact = run("ram_live ram_plus svd='exact'", ram("ram_exact", "exact"), "ram_exact", None)
    ram_rand = run("ram_live ram_plus svd='randomized'", ram("ram_rand", "randomized"), "ram_rand", None)
    ram_exact["error"] = reports["ram_exact"].error
    ram_rand["error"] = reports["ram_rand"].error
    print(f"  re-factorisation error (report): exact {ram_exact['error']:.4f}, randomized {ram_rand['error']:.4f}")

    summary = {
        "speedup_randomized_vs_peft_svd": peft_row["seconds"] / rand_row["seconds"],
        "speedup_exact_vs_peft_svd": peft_row["seconds"] / exact_row["seconds"],
        "added_error_randomized_vs_exact": rand_row["error"] - exact_row["error"],
        "error_peft_minus_exact": peft_row["error"] - exact_row["error"],
        "speedup_ram_plus_randomized_vs_exact": ram_exact["seconds"] / ram_rand["seconds"],
        "added_error_ram_plus_randomized_vs_exact": ram_rand["error"] - ram_exact["error"],
    }
    print("\nratios (same run):")
    for k, v in summary.items():
        print(f"  {k:<44} {v:10.4f}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "args": vars(args),
                    "modules": n_modules,
                    "rows": rows,
                    "summary": summary,
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "cpus": os.cpu_count(),
                    "machine": cpu_label(),
                    "loadavg": os.getloadavg(),
                },
                fh,
                indent=2,
            )


if __name__ == "__main__":
    main()
