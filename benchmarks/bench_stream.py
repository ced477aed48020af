#!/usr/bin/env python
"""Streaming-from-disk benchmark (issue 7, item 1): RAM / RAM+ on sharded Hugging Face folders, against the
parallel read-and-write floor and ``mergekit-yaml``'s ``ram``, with peak resident memory and time, cold and warm.

    bash scripts/bench_stream.sh                 # ~2 GB bf16 Llama (~1 B parameters), 3 agents, + mergekit
    bash scripts/bench_stream.sh --quick         # ~117 MB model, no mergekit, ~1–2 min
    bash scripts/bench_stream.sh --json out.json --keep --workdir /tmp/somewhere

What it does
------------
1. **Inputs** (a child process, not timed). The keys and shapes come from ``LlamaForCausalLM(LlamaConfig(...))``
   built on the meta device (nothing is allocated); the base's tensors are drawn directly, seeded per key
   (weights N(0, 0.02²), norms 1 + N(0, 0.02²)), and written **tensor by tensor** as Hugging Face folders: shards of
   at most ``--shard-bytes`` (default 10⁹ bytes, i.e. ``save_pretrained(max_shard_size="1GB")``), each shard's
   header first and its tensors sorted by name inside it (as ``safetensors`` does), a
   ``model.safetensors.index.json`` with a sorted ``weight_map`` and ``config.json``. Three agents change 3 %,
   46 % and 54 % of the entries (independent masks, so ~25 % of entries are shared by two or more agents) by
   ±(2 … 6) % of max(|w|, 0.02): at least 2.5 bf16 steps, so every drawn change survives bf16 and is > ε = 1e-5;
   every other entry keeps the base's exact bits. Only one tensor of each of the 4 models is in memory at a time.
   Files are fsync'ed and evicted from the page cache.
2. **Measurements**, each in a fresh child process, each run twice: *cold* (the input files are first evicted
   from the page cache with ``posix_fadvise(DONTNEED)`` — only this benchmark's files, the machine is shared;
   ``--cold drop_caches`` uses ``echo 3 > /proc/sys/vm/drop_caches`` instead: root only, and it empties the
   whole machine's page cache; it falls back to fadvise where the write fails) and then *warm* (right after: the
   inputs are in the page cache if memory allows). The share of the input bytes resident in the page cache before
   each run is measured (``fincore``) and printed.

   * the **floor**: the merge's I/O without its arithmetic, with the merge's threads (``merge_workers()`` of
     ``benchmarks/_host.py``: ram_live's ``default_workers``, N). Every input tensor's bytes (base + K agents) are
     read once and one output of the base's layout (sharded safetensors, header first) is written, in work items
     of 512 KiB (the merge's native chunk of bf16 entries) that N threads take from a shared counter, with no
     barrier between tensors; each thread reads its item's range of all K + 1 inputs into its own buffer and
     writes the last one. Two I/O paths, each its own row: ``floor (pread/pwrite ×N)`` (``os.preadv`` into the
     buffer, each thread with its own descriptors, ``os.pwrite`` into a ``posix_fallocate``'d file) and
     ``floor (mmap ×N)`` (ram_live's path: copy-on-write maps of the inputs, the output fallocated and mapped
     writable, numpy copies that release the GIL, pages released with ``MADV_DONTNEED`` and the output msync'ed
     in the call). **The floor of a cache
     state is the fastest of these runs** (+fsync): a merge reads every input byte and writes every output byte
     with no more threads, so none can beat it beyond run-to-run noise (the floor check under the table says
     whether one did). Both run again last (``#2``), to bracket order effects.
   * ``single-thread copy + write: not a floor``: the floor of issue 7, kept for comparison (one thread memcpys
     each tensor out of the mmap into one buffer, then ``write()``; RAM beat it, 0.86 × cold). Not with
     ``--no-single-thread``.
   * ``ram_live RAM`` / ``ram_live RAM+``: ``ram_live.merge([agent folders], base=base folder, out=folder,
     method="ram" | "ram_plus", max_shard_bytes=--shard-bytes)``; RAM+ is two passes (global ρ).
   * ``mergekit ram``: ``mergekit-yaml`` (0.1.5, from ``benchmarks/.venv-mergekit``, built by
     ``benchmarks/mergekit_env.sh``) with ``merge_method: ram``, ``base_model:`` the base folder, ``models:`` the
     agents, ``dtype: bfloat16``, options ``--lazy-unpickle --no-copy-tokenizer --no-write-model-card
     --out-shard-size <shard bytes>`` (mergekit's shard size is counted in bytes, despite its help text), on CPU,
     ``HF_HUB_OFFLINE=1``. It computes in bf16 (see ``benchmarks/mergekit_ram_worker.py``), so its result differs
     from ram_live's float32 RAM in a few bf16 steps; the verification step reports by how much.

   **Seconds**: ``call`` is the merge call (or the floor's loop), timed inside the child after its imports;
   ``+fsync`` adds fsync of every output file (ram_live's writer and the mmap floor already ``msync`` their
   shards in the call, mergekit and the other floors do not: ``+fsync`` is the comparable figure and the one the
   time target uses, each run against the floor of the same cache state). **Peak RSS** is the child's ``VmHWM``
   (the kernel's high-water mark of resident memory, ``ru_maxrss`` of that process image; imports included);
   ``base`` is VmRSS after the imports. A thread of the parent reads the child's ``/proc/PID/status`` (VmRSS,
   RssAnon, RssFile) every 10 ms for the curves (``--json`` holds them; the output shows a summary and a
   sparkline). ``others' CPU`` is the machine's busy CPU time during the run minus the child's own, over
   (wall × cores): other users' load.
3. **Verification** (a child, after the timings, on the warm outputs): the RAM and RAM+ outputs load with
   ``LlamaForCausalLM.from_pretrained`` and give finite logits; on a few tensors, the RAM output equals
   ``merge`` of the same tensors in memory, and both RAM and RAM+ equal a by-hand float32 evaluation of
   Eq. 7 (λ_t of RAM+ from the run's ``MergeInfo``); mergekit's output is compared with ram_live's RAM.
4. **Targets**: peak RSS ≤ 4 × the largest tensor + 500 MB; seconds (``+fsync``) ≤ 1.5 × the floor of the same
   cache state, for RAM (RAM+ reported against the same bound). Every heading names the CPU (``cpu_label()``:
   model name and AVX-512 / AVX2) and N.

Before each timed run the benchmark waits until the 1-minute load average is below ``--max-load`` (1.5), polling
every 30 s, for at most ``--max-wait`` seconds in all (900; 0 with ``--quick``); runs that started above it are
flagged. Everything lives in one work folder under /tmp (~5.5 × the model size), deleted at the end unless
``--keep``. MB = 10⁶ bytes throughout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from _host import cpu_label, merge_workers

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MERGEKIT_VENV = HERE / ".venv-mergekit"
MB = 1e6
DENSITIES = (0.03, 0.46, 0.54)
SEED = 1234
CHUNK = 1 << 20  # elements per generation step
SINGLE_THREAD = "single-thread copy + write: not a floor"

# ~1.0 B parameters, 2.0 GB in bf16: TinyLlama's widths with 16 layers of full multi-head attention.
FULL = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "max_position_embeddings": 2048,
}
# ~58 M parameters, 117 MB.
QUICK = {
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "max_position_embeddings": 512,
}


# ============================================================================================ small helpers


def fmt_mb(x: float | None) -> str:
    return "—" if x is None else f"{x / MB:,.0f} MB"


def loadavg() -> float:
    return os.getloadavg()[0]


def cpu_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = [int(x) for x in fields]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem of a process, in bytes."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[name] = int(rest.split()[0]) * 1024
    return out


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def fsync_tree(folder: Path) -> None:
    for p in files_of(folder):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(paths: list[Path]) -> None:
    """Drop these files' clean pages from the page cache (dirty ones are written first)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: list[Path]) -> int | None:
    """Bytes of these files in the page cache (util-linux ``fincore``), or None when it is unavailable."""
    if not paths or shutil.which("fincore") is None:
        return None
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", *map(str, paths)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return sum(int(x) for x in out.split())
    except (subprocess.CalledProcessError, ValueError):
        return None


