"""Zero-copy safetensors I/O over ``mmap``: tensors are views of the file's pages, read as they are touched and
released after use, so resident memory stays bounded by what is being merged now, not by the model.

The format is parsed here (8-byte header length, JSON header, raw little-endian data): no pickle, and every
offset is checked against the file before a view is made. The writer lays out each shard's header from the
known output specs first, then hands out writable views into the file, so tensors go straight to the page cache.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Iterable

import torch
from torch import Tensor

from .errors import UnsupportedInputError

__all__ = ["MappedSafetensors", "SafetensorsWriter", "DTYPES", "DTYPE_NAMES"]

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_PAGE = mmap.PAGESIZE
_MAX_HEADER = 100 * 2**20


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class MappedSafetensors:
    """One ``.safetensors`` file, memory-mapped copy-on-write (the file is never written)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise UnsupportedInputError(f"{self.path}: not a safetensors file (too short)")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        (n,) = struct.unpack("<Q", self._mm[:8])
        if n > min(_MAX_HEADER, size - 8):
            raise UnsupportedInputError(f"{self.path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(self._mm[8 : 8 + n])
        except ValueError as exc:
            raise UnsupportedInputError(f"{self.path}: unreadable safetensors header ({exc})") from None
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._start = 8 + n
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for key, entry in header.items():
            dtype = DTYPES.get(entry.get("dtype"))
            if dtype is None:
                raise UnsupportedInputError(f"{self.path}: tensor {key!r} has dtype {entry.get('dtype')}, which "
                                            "ram_live does not read")
            shape = tuple(int(s) for s in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
            if not (0 <= begin <= end <= size - self._start) or end - begin != _numel(shape) * dtype.itemsize:
                raise UnsupportedInputError(f"{self.path}: tensor {key!r} has offsets {begin}..{end} that do not "
                                            f"fit its shape {list(shape)} or the file")
            self.entries[key] = (dtype, shape, begin, end)

    def keys(self) -> list[str]:
        return list(self.entries)

    def tensor(self, key: str) -> Tensor:
        """A view of ``key``'s bytes (no copy; pages are read when touched)."""
        dtype, shape, begin, end = self.entries[key]
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._mm, dtype=dtype, count=_numel(shape), offset=self._start + begin).view(shape)

    def release(self, key: str, start: int = 0, stop: int | None = None) -> None:
        """Drop ``key``'s pages (or those wholly inside its flat entries ``[start, stop)``) from this process's
        resident memory; they stay in the page cache, and a later read maps them again."""
        dtype, _, begin, end = self.entries[key]
        _dontneed(self._mm, *_byte_range(self._start + begin, self._start + end, dtype.itemsize, start, stop))


def _byte_range(begin: int, end: int, itemsize: int, start: int, stop: int | None) -> tuple[int, int, bool]:
    """Bytes of flat entries ``[start, stop)`` of a tensor at ``[begin, end)``, and whether that is all of it."""
    if start == 0 and stop is None:
        return begin, end, True
    return begin + start * itemsize, min(end, begin + (stop if stop is not None else end) * itemsize), False


def _dontneed(mm: mmap.mmap, start: int, end: int, whole: bool = True) -> None:
    """MADV_DONTNEED over ``[start, end)``: every page it touches when ``whole`` (a whole tensor), else only the
    pages inside it (a range of a tensor whose neighbours other threads may still be using: dropping theirs
    would only cost a fault again, but nothing is gained)."""
    lo, hi = (start // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE) if whole else (-(-start // _PAGE) * _PAGE,
                                                                                end // _PAGE * _PAGE)
    hi = min(len(mm), hi)
    if hi > lo and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class SafetensorsWriter:
    """Writes one shard: the header first (from the specs), then each tensor through a writable view."""

    def __init__(self, path: Path, specs: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, object] = {"__metadata__": dict(metadata or {})}
        offset = 0
        self.offsets: dict[str, tuple[int, int]] = {}
        for key, (dtype, shape) in specs.items():
            n = _numel(shape) * dtype.itemsize
            header[key] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
            self.offsets[key] = (offset, offset + n)
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(len(raw)) % 8)
        self.path = path
        self.specs = specs
        self._start = 8 + len(raw)
        self.size = self._start + offset
        with open(path, "wb+") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(self.size)
            self._mm = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_WRITE) if offset else None

    def view(self, key: str) -> Tensor:
        dtype, shape = self.specs[key]
        begin, end = self.offsets[key]
        if begin == end or self._mm is None:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._mm, dtype=dtype, count=_numel(shape), offset=self._start + begin).view(shape)

    def done(self, key: str, start: int = 0, stop: int | None = None) -> None:
        """``key`` (or its flat entries ``[start, stop)``) is written: let those pages leave resident memory (the
        page cache keeps them and the kernel writes them back)."""
        if self._mm is not None:
            begin, end = self.offsets[key]
            _dontneed(self._mm, *_byte_range(self._start + begin, self._start + end, self.specs[key][0].itemsize,
                                             start, stop))

    def close(self) -> None:
        if self._mm is not None:
            self._mm.flush()
            try:
                self._mm.close()
            except BufferError:  # a view is still referenced somewhere; the mapping closes when it is collected
                pass
            self._mm = None
