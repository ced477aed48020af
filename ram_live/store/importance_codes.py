"""The codec of the importances stored with a snapshot (the concept: :mod:`ram_live.importance`): kept only at
the snapshot's active entries, next to its changed values, as 8-bit log-scale codes with one float32 maximum per
piece.

Only ratios between agents matter, entry by entry, so a code keeps an importance to within a relative 1/16
(±6.25 %): a code is the float32's exponent and mantissa rounded to 3 bits, counted down from the piece's
maximum's (``q = 255``; eighths of an octave, so 254 codes span 31.75 octaves), ``q = 0`` for 0; integer
operations only, and decoding is exact (a float32 with a 3-bit mantissa). Importances below about
``max · 2^(−31.75)`` (≈ 3e-10 of the piece's largest) are stored as code 1 (not 0: an entry that had curvature
keeps some). The top octave is capped at 2039 (a maximum from 1.9375 · 2^127 up would round to 2040, which
decodes as Inf). A snapshot's importances read back as a :class:`TensorSource` of bfloat16 tensors (exact: a
decoded importance has a 3-bit mantissa; float32 on request, the same values) of the parameters' shapes, zero
at inactive entries (never used: RAM weights only active agents). The native encoder and decoder
(:mod:`ram_live.store.native_codes`) run where they can; the torch paths here give the same bits everywhere else.

>>> writer.snapshot(model, step=50, importance=adam_importance(opt, model))               # doctest: +SKIP
>>> snap = store.latest("coder"); snap.importance.get("w")                                # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..io.distributed import is_dtensor
from ..errors import ConfigError, InputMismatchError
from ..io.sources import TensorSpec
from .encoding import Encoded, unpack_bits
from .errors import CorruptSnapshotError
from .format import Box, box_of, intersect

if TYPE_CHECKING:
    from .reading import Snapshot

IMPORTANCE_VERSION = 3  # the manifest version of snapshots with importances (without: still version 2)
ENCODING = "log8"
STEPS = 8  # codes per octave
HEAD = {"encoding": ENCODING, "steps_per_octave": STEPS}  # the manifest's "importance" object


TOP_OCTAVE = 2039  # 1.875 · 2^127: values from 1.9375 · 2^127 up round to it (2040 would decode as Inf)


def _octaves(bits: Tensor) -> Tensor:
    """float32 bits → exponent and 3 mantissa bits, rounded to nearest: eighths of an octave (int32), at most
    ``TOP_OCTAVE``."""
    return ((bits + (1 << 19)) >> 20).clamp_(max=TOP_OCTAVE)


def quantize(h: Tensor) -> tuple[Tensor, float]:
    """Non-negative finite float ``h`` → (uint8 codes, float32 maximum as a Python float). A code is the float32's
    exponent and its mantissa rounded to 3 bits (integer operations only), relative to the maximum's."""
    h = h.float()
    m = float(h.max()) if h.numel() else 0.0
    if m == 0.0:
        return torch.zeros(h.shape, dtype=torch.uint8, device=h.device), 0.0
    top = int(_octaves(torch.tensor(m, dtype=torch.float32).view(torch.int32)))
    q = _octaves(h.view(torch.int32)).add_(255 - top).clamp_(max(1, 256 - top), 255)
    return q.masked_fill_(h <= 0, 0).to(torch.uint8), m


def dequantize(codes: Tensor, maximum: float) -> Tensor:
    """uint8 codes of a piece with ``maximum`` → float32 importances (0 for code 0): exact, a float32 with a
    3-bit mantissa."""
    top = int(_octaves(torch.tensor(maximum, dtype=torch.float32).view(torch.int32)))
    bits = (codes.to(torch.int32) + (top - 255)) << 20
    return bits.masked_fill_(codes == 0, 0).view(torch.float32)


def local_importance(
    importance: Mapping[str, Any], key: str, shape: Sequence[int], agent: str, device: torch.device
) -> Tensor:
    """The importances of tensor ``key`` as this process holds it (a DTensor's local shard), flat and checked:
    :class:`InputMismatchError` naming agent and tensor for a missing key, a wrong shape, or a negative, NaN or
    Inf entry."""
    if key not in importance:
        raise InputMismatchError(
            f"importance of agent {agent!r} has no tensor {key!r} (every parameter of a "
            "snapshot with importances needs one; give zeros where there is no information)",
            key=key,
            agent=agent,
        )
    t = importance[key]
    if is_dtensor(t):
        t = t.to_local()
    if not isinstance(t, Tensor) or tuple(t.shape) != tuple(shape):
        raise InputMismatchError(
            f"importance of agent {agent!r}, tensor {key!r}: shape "
            f"{list(getattr(t, 'shape', []))}, the parameter's (local) shape is {list(shape)}",
            key=key,
            agent=agent,
        )
    if not t.dtype.is_floating_point:
        raise InputMismatchError(
            f"importance of agent {agent!r}, tensor {key!r}: dtype {t.dtype} is not floating point",
            key=key,
            agent=agent,
        )
    return t.detach().to(device).reshape(-1)


