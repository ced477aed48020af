"""The on-disk format: names and versions of the files, agent, manifest and data file names, dtype names, boxes.

Every file the store writes has a name of one of the patterns here; readers and deleters accept no other name
(nothing a manifest says can point outside its folder or at another agent's or another step's files).
"""

from __future__ import annotations

import operator
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, UnsupportedInputError
from .errors import CorruptSnapshotError

STORE_FORMAT = "ram_live.store"
SNAPSHOT_FORMAT = "ram_live.snapshot"
BASE_FORMAT = "ram_live.base"
VERSION = 2  # of manifests (snapshots' and the base's); 2: every data file carries its CRC-32
READ_VERSIONS = (1, 2, 3)  # 1 (no checksums) still loads, with an UnverifiedSnapshotWarning; 3: importances
# of store.json: 2 once a snapshot of a named run is written (a ram_live without runs would take that run's
# data files for a killed writer's and collect them), 1 before
STORE_VERSION = 2
BASE_DIR = "_base"
AGENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LEGACY_RUN = "legacy"  # the run of manifests named <step>.json: every snapshot written before stores knew runs
RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_MANIFEST_RE = re.compile(r"^(\d{12,})(?:\.([A-Za-z0-9][A-Za-z0-9_-]{0,63}))?\.json$")
_NONCE = r"[0-9A-Za-z]{1,32}"
_NONCE_RE = re.compile(rf"^{_NONCE}$")
_RANK = r"(?:0|[1-9][0-9]{0,8})"
_DATA_RE = re.compile(rf"^(\d{{12,}})-{_NONCE}\.p({_RANK})\.safetensors$")
_BASE_DATA_RE = re.compile(rf"^base-{_NONCE}\.p({_RANK})\.safetensors$")
_TMP_RE = re.compile(r"^\.tmp-[0-9a-f]{1,32}-(.+)$")  # a file being written (renamed into place when whole)
_PART_RE = re.compile(rf"^\.(.+)\.p({_RANK})\.part\.json$")  # a rank's part, read by rank 0 before its manifest


def manifest_name(step: int, run: str = LEGACY_RUN) -> str:
    """The file name of the manifest of ``run``'s snapshot at ``step`` (``<step:012d>.<run>.json``; the legacy
    run's: ``<step:012d>.json``)."""
    return f"{step:012d}.json" if run == LEGACY_RUN else f"{step:012d}.{run}.json"


def manifest_key(name: str) -> tuple[int, str] | None:
    """The step and run whose manifest is called ``name`` (None for any other name, also a non-canonical one)."""
    m = _MANIFEST_RE.match(name)
    if not m:
        return None
    step, run = int(m.group(1)), m.group(2) or LEGACY_RUN
    return (step, run) if manifest_name(step, run) == name else None


def manifest_step(name: str) -> int | None:
    """The step whose manifest (of any run) is called ``name`` (None for any other name)."""
    key = manifest_key(name)
    return None if key is None else key[0]


def check_run(run: Any) -> str:
    """``run`` as a run id: 1-64 letters, digits, ``_`` or ``-``, starting with a letter or digit
    (:class:`ConfigError` otherwise); ``"legacy"`` is the run of snapshots written before stores knew runs."""
    if not isinstance(run, str) or not RUN_RE.match(run):
        raise ConfigError(
            f"a run id must be 1-64 letters, digits, '_' or '-', starting with a letter or digit, got {run!r:.80}"
        )
    return run


def new_run_id(now: float | None = None) -> str:
    """A fresh run id: the UTC start time and a random suffix (``20261206-194641-3fa2c1``)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{uuid.uuid4().hex[:6]}"


def data_step(name: str) -> int | None:
    """The step of a snapshot data file called ``name`` (None for any other name)."""
    m = _DATA_RE.match(name)
    return int(m.group(1)) if m and m.group(1) == f"{int(m.group(1)):012d}" else None


def is_base_data(name: str) -> bool:
    return _BASE_DATA_RE.match(name) is not None


def is_store_temp(name: str, base: bool) -> bool:
    """A temporary file of a write of a data file, manifest or rank part in an agent's folder (``base``: in
    ``_base``), or a rank's part: what a killed writer leaves and :meth:`SnapshotStore.gc` removes."""
    m = _TMP_RE.match(name)
    inner = m.group(1) if m else name
    if m and (
        (is_base_data(inner) or inner == "base.json")
        if base
        else (data_step(inner) is not None or manifest_step(inner) is not None)
    ):
        return True
    p = _PART_RE.match(inner)
    if not p:
        return False
    stem = f"{p.group(1)}.p0.safetensors"
    return is_base_data(stem) if base else data_step(stem) is not None


def check_step(step: Any) -> int:
    """``step`` as an int >= 0 (:class:`ConfigError` otherwise)."""
    try:
        step = operator.index(step)
    except TypeError:
        raise ConfigError(f"a snapshot step must be an integer, got {step!r}") from None
    if step < 0:
        raise ConfigError(f"a snapshot step must be >= 0, got {step}")
    return step


def check_nonce(nonce: Any) -> str:
    if not isinstance(nonce, str) or not _NONCE_RE.match(nonce):
        raise ConfigError(f"a part nonce must be 1-32 letters or digits, got {nonce!r}")
    return nonce


def check_rank(rank: Any) -> int:
    if type(rank) is not int or not 0 <= rank < 10**9:
        raise ConfigError(f"a part rank must be an integer in [0, 1e9), got {rank!r}")
    return rank


# dtypes

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ST_DTYPES = {  # the dtype names in safetensors headers
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_name(dtype: torch.dtype, key: str = "?") -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise UnsupportedInputError(f"tensor {key!r} has dtype {dtype}, which the snapshot store cannot hold") from None


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise CorruptSnapshotError(f"unknown dtype {name!r} in a manifest") from None


def bits_of(t: Tensor) -> Tensor:
    """The same memory as integers of the same width (bit-exact comparisons; NaN == NaN, -0.0 != 0.0)."""
    return t.view(_BITS[t.element_size()])


# boxes: pieces of a tensor

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, shape) within the global tensor


def intersect(a: Box, b: Box) -> tuple[list[slice], list[slice]] | None:
    """Slices of box ``a`` and of box ``b`` (each relative to itself) that cover their intersection."""
    sa, sb = [], []
    for (oa, na), (ob, nb) in zip(zip(*a), zip(*b)):
        lo, hi = max(oa, ob), min(oa + na, ob + nb)
        if hi <= lo:
            return None
        sa.append(slice(lo - oa, hi - oa))
        sb.append(slice(lo - ob, hi - ob))
    return sa, sb


def box_of(piece: Mapping[str, Any]) -> Box:
    return tuple(piece["offsets"]), tuple(piece["shape"])


# the names store/importance_codes.py imports until it takes the public ones
