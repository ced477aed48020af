"""Encoding a tensor's changes against the base (none, indices, bitmask or dense), selected on the weights'
device or with the CPU paths (numpy, native kernels), and applying them back."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import functional as F
from ..io.memory import advise_hugepages
from ..kernels.pool import map_threads
from ..methods import Activity
from .errors import CorruptSnapshotError
from .format import bits_of


def pack_bits(mask: Tensor) -> Tensor:
    """bool ``[n]`` → uint8 ``[ceil(n/8)]``; element ``8b + j`` is bit ``j`` of byte ``b`` (numpy
    ``bitorder="little"``). On the mask's device."""
    n = mask.numel()
    m = mask.reshape(-1).view(torch.uint8)
    pad = (-n) % 8
    if pad:
        m = torch.cat([m, m.new_zeros(pad)])
    elif m.storage_offset() % 8:
        m = m.clone()
    # each byte is 0 or 1: one multiply gathers the 8 bits of a word into its top byte (no carries; mod 2^64)
    return ((m.view(torch.int64) * 0x0102040810204080) >> 56).to(torch.uint8)


def unpack_bits(packed: Tensor, n: int) -> Tensor:
    """Inverse of :func:`pack_bits`: uint8 ``[ceil(n/8)]`` → bool ``[n]``."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    return ((packed.view(-1, 1) >> shifts) & 1).view(-1)[:n].to(torch.bool)


@dataclass
class Encoded:
    encoding: str  # "none" | "indices" | "bitmask" | "dense"
    count: int
    values: Tensor | None = None
    positions: Tensor | None = None


def _changed_mask(cur: Tensor, base: Tensor, activity: Activity) -> Tensor:
    if activity.rule == "changed":
        return bits_of(cur) != bits_of(base)
    # lossy: the merge's own rule (|τ| > eps and every non-finite value, in its compute dtype), in chunks
    out = torch.empty(cur.shape, dtype=torch.bool, device=cur.device)
    step = 1 << 22
    for s in range(0, cur.numel(), step):
        F.active_mask(cur[s : s + step], base[s : s + step], activity, out=out[s : s + step])
    return out


_NUMPY: Any = False  # numpy module once looked up (None when not installed)
_CPU_CHUNK = 1 << 18  # elements per step of the CPU path (a multiple of 8: bitmask bytes line up)


def optional_numpy() -> Any:
    """numpy if installed (optional: the CPU path's selection is ~10x faster than torch's masked_select)."""
    global _NUMPY
    if _NUMPY is False:
        try:
            import numpy
        except ImportError:  # pragma: no cover - numpy ships with nearly every torch install
            numpy = None
        _NUMPY = numpy
    return _NUMPY


def _choose(n: int, count: int, size: int) -> str:
    if count == 0:
        return "none"
    index_size = 4 if n < 2**31 else 8
    costs = {"indices": count * (index_size + size), "bitmask": (n + 7) // 8 + count * size, "dense": n * size}
    return min(costs, key=lambda k: (costs[k], k != "dense"))


def encode(cur: Tensor, base: Tensor, activity: Activity, to_cpu: bool = True, split: bool = True) -> Encoded:
    """The changed values of ``cur`` against ``base`` (flat, same dtype), selected on their device. ``split``:
    the CPU paths may spread one tensor over threads."""
    n = cur.numel()
    if n == 0:
        return Encoded("none", 0)
    np = optional_numpy() if cur.device.type == "cpu" and activity.rule == "changed" else None
    if np is not None and cur.is_contiguous() and base.is_contiguous() and cur.dtype != torch.bool:
        if _native_path(cur, base, activity):
            return _encode_native(np, _native(), cur, base, split)
        return _encode_numpy(np, cur, base)
    changed = _changed_mask(cur, base, activity)
    count = int(torch.count_nonzero(changed))
    encoding = _choose(n, count, cur.element_size())
    if encoding == "none":
        return Encoded("none", 0)
    if encoding == "dense":
        values = cur.clone() if (cur.device.type == "cpu" or not to_cpu) else cur
        positions = None
    elif encoding == "indices":
        idx = changed.nonzero().view(-1)
        values = cur[idx]
        positions = idx.to(torch.int32 if n < 2**31 else torch.int64)
    else:
        values = cur[changed]
        positions = pack_bits(changed)
    if to_cpu:
        values = values.cpu()
        positions = positions.cpu() if positions is not None else None
    return Encoded(encoding, count, values, positions)


def _scan(np: Any, cn: Any, bn: Any, start: int, end: int) -> tuple[Any, int, list[tuple[str, Any]]]:
    """Compare ``cn`` and ``bn`` over [start, end) in cache-sized steps. Returns the changed values (in order),
    their count, and per step its positions: ``("idx", indices)`` for sparse steps (changed in < 1/32),
    ``("bits", packed bitmask)`` for the others."""
    out = np.empty(end - start, dtype=cn.dtype)  # only the part written is ever touched
    mask = np.empty(min(end - start, _CPU_CHUNK), dtype=np.bool_)
    count = 0
    steps: list[tuple[str, Any]] = []
    for s in range(start, end, _CPU_CHUNK):
        e = min(end, s + _CPU_CHUNK)
        m = mask[: e - s]
        np.not_equal(cn[s:e], bn[s:e], out=m)
        c = int(np.count_nonzero(m))
        if 32 * c < e - s:
            idx = np.flatnonzero(m)
            np.take(cn[s:e], idx, out=out[count : count + c])
            steps.append(("idx", idx))
        else:
            if c == e - s:
                out[count : count + c] = cn[s:e]
            else:
                np.compress(m, cn[s:e], out=out[count : count + c])
            steps.append(("bits", np.packbits(m, bitorder="little")))
        count += c
    return out, count, steps


def _encode_numpy(np: Any, cur: Tensor, base: Tensor) -> Encoded:
    """The CPU path: compare, count and select in cache-sized steps, over a few threads (numpy releases the
    GIL), then the encoding: indices or bitmask assembled from the steps' own positions."""
    cn = bits_of(cur).reshape(-1).numpy()
    bn = bits_of(base).reshape(-1).numpy()
    n = cn.size
    n_steps = (n + _CPU_CHUNK - 1) // _CPU_CHUNK
    workers = max(1, min(torch.get_num_threads(), 8, n_steps // 2))
    if workers == 1:
        parts = [_scan(np, cn, bn, 0, n)]
    else:
        per = (n_steps + workers - 1) // workers * _CPU_CHUNK
        parts = map_threads(lambda s: _scan(np, cn, bn, s, min(n, s + per)), range(0, n, per))
    count = sum(p[1] for p in parts)
    encoding = _choose(n, count, cn.itemsize)
    if encoding == "none":
        return Encoded("none", 0)
    if encoding == "dense" and count < n:
        return Encoded("dense", count, cur.reshape(-1).clone())
    values_np = parts[0][0][:count] if len(parts) == 1 else np.concatenate([o[:c] for o, c, _ in parts])
    values = torch.from_numpy(values_np).view(cur.dtype)
    if encoding == "dense":
        return Encoded("dense", count, values)
    steps = [step for _, _, part in parts for step in part]
    if encoding == "bitmask":
        packed = np.empty((n + 7) // 8, dtype=np.uint8)
        for i, (kind, data) in enumerate(steps):
            s = i * _CPU_CHUNK
            e = min(n, s + _CPU_CHUNK)
            if kind == "idx":
                m = np.zeros(e - s, dtype=np.bool_)
                m[data] = True
                data = np.packbits(m, bitorder="little")
            packed[s // 8 : (e + 7) // 8] = data
        return Encoded("bitmask", count, values, torch.from_numpy(packed))
    chunks = []
    for i, (kind, data) in enumerate(steps):
        s = i * _CPU_CHUNK
        if kind == "bits":  # a dense step of a sparse tensor
            e = min(n, s + _CPU_CHUNK)
            data = np.flatnonzero(np.unpackbits(data, count=e - s, bitorder="little").view(np.bool_))
        chunks.append(data + s if s else data)
    index_dtype = np.int32 if n < 2**31 else np.int64
    idx_all = np.concatenate(chunks).astype(index_dtype, copy=False)
    return Encoded("indices", count, values, torch.from_numpy(idx_all))


def _native() -> Any:
    """The compiled selection kernels (:mod:`ram_live.store.native_select`), or None: the numpy path."""
    from .native_select import kernels

    return kernels()


def _native_path(cur: Tensor, base: Tensor, activity: Activity) -> bool:
    """Whether :func:`encode` takes :func:`_encode_native` for this pair."""
    return (
        cur.device.type == "cpu"
        and activity.rule == "changed"
        and cur.dtype != torch.bool
        and cur.element_size() in (2, 4)
        and 0 < cur.numel() < 2**31
        and cur.is_contiguous()
        and base.is_contiguous()
        and optional_numpy() is not None
        and _native() is not None
    )


def encode_many(pairs: Sequence[tuple[Tensor, Tensor]], activity: Activity) -> list[Encoded]:
    """:func:`encode` of every pair. Pairs on the native CPU path run side by side, one thread per pair (no
    ranges to move together afterwards), balanced over the threads largest first; a pair bigger than a thread's
    share, a small one, and every other pair, is encoded alone (spread over the threads where its path does)."""
    workers = max(1, min(torch.get_num_threads(), 8))
    total = sum(cur.numel() for cur, _ in pairs)
    side = [
        i
        for i, (cur, base) in enumerate(pairs)  # small pairs: a thread costs more than it gives
        if workers > 1 and _NATIVE_MIN_SPLIT <= cur.numel() <= total // workers and _native_path(cur, base, activity)
    ]
    out: list[Encoded | None] = [None] * len(pairs)
    chosen = set(side)
    for i, (cur, base) in enumerate(pairs):
        if i not in chosen:
            out[i] = encode(cur, base, activity)
    queues: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for i in sorted(side, key=lambda i: -pairs[i][0].numel()):
        w = loads.index(min(loads))
        queues[w].append(i)
        loads[w] += pairs[i][0].numel()

    def run(queue: list[int]) -> None:
        for i in queue:
            out[i] = encode(*pairs[i], activity, split=False)

    map_threads(run, [q for q in queues if q])
    return [enc for enc in out if enc is not None]


_NATIVE_MIN_SPLIT = 1 << 20  # entries: tensors at least this big are split over threads


def _ranges(n: int, workers: int, align: int) -> list[tuple[int, int]]:
    """[0, n) in ``workers`` nearly equal ranges starting at multiples of ``align`` (whole bitmask bytes)."""
    per = -(-n // workers // align) * align
    return [(s, min(n, s + per)) for s in range(0, n, per)] if per else [(0, n)]


def _encode_native(np: Any, native: Any, cur: Tensor, base: Tensor, split: bool = True) -> Encoded:
    """The CPU path with :mod:`ram_live.store.native_select`'s kernels: one pass per range of the tensor (ranges over
    threads) writes the bitmask, the changed values and (while they may still be the smaller encoding) the int32
    indices, each range at its own offset; the ranges' values and indices are then moved together."""
    from .native_select import ALIGN

    cn = bits_of(cur).reshape(-1).numpy()
    bn = bits_of(base).reshape(-1).numpy()
    n, size = cn.size, cn.itemsize
    # int32 indices are the smaller encoding iff 4 * count <= ceil(n / 8) (see _choose; n < 2^31 here): while
    # they may be, a range writes them
    cap = (n + 7) // 8 // 4
    workers = max(1, min(torch.get_num_threads(), 8, n // _NATIVE_MIN_SPLIT)) if split else 1
    ranges = _ranges(n, workers, ALIGN)
    bits = np.empty((n + 7) // 8, dtype=np.uint8)
    vals = np.empty(n, dtype=cn.dtype)  # only the part written is ever touched
    for fresh in (bits, vals):  # first-touch faults of fresh output cost as much as the pass itself here
        advise_hugepages(torch.from_numpy(fresh))
    idx = np.empty(len(ranges) * (cap + 32), dtype=np.int32)
    a, b, pb, pv, pi = cn.ctypes.data, bn.ctypes.data, bits.ctypes.data, vals.ctypes.data, idx.ctypes.data

    def run(r: int) -> int:
        s, e = ranges[r]
        return native.select(
            a + s * size, b + s * size, e - s, pb + s // 8, pv + s * size, size, pi + 4 * r * (cap + 32), cap, s
        )

    counts = map_threads(run, range(len(ranges)))
    count = sum(counts)
    encoding = _choose(n, count, size)
    if encoding == "none":
        return Encoded("none", 0)
    if encoding == "dense" and count < n:
        return Encoded("dense", count, cur.reshape(-1).clone())
    done = counts[0]
    for r in range(1, len(ranges)):  # move each range's values (and indices) after the previous ones
        c, s = counts[r], ranges[r][0]
        ctypes.memmove(pv + done * size, pv + s * size, c * size)
        if encoding == "indices":
            ctypes.memmove(pi + 4 * done, pi + 4 * r * (cap + 32), 4 * c)
        done += c
    values = torch.from_numpy(vals[:count]).view(cur.dtype)
    if encoding == "dense":
        return Encoded("dense", count, values)
    if encoding == "bitmask":
        return Encoded("bitmask", count, values, torch.from_numpy(bits))
    return Encoded("indices", count, values, torch.from_numpy(idx[:count]))


def _check_positions(flat: Tensor, encoding: str, values: Tensor, positions: Tensor, where: str) -> None:
    """Positions that a checksummed file holds are the writer's; these checks keep a damaged or forged file of a
    legacy (unchecksummed) snapshot from reaching an index error or the wrong entries."""
    n = flat.numel()
    if encoding == "indices":
        if positions.numel() != values.numel():
            raise CorruptSnapshotError(f"{where}: {positions.numel()} indices for {values.numel()} values")
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= n):
            raise CorruptSnapshotError(f"{where}: an index outside [0, {n})")
    elif encoding == "bitmask":
        if positions.numel() != (n + 7) // 8:  # its count of set bits is checked while applying
            raise CorruptSnapshotError(f"{where}: a bitmask of {positions.numel()} bytes for {n} entries")
    elif encoding == "dense":
        if values.numel() != n:
            raise CorruptSnapshotError(f"{where}: {values.numel()} dense values for {n} entries")
    else:
        raise CorruptSnapshotError(f"{where}: unknown encoding {encoding!r}")


def apply_encoding(
    flat: Tensor, encoding: str, values: Tensor | None, positions: Tensor | None, where: str = "a snapshot piece"
) -> Tensor:
    """Write a piece's changed values into ``flat`` (the base's values of that piece, flat), in place
    (:class:`CorruptSnapshotError`, naming ``where``, for values and positions that do not fit the piece)."""
    if encoding == "none":
        return flat
    if values is None or (positions is None) != (encoding == "dense") or values.dtype != flat.dtype:
        raise CorruptSnapshotError(
            f"{where}: the values or positions of encoding {encoding!r} are missing or of another dtype"
        )
    values = values.to(flat.device).reshape(-1)
    if positions is not None:
        positions = positions.to(flat.device).reshape(-1)
        if positions.dtype not in ((torch.int32, torch.int64) if encoding == "indices" else (torch.uint8,)):
            raise CorruptSnapshotError(f"{where}: positions of dtype {positions.dtype}")
    _check_positions(flat, encoding, values, positions, where)  # type: ignore[arg-type]
    if positions is None:  # dense (checked above: every other encoding has positions)
        return flat.copy_(values)
    np = optional_numpy() if flat.device.type == "cpu" and flat.dtype != torch.bool and flat.is_contiguous() else None
    if np is not None:  # CPU: numpy's scatter is several times faster than masked_scatter_
        fn = bits_of(flat).numpy()
        vn = bits_of(values.contiguous()).numpy()
        if encoding == "indices":
            fn[positions.numpy()] = vn
        else:
            pn = positions.numpy()
            done, over = 0, False
            for s in range(0, fn.size, _CPU_CHUNK):
                e = min(fn.size, s + _CPU_CHUNK)
                bits = np.unpackbits(pn[s // 8 : (e + 7) // 8], count=e - s, bitorder="little").view(np.bool_)
                idx = np.flatnonzero(bits)
                if done + idx.size > vn.size:
                    over = True
                    break
                fn[s:e][idx] = vn[done : done + idx.size]
                done += idx.size
            if over or done != vn.size:
                raise CorruptSnapshotError(f"{where}: the bitmask does not mark as many entries as there are values")
        return flat
    if encoding == "indices":
        flat[positions.to(torch.int64)] = values
    else:
        mask = unpack_bits(positions, flat.numel())
        if int(mask.sum()) != values.numel():
            raise CorruptSnapshotError(f"{where}: the bitmask does not mark as many entries as there are values")
        flat.masked_scatter_(mask, values)
    return flat
