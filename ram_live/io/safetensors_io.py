"""Zero-copy safetensors I/O over ``mmap``: tensors are views of the file's pages, read as they are touched and
released after use, so resident memory stays bounded by what is being merged now, not by the model.

The format is parsed here (8-byte header length, JSON header, raw little-endian data): no pickle, only regular
files, and the header is checked as ``safetensors`` checks it (:mod:`ram_live.io.st_header`) before a view is
made. The writer lays out each shard's header from the known output specs first, reserves the file's bytes,
then hands out writable views into the file, so tensors go straight to the page cache.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import Iterable

import torch
from torch import Tensor

from .outputs import reserve, write_all
from .st_header import DTYPE_NAMES, DTYPES, MAX_HEADER, open_regular, parse_header
from ..errors import UnsupportedInputError

__all__ = ["MappedSafetensors", "SafetensorsWriter", "DTYPES", "DTYPE_NAMES"]

_PAGE = mmap.PAGESIZE


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class MappedSafetensors:
    """One ``.safetensors`` file, memory-mapped copy-on-write (the file is never written)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        fd, st = open_regular(self.path)
        try:
            size = st.st_size
            if size < 8:
                raise UnsupportedInputError(f"{self.path}: not a safetensors file (too short)")
            self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        size = len(self._mm)  # what is mapped (the file may have changed since fstat)
        (n,) = struct.unpack("<Q", self._mm[:8])
        if n > min(MAX_HEADER, size - 8):
            raise UnsupportedInputError(f"{self.path}: not a safetensors file (header length {n}, file {size} bytes)")
        self._start = 8 + n
        self.metadata, self.entries = parse_header(self._mm[8 : 8 + n], self.path, size - self._start)

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
    lo, hi = (
        (start // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE)
        if whole
        else (-(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE)
    )
    hi = min(len(mm), hi)
    if hi > lo and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class SafetensorsWriter:
    """Writes one shard: the header first (from the specs), then each tensor through a writable view.

    The file's bytes are reserved on disk (``posix_fallocate``) before it is mapped, so a full disk is an
    :class:`~ram_live.errors.OutOfSpaceError` here, never a SIGBUS later. Where the file system cannot promise
    the space (no fallocate, or copy-on-write: btrfs, ZFS) views are anonymous memory and each tensor is written
    with ``pwrite`` when done (resident memory then holds whole tensors until they are done). ``label`` names
    the output in errors."""

    def __init__(
        self,
        path: Path,
        specs: dict[str, tuple[torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
        label: str | None = None,
    ) -> None:
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
        self.label = label or str(path)
        self._fd: int | None = None  # kept open when the file is written without mmap
        self._mm: mmap.mmap | None = None
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            write_all(fd, struct.pack("<Q", len(raw)) + raw, 0, self.label)
            reserved = reserve(fd, self.size, self.label)
            os.ftruncate(fd, self.size)
            if offset and reserved:
                self._mm = mmap.mmap(fd, self.size, access=mmap.ACCESS_WRITE)
            elif offset:  # tensors are written into anonymous memory and pwritten when done
                self._mm = mmap.mmap(-1, self.size)
                self._fd, fd = fd, -1
        except BaseException:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        if fd >= 0:
            os.close(fd)

    def view(self, key: str) -> Tensor:
        dtype, shape = self.specs[key]
        begin, end = self.offsets[key]
        if begin == end or self._mm is None:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._mm, dtype=dtype, count=_numel(shape), offset=self._start + begin).view(shape)

    def done(self, key: str, start: int = 0, stop: int | None = None) -> None:
        """``key`` (or its flat entries ``[start, stop)``) is written: let those pages leave resident memory (the
        page cache keeps them and the kernel writes them back)."""
        if self._mm is None:
            return
        begin, end = self.offsets[key]
        if self._fd is not None:
            if start != 0 or stop is not None:
                return  # written whole when the tensor is done
            with memoryview(self._mm) as mv:
                write_all(self._fd, mv[self._start + begin : self._start + end], self._start + begin, self.label)
            # anonymous pages hold the only copy of the neighbours' bytes: drop only pages wholly inside
            _dontneed(self._mm, self._start + begin, self._start + end, False)
            return
        _dontneed(
            self._mm, *_byte_range(self._start + begin, self._start + end, self.specs[key][0].itemsize, start, stop)
        )

    def close(self) -> None:
        if self._mm is not None:
            if self._fd is None:
                self._mm.flush()
            try:
                self._mm.close()
            except BufferError:  # a view is still referenced somewhere; the mapping closes when it is collected
                pass
            self._mm = None
        if self._fd is not None:
            try:
                os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None
