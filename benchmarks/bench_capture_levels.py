"""The snapshot capture's selection at each native build level against the numpy path: ns per entry, one thread.

    python benchmarks/bench_capture_levels.py     # 16 M entries, bf16 and float32, 0.5 %, 3 %, 50 %, 100 % changed

Each level's kernel (``ram_live.store.native_select.build`` with that level's flags: AVX-512 where the host has it,
AVX2, the generic loops) and numpy encode the same pair, interleaved, best of 5 (docs/store.md).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ram_live.store.native_select as select_module
from _host import cpu_label
from ram_live.kernels import cc
from ram_live.store.encoding import _encode_native, _encode_numpy

N = 1 << 24
DENSITIES = (0.005, 0.03, 0.5, 1.0)
REPS = 5


def main() -> None:
    torch.set_num_threads(1)
    host = cc.host_level()
    levels = [
        lv for lv in ("avx512", "avx2", "scalar") if lv == host or lv == "scalar" or (lv == "avx2" and host == "avx512")
    ]
    builds = {lv: select_module.build(cc.flags(lv)) for lv in levels}
    print(
        f"CPU {cpu_label()}, load {os.getloadavg()[0]:.1f}, builds "
        + ", ".join(f"{lv}: {'none' if k is None else k.simd_bits}" for lv, k in builds.items())
    )
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        base = torch.rand(N, generator=g).to(dtype)
        for density in DENSITIES:
            cur = base.clone()
            ints = cur.view(torch.int16 if cur.element_size() == 2 else torch.int32)
            ints[torch.rand(N, generator=g) < density] ^= 1
            best: dict[str, float] = {}
            for _ in range(REPS):
                for name, kernels in [*builds.items(), ("numpy", None)]:
                    start = time.perf_counter()
                    if kernels is None:
                        _encode_numpy(np, cur, base)
                    else:
                        _encode_native(np, kernels, cur, base, split=False)
                    best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
            print(
                f"{str(dtype):15} {density:6}: "
                + "  ".join(f"{name} {t / N * 1e9:.3f}" for name, t in best.items())
                + "  ns/entry"
            )
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