def check_values(flat: Tensor, where: Tensor | None, key: str, agent: str) -> None:
    """:class:`InputMismatchError` naming agent, tensor and flat index for a negative, NaN or Inf entry of the
    importances a snapshot stores (``flat`` at its stored entries; ``where``: their flat indices, None: all)."""
    if not flat.numel() or (bool(flat.min() >= 0) and bool(flat.max() < math.inf)):
        return
    bad = int((~(flat >= 0) | torch.isinf(flat)).nonzero()[0, 0])
    index = bad if where is None else int(where[bad])
    raise InputMismatchError(
        f"importance of agent {agent!r}, tensor {key!r}: flat index {index} is "
        f"{float(flat[bad])} (importances must be finite and >= 0)",
        key=key,
        agent=agent,
    )


def encode_active(flat: Tensor, enc: Encoded, key: str, agent: str) -> tuple[Tensor, float] | None:
    """The codes of ``flat`` (a tensor's importances) at ``enc``'s stored entries, on the CPU, and their maximum;
    None for a piece that stores nothing. Those entries are checked (:func:`check_values`); the others are
    never stored nor used. The native encoder (:mod:`ram_live.store.native_codes`) where it runs, else torch: the
    same bits."""
    if enc.encoding == "none":
        return None
    got = _encode_native(flat, enc)
    return got if got is not None else encode_active_torch(flat, enc, key, agent)


def _native_kind(enc: Encoded) -> str:
    if enc.encoding == "indices":
        assert enc.positions is not None
        return "indices64" if enc.positions.dtype == torch.int64 else "indices32"
    return enc.encoding


def _encode_native(flat: Tensor, enc: Encoded) -> tuple[Tensor, float] | None:
    """:func:`encode_active` by the native encoder, or None where it does not run or finds a bad importance (the
    torch path then names it)."""
    from .native_codes import DTYPES, kernels

    pos = enc.positions
    if (
        flat.device.type != "cpu"
        or flat.dtype not in DTYPES
        or not flat.is_contiguous()
        or (
            pos is not None
            and (
                pos.device.type != "cpu"
                or not pos.is_contiguous()
                or pos.dtype not in (torch.int32, torch.int64, torch.uint8)
            )
        )
    ):
        return None
    lib = kernels()
    if lib is None:
        return None
    got = lib.encode(flat, _native_kind(enc), pos, flat.numel() if enc.encoding == "dense" else enc.count)
    return None if isinstance(got, int) else got


def encode_active_torch(flat: Tensor, enc: Encoded, key: str, agent: str) -> tuple[Tensor, float] | None:
    """:func:`encode_active` with torch operations (any device and floating dtype)."""
    if enc.encoding == "none":
        return None
    where = None
    if enc.encoding == "dense":
        active = flat
    elif enc.encoding == "indices":
        assert enc.positions is not None
        where = enc.positions.to(flat.device, torch.int64)
        active = flat[where]
    else:
        assert enc.positions is not None
        mask = unpack_bits(enc.positions.to(flat.device), flat.numel())
        active = flat[mask]
        where = mask.nonzero().view(-1) if not (bool(active.min() >= 0) and bool(active.max() < math.inf)) else None
    check_values(active, where, key, agent)
    codes, m = quantize(active)
    return codes.cpu(), m


def _flat_positions(p: Mapping[str, Any], n: int, positions: Tensor | None) -> Tensor | None:
    if p["encoding"] == "dense":
        return None
    assert positions is not None
    if p["encoding"] == "indices":
        return positions.to(torch.int64)
    return unpack_bits(positions, n).nonzero().view(-1)


