"""What curvature-aware RAM costs: ``merge(..., importance=...)`` against plain RAM of the same models.

    python benchmarks/bench_importance.py                 # ~67 M bf16 parameters, K = 2 and 3, 10 pairs each
    python benchmarks/bench_importance.py --reps 3 --size quick --json out.json
    python benchmarks/bench_importance.py --snapshot --size quick   # a snapshot with importances vs without
    python benchmarks/bench_importance.py --from-store --size quick # merge(store.latest_all()): with vs without
    RAM_LIVE_SIMD=avx2 python benchmarks/bench_importance.py ...    # the AVX2 build on an AVX-512 host

Inputs: bench_merge's bf16 base and agents (same seeds, densities 3 %, 46 %, 54 %), shaped like one Llama-style
block plus embeddings and head at hidden 3072 (67.6 M parameters), and per agent one importance tensor per
parameter (random positive, float32 as Adam's ``exp_avg_sq`` is kept, and bfloat16; ``--imp-dtype`` picks).
Each row: 2 x ``--reps`` interleaved pairs (plain, with importances; order alternating, outputs freed, heap
trimmed; no idle wait), best-of and median of each, the median over the pairs of with / plain, and the ratio of
the best process CPU times (all threads: the steadier figure on a shared machine). Target: <= 1.5 x. RAM+ rows:
the plain RAM+ reads the inputs once into memory; with importances it takes two passes (counts, then the
weighted merge). First, the native kernels alone on one thread against the copy floor (``copy_`` of as many
bytes as the plain merge moves), each with its bytes per entry: plain 2K + 4 (base, K agents, output in bf16),
float32 importances + 4K, bfloat16 + 2K.

``--snapshot``: ``writer.snapshot`` (capture + write, not durable) of an agent of 4.3 M (``--size quick``) or
134 M bf16 parameters with importances (float32 and bfloat16) against the same snapshot without, interleaved,
at several densities. ``--from-store``: ``merge(store.latest_all())`` of K snapshots that carry importances
(the store's 8-bit codes, read back as bfloat16, the default, and as float32) against the same snapshots
without, interleaved. Target of both: <= 1.5 x. ``RAM_LIVE_SIMD=avx2`` measures the AVX2 build on an AVX-512
host; the heading names the CPU and the level the kernels were built for.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
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


def kernel_times(k: int, numel: int, reps: int) -> dict[str, dict[str, float]]:
    """Best-of-``reps`` seconds (wall and the thread's CPU) of one thread's native kernel call over ``numel`` bf16
    entries per input: the plain RAM merge, the weighted one with float32 and with bfloat16 importances, and the
    copy floor (``copy_`` of as many bytes as the plain merge reads and writes); calls interleaved, so that other
    processes' load falls on all alike. Also the bytes each moves per entry."""
    import ram_live.methods.ram.native_weighted as wnative
    import ram_live.methods.ram.native as native

    g = torch.Generator().manual_seed(3)
    base = torch.randn(numel, generator=g).to(torch.bfloat16)
    agents = [torch.where(torch.rand(numel, generator=g) < d, base + 0.01, base) for d in bm.DENSITIES[:k]]
    imps32 = [torch.rand(numel, generator=g) for _ in range(k)]
    imps16 = [h.to(torch.bfloat16) for h in imps32]
    out = torch.zeros(numel, dtype=torch.bfloat16)
    src = torch.zeros((k + 2) * numel // 2, dtype=torch.bfloat16)  # copy_: reads and writes (2K + 4) bytes/entry
    dst = torch.zeros_like(src)
    plain, weighted = native.kernels(), wnative.kernels()
    calls = {
        "plain": (lambda: plain.merge(out, base, agents, None, 1e-5, 0, numel), 2 * k + 4),
        "importance float32": (
            lambda: weighted.merge_weighted(out, base, agents, imps32, None, 1e-5, 0, numel),
            6 * k + 4,
        ),
        "importance bfloat16": (
            lambda: weighted.merge_weighted(out, base, agents, imps16, None, 1e-5, 0, numel),
            4 * k + 4,
        ),
        "copy_ floor": (lambda: dst.copy_(src), 2 * k + 4),
    }
    best = {name: {"wall": float("inf"), "cpu": float("inf"), "bytes_per_entry": b} for name, (_, b) in calls.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(reps):
            for name, (call, _) in calls.items():
                c0, t0 = time.thread_time(), time.perf_counter()
                call()
                t1, c1 = time.perf_counter(), time.thread_time()
                best[name]["wall"] = min(best[name]["wall"], t1 - t0)
                best[name]["cpu"] = min(best[name]["cpu"], c1 - c0)
    finally:
        torch.set_num_threads(threads)
    return best


def _level() -> str:
    from ram_live.kernels import cc

    return cc.build_level() if cc.native_enabled() else "off (RAM_LIVE_NATIVE=0)"


def interleaved(first, second, reps: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """``reps`` pairs of calls, the order alternating, each on a collected, trimmed heap (no idle wait: a snapshot
    takes milliseconds); returns both series of wall seconds, then both of process CPU seconds (all threads: on
    a shared machine the steadier measure of the work done)."""
    a: list[float] = []
    b: list[float] = []
    ca: list[float] = []
    cb: list[float] = []
    for i in range(reps):
        for fn, times, cpu in ((first, a, ca), (second, b, cb)) if i % 2 == 0 else ((second, b, cb), (first, a, ca)):
            gc.collect()
            bm.malloc_trim()
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return a, b, ca, cb


def _ratio_row(
    a: list[float], b: list[float], ca: list[float] | None = None, cb: list[float] | None = None, **fields
) -> dict:
    row = dict(
        fields,
        plain_best=min(a),
        plain_median=statistics.median(a),
        with_best=min(b),
        with_median=statistics.median(b),
        ratio_best=min(b) / min(a),
        ratio_median=statistics.median([y / x for x, y in zip(a, b)]),
    )
    if ca and cb:
        row.update(plain_cpu_best=min(ca), with_cpu_best=min(cb), cpu_ratio_best=min(cb) / min(ca))
    return row


def _print_ratio(label: str, row: dict) -> None:
    cpu = f", CPU time {row['cpu_ratio_best']:.2f} x" if "cpu_ratio_best" in row else ""
    print(
        f"{label}: without best {row['plain_best'] * 1e3:.1f} ms median {row['plain_median'] * 1e3:.1f} ms | "
        f"with best {row['with_best'] * 1e3:.1f} ms median {row['with_median'] * 1e3:.1f} ms | ratio of bests "
        f"{row['ratio_best']:.2f} x, median of pairs {row['ratio_median']:.2f} x{cpu} "
        f"[{'PASS' if row['ratio_best'] <= 1.5 else 'FAIL'} <= 1.5 x]",
        flush=True,
    )


def snapshot_rows(args: argparse.Namespace) -> list[dict]:
    """``writer.snapshot`` with importances (float32, bfloat16) vs without, interleaved, per density."""
    import shutil
    import tempfile

    import bench_snapshot as bs

    from ram_live.store import SnapshotStore

    if args.torch_encoder:
        import ram_live.store.importance_codes as stored

        stored._encode_native = lambda flat, enc: None  # encode_active then takes encode_active_torch
    size = "quick" if args.size in ("quick", "tiny") else "full"
    base = bs.build(size, torch.device("cpu"))
    numel = sum(t.numel() for t in base.values())
    print(
        f"CPU: {cpu_label()}, kernels built for {_level()}, importance codes by the "
        f"{'torch' if args.torch_encoder else 'native'} encoder, {torch.get_num_threads()} torch threads; git "
        f"{bm.git_state()}; load {bm.loadavg()}; snapshot of {numel / 1e6:.1f} M bf16 parameters, "
        f"{2 * args.reps} interleaved pairs",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="ram-bench-imp-"))
    rows = []
    try:
        store = SnapshotStore(tmp / "store", durable=False)
        writer = store.writer("agent", base, clone_base=False)
        step = [0]

        def snap(agent, imp=None) -> None:
            step[0] += 1
            writer.snapshot(agent, step[0], importance=imp)

        for density in args.densities:
            agent = bs.moved(base, density)
            g = torch.Generator().manual_seed(5)
            imp32 = {k: torch.randn(v.shape, generator=g).square_() * 1e-6 for k, v in agent.items()}
            for dtype in ("float32", "bfloat16"):
                imp = imp32 if dtype == "float32" else {k: v.bfloat16() for k, v in imp32.items()}
                snap(agent), snap(agent, imp)  # warm
                a, b, ca, cb = interleaved(lambda: snap(agent), lambda: snap(agent, imp), 2 * args.reps)
                row = _ratio_row(a, b, ca, cb, density=density, imp_dtype=dtype, params=numel, level=_level())
                rows.append(row)
                _print_ratio(f"density {density:6.1%} importances {dtype:8s}", row)
                store.prune(0, "agent")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load at the end {bm.loadavg()}")
    return rows


def store_rows(args: argparse.Namespace) -> list[dict]:
    """``merge(store.latest_all(), importance="stored")`` (every agent's) vs the same snapshots without."""
    import shutil
    import tempfile

    import ram_live
    from ram_live.store import SnapshotStore
    from ram_live.store.importance_codes import ImportanceSource

    print(
        f"CPU: {cpu_label()}, kernels built for {_level()}, {torch.get_num_threads()} torch threads; git "
        f"{bm.git_state()}; load {bm.loadavg()}; {2 * args.reps} interleaved pairs",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="ram-bench-imp-store-"))
    rows = []
    try:
        for k in args.ks:
            base, agents = bm.build_inputs(args.size, k)
            imps = importances(base, k, torch.float32)
            stores = {w: SnapshotStore(tmp / f"{w}-{k}", durable=False) for w in ("plain", "with")}
            for i, agent in enumerate(agents):
                for w, st in stores.items():
                    st.writer(f"a{i}", base).snapshot(agent, 1, importance=imps[i] if w == "with" else None)
            del agents, imps
            plain_snaps, with_snaps = (stores[w].latest_all() for w in ("plain", "with"))
            _, info = ram_live.merge(with_snaps, return_info=True, importance="stored")
            assert info.extra.get("importance") == "stored", info.extra
            print(f"K={k}: merge with stored importances: kernels {info.extra.get('kernels')}", flush=True)
            params = sum(v.numel() for v in base.values())
            for variant in args.variants:
                for dtype in (torch.bfloat16, torch.float32):  # how the stored importances are read
                    sources = {n: ImportanceSource(s, dtype) for n, s in with_snaps.items()}
                    a, b, ca, cb = interleaved(
                        lambda p=plain_snaps, v=variant: ram_live.merge(p, method=v),
                        lambda w=with_snaps, v=variant, s=sources: ram_live.merge(w, method=v, importance=s),
                        2 * args.reps,
                    )
                    row = _ratio_row(
                        a,
                        b,
                        ca,
                        cb,
                        k=k,
                        variant=variant,
                        params=params,
                        level=_level(),
                        read_as=str(dtype).removeprefix("torch."),
                    )
                    rows.append(row)
                    _print_ratio(
                        f"K={k} {variant:9s} {params / 1e6:.1f} M from the store, importances read as "
                        f"{row['read_as']:8s}",
                        row,
                    )
            del base, plain_snaps, with_snaps, stores
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mid", choices=sorted(bm.SIZES))
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--imp-dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--variants", nargs="+", default=["ram", "ram_plus"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--snapshot", action="store_true", help="only: a snapshot with importances vs without")
    parser.add_argument(
        "--from-store", action="store_true", help="only: merge(store.latest_all()) with vs without stored importances"
    )
    parser.add_argument("--densities", type=float, nargs="+", default=[0.005, 0.03, 0.5, 1.0])
    parser.add_argument(
        "--torch-encoder",
        action="store_true",
        help="--snapshot with the importance codes' torch "
        "path (the native encoder off, every other kernel on): the reference it replaced",
    )
    args = parser.parse_args(argv)
    if args.snapshot or args.from_store:
        rows = snapshot_rows(args) if args.snapshot else store_rows(args)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    import ram_live

    print(
        f"CPU: {cpu_label()}, kernels built for {_level()}, {torch.get_num_threads()} torch threads; git "
        f"{bm.git_state()}; load {bm.loadavg()}"
    )
    rows: list[dict] = []
    for k in args.ks:
        best = kernel_times(k, 1 << 23, 3 * args.reps)
        rows.append(dict(k=k, kernel=best))
        print(
            f"kernel alone, K={k}, 8.4 M bf16 entries per input, one thread, best of {3 * args.reps} (wall): "
            + ", ".join(
                f"{name} {v['wall'] * 1e3:.1f} ms = {v['bytes_per_entry'] * (1 << 23) / v['wall'] / 1e9:.1f}"
                f" GB/s ({v['wall'] / best['plain']['wall']:.2f} x plain; bytes "
                f"{v['bytes_per_entry'] / (2 * k + 4):.2f} x)"
                for name, v in best.items()
            ),
            flush=True,
        )
    tiny_base, tiny_agents = bm.build_inputs("tiny", 2)
    ram_live.merge(tiny_agents, base=tiny_base, importance=importances(tiny_base, 2, torch.float32))  # builds
    for k in args.ks:
        base, agents = bm.build_inputs(args.size, k)
        params = sum(v.numel() for v in base.values())
        for imp_name in args.imp_dtype:
            imps = importances(base, k, getattr(torch, imp_name))
            for variant in args.variants:
                info: dict = {}

                def plain(agents: list = agents, base: dict = base, variant: str = variant) -> object:
                    return ram_live.merge(agents, base=base, method=variant)

                def weighted(
                    agents: list = agents, base: dict = base, variant: str = variant, imps: list = imps
                ) -> object:
                    out, info["w"] = ram_live.merge(
                        agents, base=base, method=variant, importance=imps, return_info=True
                    )
                    return out

                a, b, ca, cb = interleaved(plain, weighted, 2 * args.reps)
                row = _ratio_row(
                    a,
                    b,
                    ca,
                    cb,
                    k=k,
                    variant=variant,
                    params=params,
                    imp_dtype=imp_name,
                    kernels=info["w"].extra.get("kernels"),
                )
                rows.append(row)
                _print_ratio(
                    f"K={k} {variant:9s} {params / 1e6:.1f} M importances {imp_name:8s} kernels {row['kernels']}", row
                )
            del imps
        del base, agents
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