def sparkline(values: list[float], width: int = 48) -> str:
    if not values:
        return ""
    bars = "▁▂▃▄▅▆▇█"
    step = max(1, -(-len(values) // width))
    pts = [max(values[i : i + step]) for i in range(0, len(values), step)]
    hi = max(pts) or 1.0
    return "".join(bars[min(len(bars) - 1, int(v / hi * (len(bars) - 1) + 0.5))] for v in pts)


# ============================================================================================ safetensors, by hand
# (the inputs and the floors use their own minimal reader/writer, independent of ram_live)


def st_header(path: Path) -> tuple[int, dict[str, Any]]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def st_write_header(f: Any, entries: list[tuple[str, str, tuple[int, ...], int]]) -> dict[str, tuple[int, int]]:
    """Write a safetensors header for ``(key, dtype, shape, nbytes)`` in this order; returns key → (begin, end)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for key, dtype, shape, nbytes in entries:
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets[key] = (pos, pos + nbytes)
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    return offsets


def write_all(f: Any, buf: Any) -> None:
    view = memoryview(buf).cast("B")
    while view:
        n = f.write(view)
        view = view[n:]


def folder_index(folder: Path) -> tuple[dict[str, str], dict[str, tuple[Path, int, str, tuple[int, ...], int, int]]]:
    """weight_map (key → shard, in the index's order) and key → (file, data start, dtype, shape, begin, end)."""
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    where: dict[str, tuple[Path, int, str, tuple[int, ...], int, int]] = {}
    for shard in sorted(set(weight_map.values())):
        start, header = st_header(folder / shard)
        for key, e in header.items():
            where[key] = (folder / shard, start, e["dtype"], tuple(e["shape"]), *e["data_offsets"])
    return weight_map, where


def shard_layout(specs: list[tuple[str, tuple[int, ...], int]], shard_bytes: int) -> list[list[str]]:
    """Keys in model order, greedily into shards of at most ``shard_bytes`` (as ``save_pretrained`` does)."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, _, nbytes in specs:
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


# ============================================================================================ children


def child_generate(spec: dict[str, Any]) -> dict[str, Any]:
    """Write the base and K agents as HF folders, one tensor at a time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    torch.set_num_threads(1)  # 1M-element ops: two OpenMP threads only add hand-offs, badly so on a busy machine
    config = LlamaConfig(**spec["config"])
    config.dtype = torch.bfloat16
    config.architectures = ["LlamaForCausalLM"]  # as save_pretrained of the model writes it (mergekit needs it)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    del model
    specs = [(k, s, 2 * _prod(s)) for k, s in shapes]
    shards = shard_layout(specs, spec["shard_bytes"])
    shape_of = dict(shapes)
    names = ["base"] + [f"agent_{t}" for t in range(len(spec["densities"]))]
    roots = {n: Path(spec["workdir"]) / n for n in names}
    for r in roots.values():
        r.mkdir(parents=True)
        config.save_pretrained(r)
    k = len(spec["densities"])
    changed = [0] * k
    hist = [0] * (k + 1)
    total = 0
    largest = max(s[2] for s in specs)
    t0 = time.perf_counter()
    weight_map: dict[str, str] = {}
    buf = {f"f{i}": torch.empty(CHUNK) for i in range(6)}
    buf.update({f"bf{i}": torch.empty(CHUNK, dtype=torch.bfloat16) for i in range(3)})
    buf.update(
        b0=torch.empty(CHUNK, dtype=torch.bool),
        b1=torch.empty(CHUNK, dtype=torch.bool),
        u8=torch.empty(CHUNK, dtype=torch.uint8),
    )
    for i, shard in enumerate(shards):
        name = shard_name(i, len(shards))
        order = sorted(shard)  # safetensors sorts a file's tensors by name
        entries = [(key, "BF16", shape_of[key], 2 * _prod(shape_of[key])) for key in order]
        with contextlib.ExitStack() as stack:
            files = {n: stack.enter_context(open(roots[n] / name, "wb", buffering=0)) for n in names}
            for f in files.values():
                st_write_header(f, entries)
            for key in order:
                weight_map[key] = name
                shape = shape_of[key]
                n_el = _prod(shape)
                g = torch.Generator().manual_seed(spec["seed"] * 1_000_003 + zlib.crc32(key.encode()))
                for start in range(0, n_el, CHUNK):  # chunks through reused buffers: no big allocations
                    m = min(CHUNK, n_el - start)
                    base32, base_bf, b32, scale = (buf[what][:m] for what in ("f0", "bf0", "f1", "f2"))
                    x, y, sign, active, moved = (buf[what][:m] for what in ("f3", "f4", "f5", "b0", "b1"))
                    agent, kept, count = buf["bf1"][:m], buf["bf2"][:m], buf["u8"][:m]
                    torch.randn(m, generator=g, out=base32).mul_(0.02)
                    if len(shape) == 1:
                        base32.add_(1.0)  # RMSNorm weights
                    base_bf.copy_(base32)
                    write_all(files["base"], base_bf.view(torch.uint8).numpy())
                    b32.copy_(base_bf)
                    torch.abs(b32, out=scale).clamp_(min=0.02)
                    count.zero_()
                    for t, d in enumerate(spec["densities"]):
                        # one uniform u per entry: active iff u < d; x = 2u/d - 1 ∈ [-1, 1) gives sign and size
                        x.uniform_(generator=g).mul_(2.0 / d).sub_(1.0)
                        torch.lt(x, 1.0, out=active)
                        torch.mul(x, 0.04, out=y).add_(torch.sign(x, out=sign), alpha=0.02)  # ±[0.02, 0.06)
                        agent.copy_(y.mul_(scale).add_(b32))  # rounded to bf16
                        torch.where(active, agent, base_bf, out=kept)
                        torch.ne(kept, base_bf, out=moved)
                        changed[t] += int(moved.sum())
                        count.add_(moved)
                        write_all(files[f"agent_{t}"], kept.view(torch.uint8).numpy())
                    for c, v in enumerate(torch.bincount(count, minlength=k + 1).tolist()):
                        hist[c] += v
                total += n_el
            for f in files.values():
                os.fsync(f.fileno())
    index = {"metadata": {"total_size": sum(s[2] for s in specs)}, "weight_map": weight_map}
    for r in roots.values():
        (r / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        fsync_tree(r)
        evict(files_of(r))
    return {
        "seconds": time.perf_counter() - t0,
        "parameters": total,
        "tensors": len(specs),
        "model_bytes": sum(s[2] for s in specs),
        "largest_tensor": max(specs, key=lambda s: s[2])[0],
        "largest_tensor_bytes": largest,
        "shards": len(shards),
        "density": [c / total for c in changed],
        "overlap_histogram": hist,
        "folders": {n: str(r) for n, r in roots.items()},
    }


def _prod(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def child_floor(spec: dict[str, Any]) -> dict[str, Any]:
    """Read every tensor of every input once and write one output of the base's size (sharded safetensors)."""
    import numpy as np
    import torch  # (imported like the merge children do, so the baselines compare)

    inputs = [Path(p) for p in spec["inputs"]]
    out = Path(spec["out"])
    use_mmap = spec["io"] == "mmap"
    page = mmap.PAGESIZE
    base_rss = proc_status().get("VmRSS")
    t0 = time.time()
    indexes = [folder_index(p) for p in inputs]
    weight_map, base_where = indexes[0]
    keys = list(weight_map)
    largest = max(e[5] - e[4] for e in base_where.values())
    buf = torch.empty(largest, dtype=torch.uint8)
    buf_np = buf.numpy()
    maps: dict[Path, Any] = {}
    handles: dict[Path, Any] = {}
    stack = contextlib.ExitStack()  # closed at the end (a failure ends the process)
    for _, where in indexes:
        for file, *_ in where.values():
            if file not in maps:
                if use_mmap:
                    with open(file, "rb") as f:  # copy-on-write, as ram_live maps (never written)
                        maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                else:
                    maps[file] = None
                    handles[file] = stack.enter_context(open(file, "rb", buffering=0))  # noqa: SIM115
    # output layout: the base's keys, in the index's order, into shards of at most shard_bytes
    specs = [(k, base_where[k][3], base_where[k][5] - base_where[k][4]) for k in keys]
    shards = shard_layout(specs, spec["shard_bytes"])
    out.mkdir(parents=True)
    out_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = shard_name(i, len(shards))
        with open(out / name, "wb", buffering=0) as fo:
            st_write_header(
                fo, [(k, base_where[k][2], base_where[k][3], base_where[k][5] - base_where[k][4]) for k in shard]
            )
            for key in shard:
                out_map[key] = name
                for _, where in indexes:
                    file, start, _, _, begin, end = where[key]
                    n = end - begin
                    if use_mmap:
                        mm = maps[file]
                        # one plain memcpy (numpy: a single thread, no OpenMP hand-offs on a busy machine)
                        np.copyto(buf_np[:n], np.frombuffer(mm, dtype=np.uint8, count=n, offset=start + begin))
                        lo = ((start + begin) // page) * page
                        mm.madvise(mmap.MADV_DONTNEED, lo, min(len(mm), start + end) - lo)
                    else:
                        fh = handles[file]
                        fh.seek(start + begin)
                        view = memoryview(buf_np)[:n]
                        while view:
                            got = fh.readinto(view)
                            view = view[got:]
                # the last input's bytes (an agent's) stand in for the merged tensor
                write_all(fo, buf_np[:n])
    index = {"metadata": {"total_size": sum(s[2] for s in specs)}, "weight_map": dict(sorted(out_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.copy2(inputs[0] / "config.json", out / "config.json")
    for m in maps.values():
        if m is not None:
            m.close()
    stack.close()
    return {"t_start": t0, "t_end": time.time(), "base_rss": base_rss}


#: Bytes per work item of the parallel floor: 2^18 bf16 entries, the chunk the merge's native kernels take.
FLOOR_CHUNK = 1 << 19


def child_floor_parallel(spec: dict[str, Any]) -> dict[str, Any]:
    """The streaming floor: the merge's I/O without its arithmetic, with the merge's threads.

    Every input tensor's bytes are read once and one output of the base's layout is written, split into work
    items of ``FLOOR_CHUNK`` bytes (in the index's key order) that ``merge_workers()`` threads take from a shared
    counter, with no barrier between tensors (the merge has one). Per item each thread reads the item's range of
    all K + 1 inputs into its own buffer and writes the last one (an agent's bytes stand in for the merged ones).
    ``io="pread"``: ``os.preadv`` into the buffer (each thread with its own descriptors, so its own readahead),
    ``os.pwrite`` into a ``posix_fallocate``'d file. ``io="mmap"``:
    ram_live's path, copy-on-write maps of the inputs copied from (numpy, GIL released) and the output
    fallocated and mapped writable, pages released after each item with ``MADV_DONTNEED`` as ram_live does."""
    import numpy as np
    import torch  # noqa: F401  (imported like the merge children do, so the baselines compare)

    from _host import merge_workers

    workers = merge_workers()
    inputs = [Path(p) for p in spec["inputs"]]
    out = Path(spec["out"])
    use_mmap = spec["io"] == "mmap"
    page = mmap.PAGESIZE
    base_rss = proc_status().get("VmRSS")
    t0 = time.time()
    indexes = [folder_index(p) for p in inputs]
    weight_map, base_where = indexes[0]
    keys = list(weight_map)
    specs = [(k, base_where[k][3], base_where[k][5] - base_where[k][4]) for k in keys]
    shards = shard_layout(specs, spec["shard_bytes"])
    out.mkdir(parents=True)
    stack = contextlib.ExitStack()
    fds: dict[Path, int] = {}
    maps: dict[Path, Any] = {}
    for _, where in indexes:
        for file, *_ in where.values():
            if file not in fds:
                fds[file] = os.open(file, os.O_RDONLY)
                stack.callback(os.close, fds[file])
                if use_mmap:
                    maps[file] = mmap.mmap(fds[file], 0, access=mmap.ACCESS_COPY)
                    stack.callback(maps[file].close)
    # the output: each shard's header written, its bytes reserved, (mmap) mapped writable
    place: dict[str, tuple[int, Any, int]] = {}  # key → (fd, map or None, absolute offset of its data)
    out_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = shard_name(i, len(shards))
        entries = [(k, base_where[k][2], base_where[k][3], base_where[k][5] - base_where[k][4]) for k in shard]
        with open(out / name, "wb") as fo:
            offsets = st_write_header(fo, entries)
            data_start = fo.tell()
        size = data_start + sum(e[3] for e in entries)
        fd = os.open(out / name, os.O_RDWR)
        stack.callback(os.close, fd)
        os.posix_fallocate(fd, 0, size)
        om = None
        if use_mmap and size > data_start:
            om = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
            stack.callback(om.close)
        for key in shard:
            out_map[key] = name
            place[key] = (fd, om, data_start + offsets[key][0])
    items = [(key, lo, min(lo + FLOOR_CHUNK, n)) for key, _, n in specs for lo in range(0, n, FLOOR_CHUNK)]
    sources = [[(where[key][0], where[key][1] + where[key][4]) for _, where in indexes] for key in keys]
    source_of = dict(zip(keys, sources))
    taken = iter(range(len(items)))  # next() on it is atomic under the GIL: the shared counter
    lock = threading.Lock()
    errors: list[BaseException] = []

    def release(mm: Any, lo: int, hi: int) -> None:
        lo, hi = -(-lo // page) * page, min(len(mm), hi // page * page)  # only pages wholly inside
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def work() -> None:
        buf = np.empty(FLOOR_CHUNK, dtype=np.uint8)
        # (pread) each thread opens the inputs itself, for its own readahead state per file: threads sharing one
        # file description interleave their offsets, and the kernel then stops reading ahead
        own = fds if use_mmap else {f: os.open(f, os.O_RDONLY) for f in fds}
        try:
            while True:
                with lock:
                    i = next(taken, None)
                if i is None:
                    return
                key, lo, hi = items[i]
                n = hi - lo
                view = buf[:n]
                for file, begin in source_of[key]:
                    if use_mmap:
                        mm = maps[file]
                        np.copyto(view, np.frombuffer(mm, dtype=np.uint8, count=n, offset=begin + lo))
                        release(mm, begin + lo, begin + hi)
                    else:
                        done = 0
                        while done < n:
                            got = os.preadv(own[file], [memoryview(view)[done:]], begin + lo + done)
                            if got <= 0:
                                raise OSError(f"{file}: short read at {begin + lo + done}")
                            done += got
                fd, om, at = place[key]
                if om is not None:
                    np.copyto(np.frombuffer(om, dtype=np.uint8, count=n, offset=at + lo), view)
                    release(om, at + lo, at + hi)
                else:
                    done = 0
                    while done < n:
                        done += os.pwrite(fd, memoryview(view)[done:], at + lo + done)
        except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread)
            errors.append(exc)
        finally:
            if own is not fds:
                for fd in own.values():
                    os.close(fd)

    threads = [threading.Thread(target=work, name=f"floor-{w}") for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for om in {p[1] for p in place.values() if p[1] is not None}:
        om.flush()  # as ram_live's writer msyncs its shards inside the call
    index = {"metadata": {"total_size": sum(s[2] for s in specs)}, "weight_map": dict(sorted(out_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.copy2(inputs[0] / "config.json", out / "config.json")
    stack.close()
    return {"t_start": t0, "t_end": time.time(), "base_rss": base_rss, "workers": workers}


def child_ram(spec: dict[str, Any]) -> dict[str, Any]:
    import torch  # noqa: F401

    import ram_live

    base_rss = proc_status().get("VmRSS")
    t0 = time.time()
    _, info = ram_live.merge(
        spec["agents"],
        base=spec["base"],
        out=spec["out"],
        method=spec["variant"],
        max_shard_bytes=spec["shard_bytes"],
        return_info=True,
        compile=spec.get("compile", "auto"),
    )
    t1 = time.time()
    return {
        "t_start": t0,
        "t_end": t1,
        "base_rss": base_rss,
        "lambdas": info.lambdas,
        "rho": info.rho,
        "passes": info.passes,
        "engine_seconds": info.seconds,
        "compiled": info.extra.get("compiled"),
    }


MERGEKIT_WRAPPER = r"""
import json, os, sys, time
spec = json.loads(sys.argv[1])
from mergekit.scripts.run_yaml import main
def status():
    out = {}
    for line in open("/proc/self/status"):
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(rest.split()[0]) * 1024
    return out
base_rss = status().get("VmRSS")
t0 = time.time()
main(args=spec["argv"], standalone_mode=False)
t1 = time.time()
out = spec["out"]
for root, _, files in os.walk(out):
    for name in files:
        fd = os.open(os.path.join(root, name), os.O_RDONLY); os.fsync(fd); os.close(fd)
t2 = time.time()
st = status()
json.dump({"t_start": t0, "t_end": t1, "t_synced": t2, "base_rss": base_rss, "vm_hwm": st.get("VmHWM")},
          open(spec["result"], "w"))
"""


def run_child_entry(spec: dict[str, Any]) -> None:
    """In the child: run the job, fsync its output, record timings and VmHWM into spec['result']."""
    kind = spec["kind"]
    if kind == "generate":
        result = child_generate(spec)
    elif kind == "verify":
        result = child_verify(spec)
    else:
        run = {"floor": child_floor, "floor_parallel": child_floor_parallel, "ram": child_ram}[kind]
        result = run(spec)
        fsync_tree(Path(spec["out"]))
        result["t_synced"] = time.time()
    import resource

    st = proc_status()
    result["vm_hwm"] = st.get("VmHWM")
    result["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(spec["result"]).write_text(json.dumps(result, default=str))


# ============================================================================================ verification


def child_verify(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors import safe_open
    from transformers import LlamaForCausalLM

    import ram_live

    report: dict[str, Any] = {"loads": {}, "keys": {}}
    base = Path(spec["base"])
    agents = [Path(a) for a in spec["agents"]]

    def read(folder: Path, key: str) -> torch.Tensor:
        index = sorted(folder.glob("*.safetensors.index.json"))
        if index:
            files = [folder / json.loads(index[0].read_text())["weight_map"][key]]
        else:
            files = sorted(folder.glob("*.safetensors"))
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                if key in f.keys():  # noqa: SIM118  (safe_open is not a mapping)
                    return f.get_tensor(key)
        raise KeyError(f"{key} not in {folder}")

    for label, out in spec["outputs"].items():
        if label == "mergekit ram":
            continue
        t0 = time.perf_counter()
        model = LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
        ids = torch.arange(1, 9).unsqueeze(0)
        with torch.no_grad():
            logits = model(ids).logits
        report["loads"][label] = {
            "ok": bool(torch.isfinite(logits).all()),
            "seconds": time.perf_counter() - t0,
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype),
        }
        del model, logits

    lambdas = spec.get("lambdas") or {}
    for key in spec["keys"]:
        b = read(base, key)
        ags = [read(a, key) for a in agents]
        b32 = b.float()
        taus = torch.stack([a.float() - b32 for a in ags])
        active = taus.abs() > 1e-5
        c = active.sum(0)
        tz = taus * active
        mean = tz.sum(0) / c.clamp(min=1)
        entry: dict[str, Any] = {
            "numel": b.numel(),
            "shared": float((c >= 2).float().mean()),
            "unique": float((c == 1).float().mean()),
        }
        expect = {"ram_live RAM": (b32 + torch.where(c == 1, tz.sum(0), mean)).to(torch.bfloat16)}
        if lambdas:
            lam = torch.tensor([lambdas[f"agent_{t}"] for t in range(len(ags))]).view(-1, *[1] * b.dim())
            expect["ram_live RAM+"] = (b32 + torch.where(c == 1, (tz * lam).sum(0), mean)).to(torch.bfloat16)
        mem = ram_live.merge([{key: a} for a in ags], base={key: b}, method="ram")[key]
        got_ram = None
        for label, out in spec["outputs"].items():
            got = read(Path(out), key)
            res: dict[str, Any] = {}
            eager_label = label.removesuffix(" compiled")
            if eager_label in expect:
                res["equal_by_hand"] = float((got == expect[eager_label]).float().mean())
                res["max_abs_diff_by_hand"] = float((got.float() - expect[eager_label].float()).abs().max())
            if eager_label != label and eager_label in spec["outputs"]:
                res["bitwise_equal_to_eager"] = bool(torch.equal(got, read(Path(spec["outputs"][eager_label]), key)))
            if label == "ram_live RAM":
                got_ram = got
                res["bitwise_equal_in_memory_ram_merge"] = bool(torch.equal(got, mem))
            if label == "mergekit ram" and "ram_live RAM" in spec["outputs"]:
                ours = got_ram if got_ram is not None else read(Path(spec["outputs"]["ram_live RAM"]), key)
                res["equal_to_ram_live_ram"] = float((got.to(ours.dtype) == ours).float().mean())
                res["max_abs_diff_to_ram_live_ram"] = float((got.float() - ours.float()).abs().max())
                res["dtype"] = str(got.dtype)
            unchanged = c == 0
            res["c0_entries_keep_base_bits"] = bool(torch.equal(got.to(b.dtype)[unchanged], b[unchanged]))
            entry[label] = res
        report["keys"][key] = entry
    return report


# ============================================================================================ the parent


class Sampler(threading.Thread):
    """Reads /proc/PID/status every ``interval`` s: (time, VmRSS, RssAnon, RssFile)."""

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, int, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            st = proc_status(self.pid)
            if "VmRSS" in st:
                self.samples.append((time.time(), st["VmRSS"], st.get("RssAnon", 0), st.get("RssFile", 0)))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def spawn(cmd: list[str], result: Path, env: dict[str, str] | None = None, log: Path | None = None) -> dict[str, Any]:
    """Run ``cmd`` as a fresh process, sample its RSS, return its result file's JSON plus process figures."""
    busy0 = cpu_busy_seconds()
    t0 = time.time()
    with open(log if log is not None else os.devnull, "w") as stdout:
        proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop()
    wall = time.time() - t0
    busy = cpu_busy_seconds() - busy0
    own = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"{Path(cmd[0]).name} … {cmd[-1][:200]} exited with {proc.returncode}\n{tail}")
    out = json.loads(result.read_text())
    out.update(
        wall=wall,
        cpu_seconds=own,
        others_cpu=max(0.0, busy - own) / (wall * (os.cpu_count() or 1)),
        samples=sampler.samples,
        t_spawn=t0,
    )
    return out


def python_child(spec: dict[str, Any], workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = workdir / f"result-{spec['kind']}-{time.time_ns()}.json"
    spec = {**spec, "result": str(result)}
    log = workdir / f"log-{spec['kind']}-{time.time_ns()}.txt"
    try:
        return spawn(
            [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)], result, env=env, log=log
        )
    finally:
        result.unlink(missing_ok=True)


def curve_summary(r: dict[str, Any]) -> dict[str, Any]:
    """Peak / median RSS during the timed part, file-backed vs anonymous, and a 60-point curve."""
    s = r.pop("samples")
    t_start, t_end = r.get("t_start", r["t_spawn"]), r.get("t_synced", r.get("t_end", float("inf")))
    during = [x for x in s if t_start <= x[0] <= t_end] or s
    if not during:
        return {}
    rss = [x[1] for x in during]
    peak_i = max(range(len(during)), key=lambda i: during[i][1])
    step = max(1, len(s) // 60)
    return {
        "samples": len(s),
        "peak_sampled": max(x[1] for x in s),
        "peak_during_call": rss[peak_i],
        "peak_at_s": during[peak_i][0] - t_start,
        "anon_at_peak": during[peak_i][2],
        "file_at_peak": during[peak_i][3],
        "peak_anon": max(x[2] for x in during),
        "peak_file": max(x[3] for x in during),
        "median_during_call": sorted(rss)[len(rss) // 2],
        "spark": sparkline([x[1] for x in during]),
        "curve": [(round(x[0] - r["t_spawn"], 3), x[1], x[2], x[3]) for x in s[::step]],
    }


def wait_for_quiet(max_load: float, budget: list[float], label: str) -> dict[str, Any]:
    """Poll the 1-min load average every 30 s until it is below ``max_load``; ``budget[0]``: seconds left."""
    start = time.time()
    load = loadavg()
    while load >= max_load and budget[0] > 0:
        print(
            f"  [{label}] load average {load:.2f} ≥ {max_load}: waiting (≤ {budget[0]:.0f} s of waiting left)",
            flush=True,
        )
        nap = min(30.0, budget[0])
        time.sleep(nap)
        budget[0] -= nap
        load = loadavg()
    return {"load_at_start": load, "waited_s": time.time() - start, "quiet": load < max_load}


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="~117 MB model, no mergekit (~1–2 min)")
    ap.add_argument("--json", metavar="FILE", help="write every figure (and the RSS curves) here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (inputs and outputs)")
    ap.add_argument("--workdir", help="work folder (default: a new folder under /tmp)")
    ap.add_argument("--no-mergekit", action="store_true", help="skip mergekit-yaml")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also run RAM and RAM+ with compile=True (each call in a fresh process: compile included)",
    )
    ap.add_argument(
        "--no-single-thread",
        action="store_true",
        help="skip the single-thread copy + write row (the old floor, which merges beat)",
    )
    ap.add_argument(
        "--cold",
        choices=("fadvise", "drop_caches", "none"),
        default="fadvise",
        help="how to make the inputs cold: evict this benchmark's files (default), drop every cache "
        "of the machine (root), or no cold runs",
    )
    ap.add_argument("--layers", type=int, help="override the number of decoder layers")
    ap.add_argument("--shard-bytes", type=int, help="shard size of inputs and outputs (default 1e9; quick 5e7)")
    ap.add_argument("--max-load", type=float, default=1.5, help="wait for a 1-min load average below this")
    ap.add_argument(
        "--max-wait", type=float, help="seconds of waiting for a quiet machine, in all (default 900; 0 with --quick)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        run_child_entry(json.loads(args.child))
        return 0

    t_bench = time.time()
    config = dict(QUICK if args.quick else FULL)
    if args.layers:
        config["num_hidden_layers"] = args.layers
    shard_bytes = args.shard_bytes or (50 * 10**6 if args.quick else 10**9)
    max_wait = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 900.0)
    budget = [max_wait]
    use_mergekit = not (args.quick or args.no_mergekit)
    mergekit_note = ""
    if use_mergekit:
        ok = subprocess.run(["bash", str(HERE / "mergekit_env.sh")], capture_output=True, text=True, check=False)
        if ok.returncode != 0 or not (MERGEKIT_VENV / "bin/python").exists():
            use_mergekit = False
            mergekit_note = f"mergekit skipped: benchmarks/mergekit_env.sh failed ({ok.stderr.strip()[-300:]})"

    # rough size: 2 bytes × (V·H·2 + L·(4·H² + 3·H·I) + (2L + 1)·H)
    h, i_, v, n_l = (config[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    kv = h * config["num_key_value_heads"] // config["num_attention_heads"]
    est = 2 * (2 * v * h + n_l * (2 * h * h + 2 * h * kv + 3 * h * i_) + (2 * n_l + 1) * h)
    k = len(DENSITIES)
    need = est * (k + 1) + est * (3 if use_mergekit else 2) + 500 * MB
    workdir = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ram_live_bench_stream-", dir="/tmp"))
    )
    workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(workdir).free
    if free < need:
        print(f"not enough disk in {workdir}: {free / 1e9:.1f} GB free, ~{need / 1e9:.1f} GB needed", file=sys.stderr)
        return 2
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    try:
        return _bench(
            args, config, shard_bytes, budget, max_wait, use_mergekit, mergekit_note, workdir, env, est, t_bench
        )
    finally:
        if args.keep:
            print(f"\nkept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _bench(
    args: argparse.Namespace,
    config: dict[str, Any],
    shard_bytes: int,
    budget: list[float],
    max_wait: float,
    use_mergekit: bool,
    mergekit_note: str,
    workdir: Path,
    env: dict[str, str],
    est: int,
    t_bench: float,
) -> int:
    workers = merge_workers()
    print(
        f"work folder {workdir}; model ≈ {est / 1e9:.2f} GB bf16; load average {loadavg():.2f}; CPU "
        f"{cpu_label()} × {os.cpu_count()}, the merge's threads {workers}",
        flush=True,
    )
    gen = python_child(
        {
            "kind": "generate",
            "config": config,
            "densities": list(DENSITIES),
            "seed": SEED,
            "shard_bytes": shard_bytes,
            "workdir": str(workdir / "inputs"),
        },
        workdir,
        env,
    )
    folders = {n: Path(p) for n, p in gen["folders"].items()}
    base = folders["base"]
    agents = [folders[f"agent_{t}"] for t in range(len(DENSITIES))]
    input_files = [f for p in folders.values() for f in files_of(p) if f.suffix == ".safetensors"]
    input_bytes = sum(f.stat().st_size for f in input_files)
    largest = gen["largest_tensor_bytes"]
    rss_target = 4 * largest + 500 * MB
    hist = gen["overlap_histogram"]
    print(
        f"inputs: {gen['parameters'] / 1e9:.3f} B parameters, {gen['tensors']} tensors, {gen['shards']} shards "
        f"of ≤ {shard_bytes / MB:,.0f} MB per folder; model {gen['model_bytes'] / 1e9:.2f} GB, inputs "
        f"{input_bytes / 1e9:.2f} GB (base + {len(agents)} agents); largest tensor {gen['largest_tensor']} "
        f"{largest / MB:,.0f} MB; generated in {gen['seconds']:.0f} s",
        flush=True,
    )
    print(
        "agents' changed entries: "
        + ", ".join(f"agent_{t} {d:.1%}" for t, d in enumerate(gen["density"]))
        + "; entries changed by c agents: "
        + ", ".join(f"c={c} {n / gen['parameters']:.1%}" for c, n in enumerate(hist)),
        flush=True,
    )

    floors: list[tuple[str, dict[str, Any] | None]] = [
        (f"floor (pread/pwrite ×{workers})", {"kind": "floor_parallel", "io": "pread"}),
        (f"floor (mmap ×{workers})", {"kind": "floor_parallel", "io": "mmap"}),
    ]
    plan = list(floors)
    if not args.no_single_thread:
        plan.append((SINGLE_THREAD, {"kind": "floor", "io": "mmap"}))
    plan += [
        ("ram_live RAM", {"kind": "ram", "variant": "ram"}),
        ("ram_live RAM+", {"kind": "ram", "variant": "ram_plus"}),
    ]
    if args.compile:  # a fresh process per run: the call includes compiling (or loading inductor's cache)
        plan += [
            ("ram_live RAM compiled", {"kind": "ram", "variant": "ram", "compile": True}),
            ("ram_live RAM+ compiled", {"kind": "ram", "variant": "ram_plus", "compile": True}),
        ]
    if use_mergekit:
        plan.append(("mergekit ram", None))
    plan += [(f"{label} #2", job) for label, job in floors]  # order effects: the floors bracket the runs
    caches = ["warm"] if args.cold == "none" else ["cold", "warm"]
    runs: list[dict[str, Any]] = []
    keep_out: dict[str, str] = {}
    lambdas: dict[str, float] | None = None
    for label, job in plan:
        for cache in caches:
            slug = re.sub(r"[^a-z0-9]+", "-", label.lower().replace("+", " plus")).strip("-")
            out = workdir / f"out-{slug}-{cache}"
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            quiet = wait_for_quiet(args.max_load, budget, label)
            how = None
            if cache == "cold":
                if args.cold == "drop_caches" and drop_caches():
                    how = "drop_caches"
                else:
                    evict(input_files)
                    how = "fadvise"
            resident = resident_bytes(input_files)
            if job is None:
                r = run_mergekit(base, agents, out, shard_bytes, workdir, env)
            else:
                spec = {
                    **job,
                    "out": str(out),
                    "shard_bytes": shard_bytes,
                    "base": str(base),
                    "agents": [str(a) for a in agents],
                    "inputs": [str(base)] + [str(a) for a in agents],
                }
                r = python_child(spec, workdir, env)
            r["curve"] = curve_summary(r)
            r.update(
                label=label,
                cache=cache,
                evicted_with=how,
                resident_before=resident,
                resident_share=None if resident is None else resident / input_bytes,
                load_end=loadavg(),
                **quiet,
            )
            r["call_s"] = r["t_end"] - r["t_start"]
            r["synced_s"] = r["t_synced"] - r["t_start"]
            r["out_bytes"] = sum(f.stat().st_size for f in files_of(out) if f.suffix == ".safetensors")
            if r.get("lambdas"):
                lambdas = r["lambdas"]
            runs.append(r)
            print(
                f"  {label:15s} {cache}: {r['call_s']:6.2f} s call, {r['synced_s']:6.2f} s +fsync, peak RSS "
                f"{fmt_mb(r['vm_hwm'])} (after imports {fmt_mb(r['base_rss'])}); inputs cached before: "
                + ("?" if resident is None else f"{resident / input_bytes:.0%}")
                + f"; load {quiet['load_at_start']:.2f}, others' CPU {r['others_cpu']:.0%}",
                flush=True,
            )
            if cache == caches[-1] and label.startswith(("ram_live", "mergekit")):
                keep_out[label] = str(out)
            else:
                shutil.rmtree(out, ignore_errors=True)

    print("verifying the outputs …", flush=True)
    verify_keys = [
        "model.norm.weight",
        "model.layers.0.self_attn.k_proj.weight",
        f"model.layers.{config['num_hidden_layers'] - 1}.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
    ]
    verification = python_child(
        {
            "kind": "verify",
            "base": str(base),
            "agents": [str(a) for a in agents],
            "outputs": keep_out,
            "keys": verify_keys,
            "lambdas": lambdas,
        },
        workdir,
        env,
    )
    for key in ("samples", "t_spawn", "wall", "cpu_seconds", "others_cpu"):
        verification.pop(key, None)

    report = render(
        runs,
        gen,
        largest,
        rss_target,
        input_bytes,
        verification,
        lambdas,
        budget,
        max_wait,
        mergekit_note,
        args,
        time.time() - t_bench,
        workers,
    )
    print(report)
    if args.json:
        payload = {
            "config": config,
            "shard_bytes": shard_bytes,
            "inputs": gen,
            "input_bytes": input_bytes,
            "largest_tensor_bytes": largest,
            "rss_target": rss_target,
            "runs": runs,
            "verification": verification,
            "lambdas": lambdas,
            "cpu_count": os.cpu_count(),
            "cpu": cpu_label(),
            "merge_workers": workers,
            "wall_s": time.time() - t_bench,
            "waiting_left_s": budget[0],
            "max_wait_s": max_wait,
            "mergekit": mergekit_note or use_mergekit,
        }
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


def run_mergekit(
    base: Path, agents: list[Path], out: Path, shard_bytes: int, workdir: Path, env: dict[str, str]
) -> dict[str, Any]:
    cfg = workdir / "mergekit-ram.yml"
    lines = ["merge_method: ram", f"base_model: {base}", "models:"]
    lines += [f"  - model: {a}" for a in agents]
    lines += ["dtype: bfloat16", ""]
    cfg.write_text("\n".join(lines))
    result = workdir / f"result-mergekit-{time.time_ns()}.json"
    argv = [
        str(cfg),
        str(out),
        "--lazy-unpickle",
        "--no-copy-tokenizer",
        "--no-write-model-card",
        "--out-shard-size",
        str(shard_bytes),
        "--no-cuda",
        "--device",
        "cpu",
        "--quiet",
    ]
    spec = {"argv": argv, "out": str(out), "result": str(result)}
    log = workdir / f"log-mergekit-{time.time_ns()}.txt"
    menv = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    try:
        return spawn(
            [str(MERGEKIT_VENV / "bin/python"), "-c", MERGEKIT_WRAPPER, json.dumps(spec)], result, env=menv, log=log
        )
    finally:
        result.unlink(missing_ok=True)


def render(
    runs: list[dict[str, Any]],
    gen: dict[str, Any],
    largest: int,
    rss_target: float,
    input_bytes: int,
    verification: dict[str, Any],
    lambdas: dict[str, float] | None,
    budget: list[float],
    max_wait: float,
    mergekit_note: str,
    args: argparse.Namespace,
    wall: float,
    workers: int,
) -> str:
    floor: dict[str, dict[str, Any]] = {}  # per cache state, the fastest of the parallel floor runs (+fsync)
    for r in runs:
        if r["label"].startswith("floor (") and (
            r["cache"] not in floor or r["synced_s"] < floor[r["cache"]]["synced_s"]
        ):
            floor[r["cache"]] = r
    title = (
        f"## Streaming merge of {gen['parameters'] / 1e9:.2f} B bf16 parameters "
        f"({gen['model_bytes'] / 1e9:.2f} GB per model), base + {len(gen['density'])} agents "
        f"({input_bytes / 1e9:.2f} GB in); {cpu_label()} × {os.cpu_count()} CPUs, {workers} merge threads"
    )
    lines = ["", title, ""]
    lines.append(
        "| run | cache | inputs cached before | seconds (call) | seconds (+fsync) | × floor (+fsync) "
        "| × floor (call) | peak RSS (VmHWM) | after imports | load at start | others' CPU |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        f = floor.get(r["cache"])
        x_sync = r["synced_s"] / f["synced_s"] if f else None
        x_call = r["call_s"] / f["call_s"] if f else None
        res = "?" if r["resident_share"] is None else f"{r['resident_share']:.0%}"
        lines.append(
            f"| {r['label']} | {r['cache']} | {res} | {r['call_s']:.2f} | {r['synced_s']:.2f} | "
            f"{'—' if x_sync is None else f'{x_sync:.2f}×'} | {'—' if x_call is None else f'{x_call:.2f}×'} | "
            f"{fmt_mb(r['vm_hwm'])} | {fmt_mb(r['base_rss'])} | {r['load_at_start']:.2f}"
            f"{'' if r['quiet'] else ' (busy)'} | {r['others_cpu']:.0%} |"
        )
    targets = (
        f"Targets: peak RSS ≤ 4 × largest tensor ({largest / MB:,.0f} MB) + 500 MB = "
        f"{rss_target / MB:,.0f} MB; seconds (+fsync) ≤ 1.5 × the floor of the same cache state (the "
        f"fastest run of the two parallel floors, {workers} threads as the merge; the × floor columns use "
        "it too)."
    )
    lines += [
        "",
        targets,
        "",
        "| run | cache | peak RSS | RSS target | seconds ≤ 1.5 × floor | verdict |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = []
    for r in runs:
        if not r["label"].startswith("ram_live"):
            continue
        f = floor.get(r["cache"])
        rss_ok = r["vm_hwm"] <= rss_target
        t_ok = f is not None and r["synced_s"] <= 1.5 * f["synced_s"]
        verdicts.append((r["label"], r["cache"], rss_ok, t_ok))
        lines.append(
            f"| {r['label']} | {r['cache']} | {fmt_mb(r['vm_hwm'])} | {'PASS' if rss_ok else 'FAIL'} | "
            f"{r['synced_s']:.2f} s vs {1.5 * f['synced_s']:.2f} s: {'PASS' if t_ok else 'FAIL'} | "
            f"{'PASS' if rss_ok and t_ok else 'FAIL'} |"
        )
    mk = [r for r in runs if r["label"] == "mergekit ram"]
    for r in mk:
        lines.append(
            f"| mergekit ram (reference) | {r['cache']} | {fmt_mb(r['vm_hwm'])} | "
            f"{'PASS' if r['vm_hwm'] <= rss_target else 'FAIL'} | {r['synced_s']:.1f} s vs "
            f"{1.5 * floor[r['cache']]['synced_s']:.1f} s: "
            f"{'PASS' if r['synced_s'] <= 1.5 * floor[r['cache']]['synced_s'] else 'FAIL'} | — |"
        )
    merges = [r for r in runs if r["label"].startswith(("ram_live", "mergekit")) and r["cache"] in floor]
    if merges:
        low = min(merges, key=lambda r: r["synced_s"] / floor[r["cache"]]["synced_s"])
        x_low = low["synced_s"] / floor[low["cache"]]["synced_s"]
        lines += [
            "",
            f"Floor check (every merge reads every input byte and writes every output byte, so none "
            f"can beat the floor): lowest × floor (+fsync) {x_low:.2f}× ({low['label']}, {low['cache']}): "
            + ("PASS" if x_low >= 1.0 else "FAIL: a merge beat the floor, so it is no floor here"),
        ]
    lines += [
        "",
        (
            "RSS during the timed part (sampled every 10 ms from the parent; peak = highest sample, "
            "anon/file = anonymous vs file-backed pages at the peak):"
        ),
        "",
        "| run | cache | samples | median | peak | at s | anon / file at peak | curve (max per bin) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        c = r["curve"]
        if not c:
            continue
        lines.append(
            f"| {r['label']} | {r['cache']} | {c['samples']} | {fmt_mb(c['median_during_call'])} | "
            f"{fmt_mb(c['peak_during_call'])} | {c['peak_at_s']:.1f} | {fmt_mb(c['anon_at_peak'])} / "
            f"{fmt_mb(c['file_at_peak'])} | `{c['spark']}` |"
        )
    if lambdas:
        ram_plus = next((r for r in runs if r["label"] == "ram_live RAM+"), {})
        lines += [
            "",
            "RAM+ λ: "
            + ", ".join(f"{n} {v:.4f}" for n, v in lambdas.items())
            + "; ρ: "
            + ", ".join(f"{n} {v:.3f}" for n, v in (ram_plus.get("rho") or {}).items()),
        ]
    lines += ["", "Verification:"]
    for label, v in verification.get("loads", {}).items():
        lines.append(
            f"- {label}: `LlamaForCausalLM.from_pretrained` → {v['parameters'] / 1e9:.3f} B {v['dtype']} "
            f"parameters, finite logits: {v['ok']} ({v['seconds']:.1f} s)"
        )
    for key, entry in verification.get("keys", {}).items():
        parts = []
        for label, res in entry.items():
            if not isinstance(res, dict):
                continue
            bits = []
            if "bitwise_equal_to_eager" in res:
                bits.append(f"= eager output bit for bit: {res['bitwise_equal_to_eager']}")
            if "bitwise_equal_in_memory_ram_merge" in res:
                bits.append(f"= in-memory merge: {res['bitwise_equal_in_memory_ram_merge']}")
            if "equal_by_hand" in res:
                bits.append(f"= Eq. 7 by hand: {res['equal_by_hand']:.4%} (max |Δ| {res['max_abs_diff_by_hand']:.2g})")
            if "equal_to_ram_live_ram" in res:
                bits.append(
                    f"{res['dtype']}, = ram_live RAM: {res['equal_to_ram_live_ram']:.2%} "
                    f"(max |Δ| {res['max_abs_diff_to_ram_live_ram']:.2g})"
                )
            bits.append(f"c=0 keep base bits: {res['c0_entries_keep_base_bits']}")
            parts.append(f"{label} [{'; '.join(bits)}]")
        lines.append(
            f"- `{key}` ({entry['numel']:,} entries, {entry['shared']:.1%} shared, "
            f"{entry['unique']:.1%} unique): " + "; ".join(parts)
        )
    notes = []
    waited = sum(r["waited_s"] for r in runs)
    busy = [f"{r['label']} {r['cache']}" for r in runs if not r["quiet"]]
    notes.append(
        f"waited {waited:.0f} s in all for a 1-min load average < {args.max_load}"
        + (f"; started above it (waiting budget of {max_wait:.0f} s spent): {', '.join(busy)}" if busy else "")
    )
    cold = [r for r in runs if r["cache"] == "cold"]
    if cold:
        notes.append("cold runs: inputs evicted with " + ", ".join(sorted({str(r["evicted_with"]) for r in cold})))
    if mergekit_note:
        notes.append(mergekit_note)
    lines += ["", "Notes: " + "; ".join(notes) + f". Benchmark wall time {wall:.0f} s."]
    ok = all(a and b for _, _, a, b in verdicts)
    lines.append(f"Overall (ram_live RAM and RAM+, every cache state): {'PASS' if ok else 'FAIL'}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
