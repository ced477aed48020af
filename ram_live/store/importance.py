"""Importances stored with a snapshot (curvature-aware RAM, docs/curvature.md): kept only at the snapshot's active
entries, next to its changed values, as 8-bit log-scale codes with one float32 maximum per piece.

Only ratios between agents matter, entry by entry, so a code keeps an importance to within a relative 2^(1/16)
(±4.4 %) of its piece's maximum's scale: ``h = max · 2^((q − 255) / 8)`` for ``q`` in 1..255, ``q = 0`` for 0.
Importances below ``max · 2^(−254/8)`` (≈ 3e-10 of the piece's largest) are stored as code 1 (not 0: an entry
that had curvature keeps some). A snapshot's importances read back as a :class:`TensorSource` of float32
tensors of the parameters' shapes, zero at inactive entries (never used: RAM weights only active agents).

>>> writer.snapshot(model, step=50, importance=adam_importance(opt, model))               # doctest: +SKIP
>>> snap = store.latest("coder"); snap.importance.get("w")                                # doctest: +SKIP
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..distributed import is_dtensor
from ..errors import InputMismatchError
from ..sources import TensorSpec
from .encoding import _Encoded, unpack_bits
from .errors import CorruptSnapshotError, StoreWarning
from .format import Box, _box, _intersect

if TYPE_CHECKING:
    from .reading import Snapshot

IMPORTANCE_VERSION = 3  # the manifest version of snapshots with importances (without: still version 2)
ENCODING = "log8"
STEPS = 8  # codes per octave
HEAD = {"encoding": ENCODING, "steps_per_octave": STEPS}  # the manifest's "importance" object


def quantize(h: Tensor) -> tuple[Tensor, float]:
    """Non-negative finite float ``h`` → (uint8 codes, float32 maximum as a Python float)."""
    h = h.float()
    m = float(h.max()) if h.numel() else 0.0
    if m == 0.0:
        return torch.zeros(h.shape, dtype=torch.uint8, device=h.device), 0.0
    q = torch.log2(h / m).mul_(STEPS).round_().add_(255).clamp_(1, 255)
    return torch.where(h > 0, q, torch.zeros_like(q)).to(torch.uint8), m


def dequantize(codes: Tensor, maximum: float) -> Tensor:
    """uint8 codes of a piece with ``maximum`` → float32 importances (0 for code 0)."""
    q = codes.to(torch.float32)
    h = torch.exp2((q - 255.0) / STEPS) * torch.tensor(maximum, dtype=torch.float32)
    return torch.where(codes > 0, h, torch.zeros_like(h))


def local_importance(importance: Mapping[str, Any], key: str, shape: Sequence[int], agent: str,
                     device: torch.device) -> Tensor:
    """The importances of tensor ``key`` as this process holds it (a DTensor's local shard), flat and checked:
    :class:`InputMismatchError` naming agent and tensor for a missing key, a wrong shape, or a negative, NaN or
    Inf entry."""
    if key not in importance:
        raise InputMismatchError(f"importance of agent {agent!r} has no tensor {key!r} (every parameter of a "
                                 "snapshot with importances needs one; give zeros where there is no information)",
                                 key=key, agent=agent)
    t = importance[key]
    if is_dtensor(t):
        t = t.to_local()
    if not isinstance(t, Tensor) or tuple(t.shape) != tuple(shape):
        raise InputMismatchError(f"importance of agent {agent!r}, tensor {key!r}: shape "
                                 f"{list(getattr(t, 'shape', []))}, the parameter's (local) shape is {list(shape)}",
                                 key=key, agent=agent)
    if not t.dtype.is_floating_point:
        raise InputMismatchError(f"importance of agent {agent!r}, tensor {key!r}: dtype {t.dtype} is not floating "
                                 "point", key=key, agent=agent)
    t = t.detach().to(device).reshape(-1)
    bad = ~(t >= 0) | torch.isinf(t)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        raise InputMismatchError(f"importance of agent {agent!r}, tensor {key!r}: flat index {index} is "
                                 f"{float(t[index])} (importances must be finite and >= 0)", key=key, agent=agent)
    return t


def encode_active(flat: Tensor, enc: _Encoded) -> tuple[Tensor, float] | None:
    """The codes of ``flat`` (a tensor's importances) at ``enc``'s stored entries, on the CPU, and their maximum;
    None for a piece that stores nothing."""
    if enc.encoding == "none":
        return None
    if enc.encoding == "dense":
        active = flat
    elif enc.encoding == "indices":
        assert enc.positions is not None
        active = flat[enc.positions.to(flat.device, torch.int64)]
    else:
        assert enc.positions is not None
        active = flat[unpack_bits(enc.positions.to(flat.device), flat.numel())]
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
    """A snapshot's stored importances as a :class:`TensorSource`: float32, the parameters' shapes, 0 at entries
    the snapshot did not store. Keys: the snapshot's non-buffer floating tensors (aliases resolve to them)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.name = f"importance of {snapshot.name}"
        self.device = snapshot.device
        self._tensors = snapshot._tensors
        self._aliases = {a: t for a, t in snapshot._aliases.items() if t in self._keys_set()}

    def _keys_set(self) -> set[str]:
        return {k for k, e in self._tensors.items() if has_importance(e)}

    def keys(self) -> list[str]:
        return sorted(self._keys_set()) + sorted(self._aliases)

    def spec(self, key: str) -> TensorSpec:
        e = self._tensors[self._aliases.get(key, key)]
        return TensorSpec(tuple(e["shape"]), torch.float32, self.device, False)

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
        out = torch.zeros(want[1], dtype=torch.float32)
        for i, p in enumerate(self._tensors[key]["pieces"]):
            if p["encoding"] == "none" or (inter := _intersect(want, _box(p))) is None:
                continue
            codes = snap._files.tensor(p["file"], p["importance"])
            assert codes is not None  # the manifest's check: a stored piece of a parameter has importances
            box = _box(p)
            n = math.prod(box[1])
            idx = _flat_positions(p, n, snap._files.tensor(p["file"], p.get("positions")))
            values = dequantize(codes, float(p["importance_max"]))
            if idx is not None and (idx.numel() != values.numel() or (idx.numel() and int(idx[-1]) >= n)):
                raise CorruptSnapshotError(f"agent {snap.agent!r} step {snap.step}: tensor {key!r} piece {i}: "
                                           "importances do not match the stored positions",
                                           agent=snap.agent, step=snap.step)
            piece = values.view(box[1]) if idx is None else \
                torch.zeros(n, dtype=torch.float32).index_copy_(0, idx, values).view(box[1])
            mine, theirs = inter
            out[tuple(mine)] = piece[tuple(theirs)]
        return out.to(self.device)


def has_importance(entry: Mapping[str, Any]) -> bool:
    """Whether a manifest's tensor entry is one that carries importances (a floating non-buffer tensor)."""
    return not entry.get("buffer") and entry["dtype"] in ("float64", "float32", "float16", "bfloat16",
                                                          "float8_e4m3fn", "float8_e5m2")


def stored_importance(models: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The importances a merge of ``models`` takes from the store: ``({agent name: source}, "store")`` when every
    agent is a snapshot with importances; ``(None, None)`` when none has them or the agents are not snapshots;
    ``(None, None)`` and a :class:`StoreWarning` when only some have them (plain RAM for all)."""
    if isinstance(models, Mapping):
        items = list(models.items())
    elif isinstance(models, Sequence) and not isinstance(models, (str, bytes)):
        items = [(getattr(m, "name", str(i)), m) for i, m in enumerate(models)]
    else:
        return None, None
    found = {name: getattr(m, "importance", None) for name, m in items if hasattr(m, "importance")}
    if not found or len(found) != len(items):
        return None, None
    have = {n: s for n, s in found.items() if s is not None}
    if not have:
        return None, None
    if len(have) < len(found):
        missing = sorted(str(n) for n in found if found[n] is None)
        warnings.warn(StoreWarning(
            f"snapshots of {', '.join(map(repr, sorted(map(str, have))))} carry importances but those of "
            f"{', '.join(map(repr, missing))} do not: merging without importances (plain RAM); pass importance= "
            "for every agent to weigh them"), stacklevel=3)
        return None, None
    return have, "store"
