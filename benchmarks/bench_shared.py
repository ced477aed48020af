"""What RAM's conflict-aware shared region (``shared="sign"``) costs against the paper's mean (``shared="mean"``):
the same merge through ``ram_live.merge``, interleaved in one process, on the native kernels and on the torch
accumulators (``RAM_LIVE_NATIVE=0`` semantics), float32 and bfloat16 agents, several K.

Run: ``.venv/bin/python benchmarks/bench_shared.py [--entries 16777216] [--ks 3 8] [--reps 5]``; for what an AVX2
machine gets: ``ATEN_CPU_CAPABILITY=avx2 RAM_LIVE_SIMD=avx2 .venv/bin/python benchmarks/bench_shared.py``.
Prints one line per case: best wall seconds of each, and sign / mean.
"""

from __future__ import annotations

import argparse
import time

import torch

from _host import cpu_label
from ram_live import merge
from ram_live.methods.ram import native as ram_native


def inputs(entries: int, k: int, dtype: torch.dtype) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(entries, generator=g)
    agents = {}
    for t in range(k):  # half the entries changed per agent, signs independent: many conflicts
        mask = torch.rand(entries, generator=g) < 0.5
        agents[f"a{t}"] = {"w": (base + torch.randn(entries, generator=g) * 0.01 * mask).to(dtype)}
    return {"w": base.to(dtype)}, agents


def best_of(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1 << 24)
    ap.add_argument("--ks", type=int, nargs="+", default=[3, 8])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    print(f"CPU: {cpu_label()}; {torch.get_num_threads()} torch threads; {args.entries:,} entries per agent")
    for path in ("native", "torch"):
        saved = ram_native._KERNELS
        if path == "torch":
            ram_native._KERNELS = None
        try:
            for dtype in (torch.float32, torch.bfloat16):
                for k in args.ks:
                    base, agents = inputs(args.entries, k, dtype)
                    for method in ("ram", "ram_plus"):
                        times: dict[str, list[float]] = {"mean": [], "sign": []}
                        for _ in range(args.reps):  # interleaved
                            for shared in times:
                                times[shared] += best_of(
                                    lambda s=shared: merge(agents, base=base, method=method, shared=s), 1
                                )
                        mean, sign = min(times["mean"]), min(times["sign"])
                        print(
                            f"{path:6s} {str(dtype)[6:]:8s} K={k} {method:8s}: mean {mean * 1e3:8.1f} ms, "
                            f"sign {sign * 1e3:8.1f} ms, sign / mean {sign / mean:.2f}",
                            flush=True,
                        )
        finally:
            ram_native._KERNELS = saved


if __name__ == "__main__":
    main()
