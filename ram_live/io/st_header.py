"""Checking a safetensors header as the ``safetensors`` library does, and opening only regular files.

Everything a hostile or damaged file can hold is refused with an :class:`UnsupportedInputError` naming the file
and the key: a header that is not an object of objects with ``dtype`` / ``shape`` / ``data_offsets``, dims and
offsets that are not non-negative integers below 2**64, offsets that overlap, leave gaps or do not cover the
data exactly, duplicate keys, a ``__metadata__`` that is not a map of strings to strings, NaN/Infinity, a header
over 100,000,000 bytes (``safetensors``' own bound) and nesting past the interpreter's recursion limit (the
format needs three levels; anything deeper fails the type checks first where the parser allows it).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import torch

from ..errors import UnsupportedInputError

__all__ = ["DTYPES", "DTYPE_NAMES", "MAX_HEADER", "parse_header", "open_regular", "read_regular", "strict_json"]

#: The ``safetensors`` dtype names ram_live reads, as ``safetensors.torch`` maps them (sub-byte F4/F6 are not).
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr)
    for name, attr in (
        ("F64", "float64"),
        ("F32", "float32"),
        ("F16", "float16"),
        ("BF16", "bfloat16"),
        ("I64", "int64"),
        ("I32", "int32"),
        ("I16", "int16"),
        ("I8", "int8"),
        ("U64", "uint64"),
        ("U32", "uint32"),
        ("U16", "uint16"),
        ("U8", "uint8"),
        ("BOOL", "bool"),
        ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E5M2", "float8_e5m2"),
        ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
        ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
        ("F8_E8M0", "float8_e8m0fnu"),
        ("C64", "complex64"),
    )
    if hasattr(torch, attr)
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_ITEMSIZE = {k: v.itemsize for k, v in DTYPES.items()}
MAX_HEADER = 100_000_000
_U64 = 2**64


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {dup!r}")
    return out


def strict_json(raw: bytes | str, what: str) -> Any:
    """``json.loads`` that refuses duplicate keys, NaN/Infinity and nesting past the recursion limit, as an
    :class:`UnsupportedInputError` naming ``what``."""
    try:
        return json.loads(raw, object_pairs_hook=_unique_pairs, parse_constant=_no_constant)
    except RecursionError:
        raise UnsupportedInputError(f"{what}: its JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UnsupportedInputError(f"{what}: unreadable JSON ({exc})") from None


def _bad_shape(path: Path, key: str, shape: Any) -> UnsupportedInputError:
    return UnsupportedInputError(f"{path}: tensor {key!r} has shape {shape!r}, not a list of non-negative integers")


def _bad_offsets(path: Path, key: str, offsets: Any) -> UnsupportedInputError:
    return UnsupportedInputError(f"{path}: tensor {key!r} has data_offsets {offsets!r}, not two non-negative integers")


def _offsets(item: tuple[str, tuple[Any, Any, int, int]]) -> tuple[int, int]:
    return item[1][2], item[1][3]


def parse_header(
    raw: bytes, path: Path, data_size: int
) -> tuple[dict[str, str], dict[str, tuple[torch.dtype, tuple[int, ...], int, int]]]:
    """(metadata, {key: (dtype, shape, begin, end)}) of a header whose data section has ``data_size`` bytes."""
    header = strict_json(raw, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise UnsupportedInputError(f"{path}: the safetensors header is a {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise UnsupportedInputError(f"{path}: key '__metadata__' is not a map of strings to strings")
    entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
    for key, entry in header.items():  # plain loops and type() tests: this runs once per tensor of every file
        if type(entry) is not dict or "dtype" not in entry or "shape" not in entry or "data_offsets" not in entry:
            raise UnsupportedInputError(f"{path}: tensor {key!r} is not an object with dtype, shape and data_offsets")
        name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        dtype = DTYPES.get(name) if type(name) is str else None
        if dtype is None:
            raise UnsupportedInputError(
                f"{path}: tensor {key!r} has dtype {name!r}, which ram_live does not read "
                f"(it reads {', '.join(DTYPES)})"
            )
        if type(shape) is not list:
            raise _bad_shape(path, key, shape)
        nbytes = _ITEMSIZE[name]
        for s in shape:
            if type(s) is not int or s < 0 or s >= _U64:
                raise _bad_shape(path, key, shape)
            nbytes *= s
            if nbytes >= _U64:
                raise UnsupportedInputError(f"{path}: tensor {key!r}'s shape {shape} overflows 64 bits")
        if type(offsets) is not list or len(offsets) != 2:
            raise _bad_offsets(path, key, offsets)
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or begin < 0 or end < 0 or end >= _U64:
            raise _bad_offsets(path, key, offsets)
        if end - begin != nbytes:
            raise UnsupportedInputError(
                f"{path}: tensor {key!r} has data_offsets {begin}..{end}, which do not "
                f"hold its shape {shape} of {name} ({nbytes} bytes)"
            )
        entries[key] = (dtype, tuple(shape), begin, end)
    covered = 0
    for key, (_, _, begin, end) in sorted(entries.items(), key=_offsets):
        if begin != covered:
            what = "overlaps the tensor before it" if begin < covered else f"leaves a gap at byte {covered}"
            raise UnsupportedInputError(f"{path}: tensor {key!r} at data_offsets {begin}..{end} {what}")
        covered = end
    if covered != data_size:
        raise UnsupportedInputError(
            f"{path}: the tensors cover {covered} bytes of the data, the file holds "
            f"{data_size} (truncated, or trailing bytes)"
        )
    return metadata, entries


def open_regular(path: Path) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its stat, refused unless it is a regular file (symlinks followed):
    a FIFO, socket or device is opened non-blocking and closed again, so it can never hang the caller."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnsupportedInputError(f"{path}: no such file") from None
    except OSError as exc:
        raise UnsupportedInputError(f"{path}: cannot open ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise UnsupportedInputError(f"{path}: is {kind}")
    os.set_blocking(fd, True)
    return fd, st


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), refused past ``limit`` bytes."""
    fd, st = open_regular(path)
    try:
        if st.st_size > limit:
            raise UnsupportedInputError(f"{path}: {st.st_size} bytes, more than the {limit} ram_live reads")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsupportedInputError(f"{path}: more than the {limit} bytes ram_live reads")
    return data
