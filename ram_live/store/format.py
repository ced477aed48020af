"""The on-disk format: names and versions of the files, agent and manifest names, dtype names, and boxes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import UnsupportedInputError
from .errors import CorruptSnapshotError

STORE_FORMAT = "ram_live.store"
SNAPSHOT_FORMAT = "ram_live.snapshot"
BASE_FORMAT = "ram_live.base"
VERSION = 1
BASE_DIR = "_base"
_AGENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MANIFEST_RE = re.compile(r"^(\d+)\.json$")


# dtypes

_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dtype_name(dtype: torch.dtype, key: str = "?") -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise UnsupportedInputError(f"tensor {key!r} has dtype {dtype}, which the snapshot store cannot hold") from None


def _dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise CorruptSnapshotError(f"unknown dtype {name!r} in a manifest") from None


def _bits(t: Tensor) -> Tensor:
    """The same memory as integers of the same width (bit-exact comparisons; NaN == NaN, -0.0 != 0.0)."""
    return t.view(_BITS[t.element_size()])


# boxes: pieces of a tensor

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, shape) within the global tensor


def _intersect(a: Box, b: Box) -> tuple[list[slice], list[slice]] | None:
    """Slices of box ``a`` and of box ``b`` (each relative to itself) that cover their intersection."""
    sa, sb = [], []
    for (oa, na), (ob, nb) in zip(zip(*a), zip(*b)):
        lo, hi = max(oa, ob), min(oa + na, ob + nb)
        if hi <= lo:
            return None
        sa.append(slice(lo - oa, hi - oa))
        sb.append(slice(lo - ob, hi - ob))
    return sa, sb


def _box(piece: Mapping[str, Any]) -> Box:
    return tuple(piece["offsets"]), tuple(piece["shape"])

