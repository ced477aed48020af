"""The CPU's native RAM kernel against the copy floor, apart from the engine: what bounds a merge on this CPU.

    python benchmarks/bench_ram_kernel.py              # K = 3, 64 M bf16 entries, the merge's worker count
    python benchmarks/bench_ram_kernel.py --k 5 --entries 32

Three figures, each the best of ``--reps``, each against the floor of the same run (``(K + 2)`` x entries x 2 bytes
at ``dst.copy_(src)``'s bandwidth into a pre-touched destination, with the same threads):

* compute: the kernel over inputs that fit in the caches (64 Ki entries, repeated), one thread, in ns per entry;
  the floor per entry with all threads beside it (a kernel slower than that cannot reach the floor);
* kernel: the whole range split over the threads into a pre-touched output (the kernel's own memory-bound time);
* fresh: the same into a new output (allocation and first-touch page faults, as a merge returning a state dict).
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from _host import cpu_label, merge_workers
from ram_live.methods.ram.native import kernels

DENSITIES = (0.03, 0.46, 0.54, 0.10, 0.25, 0.35, 0.60, 0.05)


def inputs(n: int, k: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(n, generator=g).to(torch.bfloat16)
    agents = [(base.float() + (torch.rand(n, generator=g) < d) * 0.01).to(torch.bfloat16) for d in DENSITIES[:k]]
    return base, agents


def best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def copy_bandwidth(t: torch.Tensor, reps: int) -> float:
    """Bytes read and written per second by ``dst.copy_(src)`` of twice ``t`` into a pre-touched ``dst``."""
    src = torch.cat([t, t])
    dst = torch.zeros_like(src)
    return 2 * src.numel() * src.element_size() / best(lambda: dst.copy_(src), reps)


def split_merge(kern, out, base, agents, threads: int) -> None:
    n = base.numel()
    cuts = [n * i // threads // 64 * 64 for i in range(threads)] + [n]
    workers = [
        threading.Thread(target=kern.merge, args=(out, base, agents, None, 1e-5, cuts[i], cuts[i + 1]))
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=3, choices=range(1, len(DENSITIES) + 1), help="agents (1-8)")
    parser.add_argument("--entries", type=int, default=64, help="entries per input, in Mi (default 64)")
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    kern = kernels()
    if kern is None:
        raise SystemExit("no native kernels here (no C compiler, or RAM_LIVE_NATIVE=0)")
    threads = merge_workers()
    torch.set_num_threads(threads)
    k, n = args.k, args.entries << 20

    small_base, small_agents = inputs(1 << 16, k)
    small_out = torch.zeros_like(small_base)
    loops = 256
    per_entry = best(
        lambda: [kern.merge(small_out, small_base, small_agents, None, 1e-5, 0, 1 << 16) for _ in range(loops)],
        args.reps,
    ) / (loops << 16)

    base, agents = inputs(n, k)
    bandwidth = copy_bandwidth(base, args.reps)
    floor = (k + 2) * n * 2 / bandwidth
    out = torch.zeros_like(base)
    kernel = best(lambda: split_merge(kern, out, base, agents, threads), args.reps)
    fresh = best(lambda: split_merge(kern, torch.empty_like(base), base, agents, threads), args.reps)

    print(f"# native RAM kernel, {cpu_label()}, {threads} threads, K = {k}, {args.entries} Mi bf16 entries")
    print(f"copy_ {bandwidth / 1e9:.1f} GB/s: floor {floor * 1e3:.1f} ms, {floor / n * 1e9:.3f} ns per entry")
    print(
        f"compute, in cache, 1 thread: {per_entry * 1e9:.3f} ns per entry; with {threads} threads at best "
        f"{per_entry / threads / (floor / n):.2f} x the floor"
    )
    print(f"kernel, pre-touched output: {kernel * 1e3:.1f} ms ({kernel / floor:.2f} x the floor)")
    print(f"fresh output (alloc + first touch + kernel): {fresh * 1e3:.1f} ms ({fresh / floor:.2f} x the floor)")


if __name__ == "__main__":
    main()
