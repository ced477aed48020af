"""What curvature-aware RAM costs: ``ram_merge(..., importance=...)`` against plain RAM of the same models.

    python benchmarks/bench_importance.py                 # ~67 M bf16 parameters, K = 2 and 3, 5 pairs each
    python benchmarks/bench_importance.py --reps 3 --size quick --json out.json

Inputs: bench_merge's bf16 base and agents (same seeds, densities 3 %, 46 %, 54 %), shaped like one Llama-style
block plus embeddings and head at hidden 3072 (67.6 M parameters), and per agent one importance tensor per
parameter (random positive float32, as Adam's ``exp_avg_sq`` is stored; ``--imp-dtype bfloat16`` for a compact
copy). Each row: ``--reps`` interleaved pairs (plain, weighted; order alternating, outputs freed, heap trimmed,
the machine waited on until others are quiet, as bench_merge times), best-of and median of each, and the median
over the pairs of weighted / plain. Target: weighted <= 1.5 x plain. RAM+ rows: the plain RAM+ reads the inputs
once into memory; with importances it takes two passes (counts, then the weighted merge). First, the native
kernels alone on one thread (best of 3 x ``--reps`` interleaved calls: the least disturbed on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_merge as bm  # noqa: E402
from _host import cpu_label  # noqa: E402

bm.SIZES["mid"] = (3072, 4096, 768, 2048)  # 67,646,976 parameters


def importances(base: dict[str, torch.Tensor], k: int, dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    out = []
    for t in range(k):
        g = torch.Generator().manual_seed(977 + t)
        out.append({name: (torch.rand(v.shape, generator=g) * 1e-6).to(dtype) for name, v in base.items()})
    return out


def kernel_times(k: int, numel: int, reps: int) -> dict[str, float]:
    """Best-of-``reps`` seconds of one thread's native kernel call over ``numel`` bf16 entries per input: the plain
    RAM merge, and the weighted one with float32 and with bfloat16 importances (calls interleaved, so that other
    processes' load falls on all three alike; the best of many calls is the least disturbed)."""
    import time

    import ram_live._importance_native as wnative
    import ram_live._ram_native as native

    g = torch.Generator().manual_seed(3)
    base = torch.randn(numel, generator=g).to(torch.bfloat16)
    agents = [torch.where(torch.rand(numel, generator=g) < d, base + 0.01, base) for d in bm.DENSITIES[:k]]
    imps32 = [torch.rand(numel, generator=g) for _ in range(k)]
    imps16 = [h.to(torch.bfloat16) for h in imps32]
    out = torch.empty(numel, dtype=torch.bfloat16)
    plain, weighted = native.kernels(), wnative.kernels()
    calls = {"plain": lambda: plain.merge(out, base, agents, None, 1e-5, 0, numel),
             "importance float32": lambda: weighted.merge_weighted(out, base, agents, imps32, None, 1e-5, 0, numel),
             "importance bfloat16": lambda: weighted.merge_weighted(out, base, agents, imps16, None, 1e-5, 0, numel)}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(reps):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mid", choices=sorted(bm.SIZES))
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--imp-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--variants", nargs="+", default=["ram", "ram_plus"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import ram_live

    imp_dtype = getattr(torch, args.imp_dtype)
    print(f"CPU: {cpu_label()}, "
          f"{torch.get_num_threads()} torch threads; git {bm.git_state()}; load {bm.loadavg()}")
    rows = []
    for k in args.ks:
        best = kernel_times(k, 1 << 23, 3 * args.reps)
        rows.append(dict(k=k, kernel_seconds=best))
        print(f"kernel alone, K={k}, 8.4 M bf16 entries per input, one thread, best of {3 * args.reps}: "
              + ", ".join(f"{name} {sec * 1e3:.1f} ms ({sec / best['plain']:.2f} x)" for name, sec in best.items()),
              flush=True)
    tiny_base, tiny_agents = bm.build_inputs("tiny", 2)
    ram_live.ram_merge(tiny_agents, base=tiny_base, importance=importances(tiny_base, 2, imp_dtype))  # builds
    for k in args.ks:
        base, agents = bm.build_inputs(args.size, k)
        imps = importances(base, k, imp_dtype)
        params = sum(v.numel() for v in base.values())
        for variant in args.variants:
            info: dict = {}

            def plain() -> object:
                return ram_live.ram_merge(agents, base=base, variant=variant)

            def weighted() -> object:
                out, info["w"] = ram_live.ram_merge(agents, base=base, variant=variant, importance=imps,
                                                    return_info=True)
                return out

            a, b = bm.paired(plain, weighted, args.reps, torch.device("cpu"))
            ratios = [y / x for x, y in zip(a, b)]
            row = dict(k=k, variant=variant, params=params, imp_dtype=args.imp_dtype,
                       plain_best=min(a), plain_median=statistics.median(a), weighted_best=min(b),
                       weighted_median=statistics.median(b), ratio_median=statistics.median(ratios),
                       ratio_best=min(b) / min(a), kernels=info["w"].extra.get("kernels"))
            rows.append(row)
            print(f"K={k} {variant:9s} {params / 1e6:.1f} M: plain best {row['plain_best']:.3f} s median "
                  f"{row['plain_median']:.3f} s | importance best {row['weighted_best']:.3f} s median "
                  f"{row['weighted_median']:.3f} s | ratio of medians of pairs {row['ratio_median']:.2f} x, "
                  f"of bests {row['ratio_best']:.2f} x [{'PASS' if row['ratio_median'] <= 1.5 else 'FAIL'} "
                  f"<= 1.5 x] kernels {row['kernels']}", flush=True)
        del base, agents, imps
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