class ImportanceSource:
    """A snapshot's stored importances as a :class:`TensorSource`: bfloat16 (``dtype``; float32 gives the same
    values: a decoded importance has a 3-bit mantissa, so bfloat16 holds it exactly in half the bytes a merge
    reads), the parameters' shapes, 0 at entries the snapshot did not store. Keys: the snapshot's non-buffer
    floating tensors (aliases resolve to them)."""

    def __init__(self, snapshot: Snapshot, dtype: torch.dtype = torch.bfloat16) -> None:
        if dtype not in (torch.bfloat16, torch.float32):
            raise ConfigError(f"stored importances read as bfloat16 or float32, not {dtype}")
        self.dtype = dtype
        self.snapshot = snapshot
        self.name = f"importance of {snapshot.name}"
        self.device = snapshot.device
        self._tensors = snapshot.records()
        self._aliases = {a: t for a, t in snapshot.aliases().items() if t in self._keys_set()}

    def _keys_set(self) -> set[str]:
        return {k for k, e in self._tensors.items() if has_importance(e)}

    def keys(self) -> list[str]:
        return sorted(self._keys_set()) + sorted(self._aliases)

    def spec(self, key: str) -> TensorSpec:
        e = self._tensors[self._aliases.get(key, key)]
        return TensorSpec(tuple(e["shape"]), self.dtype, self.device, False)

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def get(self, key: str) -> Tensor:
        key = self._aliases.get(key, key)
        shape = tuple(self._tensors[key]["shape"])
        return self.get_box(key, (0,) * len(shape), shape)

    def get_box(self, key: str, offsets: Sequence[int], shape: Sequence[int]) -> Tensor:
        """The box ``offsets`` + ``shape`` of tensor ``key``'s importances."""
        key = self._aliases.get(key, key)
        snap = self.snapshot
        want: Box = (tuple(offsets), tuple(shape))
        out: Tensor | None = None  # zeros only where no single piece is the whole box (their faults cost)
        for i, p in enumerate(self._tensors[key]["pieces"]):
            if p["encoding"] == "none" or (inter := intersect(want, box_of(p))) is None:
                continue
            codes = snap.stored(p["file"], p["importance"])
            if codes is None:  # the manifest's check requires it: only a table changed after that check lacks it
                raise CorruptSnapshotError(
                    f"agent {snap.agent!r} step {snap.step}: tensor {key!r} piece {i}: no importances stored",
                    agent=snap.agent,
                    step=snap.step,
                )
            box = box_of(p)
            n = math.prod(box[1])
            positions = snap.stored(p["file"], p.get("positions"))
            piece = decode_piece(codes, float(p["importance_max"]), p["encoding"], positions, n, self.dtype)
            if piece is None:
                raise CorruptSnapshotError(
                    f"agent {snap.agent!r} step {snap.step}: tensor {key!r} piece {i}: "
                    "importances do not match the stored positions",
                    agent=snap.agent,
                    step=snap.step,
                )
            mine, theirs = inter
            if want == box:
                out = piece.view(box[1])  # the whole piece: no copy
                continue
            if out is None:
                out = torch.zeros(want[1], dtype=self.dtype)
            out[tuple(mine)] = piece.view(box[1])[tuple(theirs)]
        if out is None:
            out = torch.zeros(want[1], dtype=self.dtype)
        return out.to(self.device)


def decode_piece(
    codes: Tensor, maximum: float, encoding: str, positions: Tensor | None, n: int, dtype: torch.dtype = torch.float32
) -> Tensor | None:
    """A stored piece's importances as ``dtype`` (float32 or bfloat16: the same values), flat, 0 at the entries
    it does not store (native decoder where it runs, else torch: the same bits), or None where its positions do
    not match its codes."""
    from .native_codes import kernels

    lib = kernels()
    want = {"dense": (None,), "indices": (torch.int32, torch.int64), "bitmask": (torch.uint8,)}.get(encoding, ())
    if (
        lib is not None
        and codes.device.type == "cpu"
        and codes.dtype == torch.uint8
        and codes.is_contiguous()
        and (None if positions is None else positions.dtype) in want
        and (positions is None or (positions.device.type == "cpu" and positions.is_contiguous()))
    ):
        kind = encoding if encoding != "indices" else "indices64" if positions.dtype == torch.int64 else "indices32"
        return lib.decode(codes, maximum, kind, positions, n, dtype)
    got = decode_piece_torch(codes, maximum, encoding, positions, n)
    return None if got is None else got.to(dtype)


def decode_piece_torch(codes: Tensor, maximum: float, encoding: str, positions: Tensor | None, n: int) -> Tensor | None:
    """:func:`decode_piece` with torch operations."""
    idx = _flat_positions({"encoding": encoding}, n, positions)
    values = dequantize(codes, maximum)
    if idx is None:
        return values if values.numel() == n else None
    if idx.numel() != values.numel() or (idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n)):
        return None
    return torch.zeros(n, dtype=torch.float32).index_copy_(0, idx, values)


def has_importance(entry: Mapping[str, Any]) -> bool:
    """Whether a manifest's tensor entry is one that carries importances (a floating non-buffer tensor)."""
    return not entry.get("buffer") and entry["dtype"] in (
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
    )
