"""How cheap a task-vector snapshot of a live ~134 M-parameter bf16 model is, and how big.

    python benchmarks/bench_snapshot.py                    # full size (134,236,160 parameters), CPU
    python benchmarks/bench_snapshot.py --quick            # 4.3 M parameters (seconds)
    python benchmarks/bench_snapshot.py --device cuda      # weights and base on the GPU
    python benchmarks/bench_snapshot.py --json out.json    # also write every number as JSON
    python benchmarks/bench_snapshot.py --threads 1        # copy_ and capture on one core (a busy shared machine)
    python benchmarks/bench_snapshot.py --importance-quality  # only: stored importances' effect on a merge
    RAM_LIVE_NATIVE=0 python benchmarks/bench_snapshot.py  # the CPU capture's numpy path, not the native kernel
    RAM_LIVE_SIMD=avx2 python benchmarks/bench_snapshot.py # the native kernel's portable loops built for AVX2

Model: embeddings, one Llama-style block (biased q/k/v), final norm and untied head, bf16 (the shapes of
``benchmarks/bench_merge.py``). The agent differs from the base at a random ``density`` of the entries of every
tensor (3 % and 50 %, plus 0.5 % and 100 % for the encodings' ends), each changed entry by at least one bf16 ULP.

Measured, best of ``--reps`` (each in the same run, same tensors):

* ``copy_``: ``dst.copy_(src)`` over every tensor into a pre-touched destination: one dense copy of the model
  (measured alternately with the capture, best of all runs: the two see the same machine). The load average
  is printed at the start and the end: on a shared machine compare only numbers of the same run.
* capture: :meth:`SnapshotWriter.capture` — the bit-exact diff against the base held on the weights' device,
  the selection of changed values and positions (indices or bitmask) there, and the transfer of only those to the
  CPU. Target: <= 2 x ``copy_``.
* write: safetensors + manifest (temporary names, renames), without and with fsync (``durable``).
* snapshot = capture + write (``durable=False``), the call a training loop makes.
* bytes on disk (data files) vs dense bytes (numel x 2), and the reconstruction of all tensors (read + apply,
  which includes the first-use CRC-32 check of the snapshot's and the base's data files).
* with importances (issue 20, ``--no-importance`` skips it): the same snapshot taken with float32 importances
  (``exp_avg_sq``-like: squares of normal draws, on the weights' device) stored at the active entries as 8-bit
  log codes: capture + write and bytes, each as a ratio to the snapshot without. Target: <= 1.5 x. (Measured
  after the plain rows; the interleaved comparison, float32 and bfloat16 importances, wall and CPU time:
  ``python benchmarks/bench_importance.py --snapshot``.)
* verification: ``store.verify()`` of the base (page cache warm) in GB/s, and the CRC-32 alone over the base's
  bytes in memory, the store's kernel (PCLMULQDQ / VPCLMULQDQ where compiled) and ``zlib.crc32``, 1 thread.
  Target: >= 1 GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ram_live.store.native_select import kernels  # noqa: E402
from ram_live.store import SnapshotStore, fingerprint  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _host import cpu_label  # noqa: E402
from bench_merge import model_specs  # noqa: E402

DENSITIES = (0.005, 0.03, 0.5, 1.0)
TARGET = 2.0


def _capture_label() -> str:
    """The CPU capture's path: the native kernel's loops (AVX-512 or portable, and the build level) or numpy."""
    from ram_live.kernels import cc

    found = kernels()
    if found is None:
        return "numpy"
    return f"native {'avx512 loops' if found.simd_bits == 512 else 'portable loops'} ({cc.build_level()} build)"


def build(size: str, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    base = {}
    for i, (name, shape) in enumerate(model_specs(size)):
        g = torch.Generator().manual_seed(seed * 1000 + i)
        base[name] = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16).to(device)
    return base


def moved(base: dict[str, torch.Tensor], density: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """The agent: base changed at a random ``density`` of every tensor (by >= 1 bf16 ULP: bits always differ)."""
    out = {}
    for i, (name, w) in enumerate(base.items()):
        g = torch.Generator(device=w.device).manual_seed(seed * 7919 + i)
        mask = torch.rand(w.shape, generator=g, device=w.device) < density
        step = w.float().abs().mul(1 / 64).clamp_(min=1e-4)
        out[name] = torch.where(mask, (w.float() + step).to(torch.bfloat16), w)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best(fn, reps: int, device: torch.device) -> float:
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def verification(store: SnapshotStore, base: dict[str, torch.Tensor], reps: int) -> dict:
    """``store.verify()`` of the base in GB/s (best and median of ``reps``), and the CRC-32 alone in memory."""
    import zlib

    from ram_live.store.native_crc import allow_wide, native_crc32
    from ram_live.store.checksum import crc_range

    times = []
    for _ in range(reps):
        fresh = SnapshotStore(store.root, create=False)
        t0 = time.perf_counter()
        report = fresh.verify()
        times.append(time.perf_counter() - t0)
        assert report.ok, report.table()
    nbytes = report.bytes
    flat = torch.cat([t.detach().cpu().reshape(-1).view(torch.uint8) for t in base.values()])
    view = memoryview(flat.numpy()) if flat.numel() else memoryview(b"")
    kernels = {}

    def rate(fn) -> float:
        return len(view) / min(best(fn, 1, torch.device("cpu")) for _ in range(max(3, reps))) / 1e9

    if native_crc32() is not None:
        for wide, name in ((True, "native VPCLMULQDQ"), (False, "native PCLMULQDQ")):
            if allow_wide(wide) == wide:
                kernels[name] = rate(lambda: crc_range([view]))
        allow_wide(True)
    kernels["zlib.crc32"] = rate(lambda: zlib.crc32(view))
    out = {
        "bytes": nbytes,
        "verify_best_s": min(times),
        "verify_median_s": statistics.median(times),
        "verify_gb_s": nbytes / min(times) / 1e9,
        "verify_median_gb_s": nbytes / statistics.median(times) / 1e9,
        "crc32_in_memory_gb_s": kernels,
    }
    print(
        f"verify (store.verify(), base {nbytes / 2**20:.0f} MiB, page cache warm): best {min(times) * 1e3:.0f} ms "
        f"= {out['verify_gb_s']:.2f} GB/s, median {out['verify_median_gb_s']:.2f} GB/s; CRC-32 in memory, 1 thread: "
        + ", ".join(f"{k} {v:.1f} GB/s" for k, v in kernels.items())
    )
    return out


def importance_row(
    writer,
    agent: dict[str, torch.Tensor],
    plain_captures: list[float],
    plain_write: float,
    plain_bytes: int,
    reps: int,
    device: torch.device,
    step: int,
) -> dict:
    """The snapshot of ``agent`` with importances: best capture and write of ``reps``, ratios to the plain one."""
    g = torch.Generator(device=device).manual_seed(5)
    imp = {k: torch.randn(v.shape, generator=g, device=device).square_() * 1e-6 for k, v in agent.items()}
    captures, writes, snap = [], [], None
    for i in range(reps):
        captures.append(best(lambda out=[]: out.append(writer.capture(agent, importance=imp)), 1, device))
        cap = writer.capture(agent, importance=imp) if i == 0 else cap  # noqa: F821 - set on the first round
        t0 = time.perf_counter()
        snap = writer.write(cap, step + i + 1)
        writes.append(time.perf_counter() - t0)
    assert snap is not None and snap.importance is not None
    capture_s, write_s = min(captures), min(writes)
    plain = min(plain_captures) + plain_write
    return {
        "capture_s": capture_s,
        "write_s": write_s,
        "snapshot_s": capture_s + write_s,
        "snapshot_x_plain": (capture_s + write_s) / plain,
        "bytes": snap.bytes,
        "bytes_x_plain": snap.bytes / plain_bytes,
    }


def importance_quality(seed: int = 0) -> dict:
    """The stored importance codes' effect on a merge: three small MLPs trained with AdamW on different targets,
    curvature-aware RAM with float32 importances (the reference), with the store's codes and with bf16; the
    largest change of the merged values, relative to the largest |τ*| of the reference."""
    from torch import nn

    from ram_live import adam_importance, merge

    torch.manual_seed(seed)

    def net() -> nn.Module:
        return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))

    base = {k: v.detach().clone() for k, v in net().state_dict().items()}
    store = SnapshotStore(Path(tempfile.mkdtemp(prefix="ram-bench-imp-")) / "s")
    agents, imps = {}, {}
    for i in range(3):
        m = net()
        m.load_state_dict(base)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x, y = torch.randn(256, 32), torch.randn(256, 8) + i
        for _ in range(200):
            opt.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            opt.step()
        agents[f"a{i}"] = {k: v.detach().clone() for k, v in m.state_dict().items()}
        imps[f"a{i}"] = adam_importance(opt, m)
        store.writer(f"a{i}", base=base).snapshot(m, step=200, importance=imps[f"a{i}"])
    ref = merge(agents, base=base, importance=imps)
    tau = max(float((ref[k] - base[k]).abs().max()) for k in ref)
    rows = {
        "store codes": merge(store.latest_all()),
        "bf16 importances": merge(
            agents, base=base, importance={a: {k: v.bfloat16() for k, v in d.items()} for a, d in imps.items()}
        ),
        "plain RAM (scale)": merge(agents, base=base),
    }
    out = {name: max(float((m[k] - ref[k]).abs().max()) for k in ref) / tau for name, m in rows.items()}
    for name, v in out.items():
        print(f"{name:>18}: max |merged - merged with float32 importances| / max |tau*| = {v:.2e}")
    shutil.rmtree(store.root.parent, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--densities", type=float, nargs="*", default=list(DENSITIES))
    p.add_argument("--dir", help="store folder (default: a temporary folder, removed at the end)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (copy_ and the CPU capture use as many)")
    p.add_argument("--json")
    p.add_argument("--no-importance", action="store_true", help="skip the rows with importances")
    p.add_argument("--importance-quality", action="store_true", help="only the stored importances' merge effect")
    a = p.parse_args()
    if a.importance_quality:
        importance_quality()
        return
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    size = "quick" if a.quick else "full"
    base = build(size, device)
    numel = sum(t.numel() for t in base.values())
    dense_bytes = numel * 2
    tmp = Path(a.dir or tempfile.mkdtemp(prefix="ram-bench-snap-"))
    results: dict = {
        "size": size,
        "parameters": numel,
        "dense_bytes": dense_bytes,
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_label(),
        "load_avg": os.getloadavg()[0],
        "densities": {},
        "cpu_capture": _capture_label(),
    }
    print(
        f"model: {numel:,} bf16 parameters ({dense_bytes / 2**20:.0f} MiB dense), device {device}, "
        f"CPU {cpu_label()}, "
        f"{torch.get_num_threads()} threads, load {results['load_avg']:.1f}, CPU capture: {results['cpu_capture']}"
    )

    dst = {k: v.clone() for k, v in base.items()}  # pre-touched destination

    def copy_all(dst: dict[str, torch.Tensor] = dst) -> None:
        for k, v in base.items():
            dst[k].copy_(v)

    t_copy = best(copy_all, a.reps + 2, device)
    results["copy_s"] = t_copy
    print(f"copy_ of the model: {t_copy * 1e3:.1f} ms ({2 * dense_bytes / t_copy / 1e9:.1f} GB/s read+write)")
    t0 = time.perf_counter()
    fingerprint(base)
    sync(device)
    results["fingerprint_s"] = time.perf_counter() - t0
    store = SnapshotStore(tmp / "store", durable=False)
    t0 = time.perf_counter()
    writer = store.writer("agent", base, clone_base=False)
    results["writer_setup_s"] = time.perf_counter() - t0  # fingerprint + writing the base once
    del dst
    print(
        f"writer set-up (fingerprint {results['fingerprint_s']:.2f} s + base written once): "
        f"{results['writer_setup_s']:.2f} s"
    )
    if hasattr(store, "verify"):  # the store checks checksums (issue 16)
        results["verify"] = verification(store, base, a.reps)
    head = (
        f"{'density':>8} {'capture':>9} {'x copy_':>8} {'write':>8} {'w med':>8} {'fsync':>8} {'f med':>8} "
        f"{'snapshot':>9} {'x copy_':>8} "
        f"{'MiB':>8} {'x dense':>8} {'rebuild':>8}"
    )
    print(head)
    print("-" * len(head))
    step = 0
    for density in a.densities:
        agent = moved(base, density)
        sync(device)
        captures = []
        # copy_ and capture alternate, so that both see the same machine (other jobs come and go)
        copies, capture_times = [], []
        for _ in range(a.reps):
            copies.append(best(copy_all, 1, device))
            capture_times.append(best(lambda agent=agent, out=captures: out.append(writer.capture(agent)), 1, device))
            del captures[:-1]
        t_capture, t_copy = min(capture_times), min(copies + [results["copy_s"]])
        capture = captures[-1]
        writes, durable_writes = [], []
        snap = None
        for _ in range(a.reps):
            step += 1
            t0 = time.perf_counter()
            snap = writer.write(capture, step)
            writes.append(time.perf_counter() - t0)
        store.durable = True
        for _ in range(max(1, a.reps - 1)):
            step += 1
            t0 = time.perf_counter()
            writer.write(capture, step)
            durable_writes.append(time.perf_counter() - t0)
        store.durable = False
        assert snap is not None
        t_write, t_fsync = min(writes), min(durable_writes)
        med_write, med_fsync = statistics.median(writes), statistics.median(durable_writes)
        encodings: dict[str, int] = {}
        for entry in snap.manifest["tensors"].values():
            for piece in entry["pieces"]:
                encodings[piece["encoding"]] = encodings.get(piece["encoding"], 0) + 1
        t0 = time.perf_counter()
        rebuilt = {k: snap.get(k) for k in agent}
        t_rebuild = time.perf_counter() - t0
        exact = all(torch.equal(rebuilt[k].view(torch.int16), agent[k].cpu().view(torch.int16)) for k in agent)
        snapshot_s = t_capture + t_write
        row = {
            "copy_s": t_copy,
            "capture_s": t_capture,
            "capture_x_copy": t_capture / t_copy,
            "write_s": t_write,
            "write_fsync_s": t_fsync,
            "write_median_s": med_write,
            "write_fsync_median_s": med_fsync,
            "writes_s": writes,
            "writes_fsync_s": durable_writes,
            "snapshot_s": snapshot_s,
            "snapshot_x_copy": snapshot_s / t_copy,
            "bytes": snap.bytes,
            "bytes_x_dense": snap.bytes / dense_bytes,
            "changed": snap.changed,
            "captured_bytes": capture.nbytes,
            "rebuild_s": t_rebuild,
            "bit_exact": exact,
            "encodings": encodings,
            "capture_pass": t_capture / t_copy <= TARGET,
        }
        if not a.no_importance:
            row["importance"] = importance_row(writer, agent, capture_times, t_write, snap.bytes, a.reps, device, step)
            step += a.reps
        results["densities"][str(density)] = row
        print(
            f"{density:>8.1%} {t_capture * 1e3:>7.0f}ms {row['capture_x_copy']:>7.2f}x {t_write * 1e3:>6.1f}ms "
            f"{med_write * 1e3:>6.1f}ms "
            f"{t_fsync * 1e3:>6.0f}ms {med_fsync * 1e3:>6.0f}ms {snapshot_s * 1e3:>7.0f}ms "
            f"{row['snapshot_x_copy']:>7.2f}x "
            f"{snap.bytes / 2**20:>8.1f} {row['bytes_x_dense']:>8.3f} {t_rebuild * 1e3:>6.0f}ms"
            f"  {'exact' if exact else 'NOT EXACT'} {encodings}"
        )
        if "importance" in row:
            r = row["importance"]
            print(
                f"{'+ imp':>8} {r['capture_s'] * 1e3:>7.0f}ms {'':>8} {r['write_s'] * 1e3:>6.1f}ms {'':>8} {'':>8} "
                f"{'':>8} {r['snapshot_s'] * 1e3:>7.0f}ms {r['snapshot_x_plain']:>7.2f}x {r['bytes'] / 2**20:>8.1f} "
                f"{r['bytes_x_plain']:>7.3f}x  (x: vs the snapshot without importances)"
            )
        del agent, rebuilt, capture, snap, captures
        store.prune(0, "agent")
    if not a.no_importance:
        print(
            "target: a snapshot with importances <= 1.5x one without: "
            + ", ".join(
                f"{d}: time {r['importance']['snapshot_x_plain']:.2f}x, bytes {r['importance']['bytes_x_plain']:.2f}x"
                for d, r in results["densities"].items()
            )
        )
    print(
        f"target: capture <= {TARGET:.0f}x copy_: "
        + ", ".join(
            f"{d}: {'PASS' if r['capture_pass'] else 'FAIL'} ({r['capture_x_copy']:.2f}x)"
            for d, r in results["densities"].items()
        )
    )
    results["load_avg_end"] = os.getloadavg()[0]
    print(f"load average at the end: {results['load_avg_end']:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if not a.dir:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
