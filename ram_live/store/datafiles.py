"""Data files: safetensors written with their CRC-32 (computed while the bytes are written), opened without
following symlinks (regular files only), checked against their manifest's requirements, and verified against
its checksum before their first tensor is used."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import stat
import struct
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from torch import Tensor

from .checksum import crc_range, crc32, crc_hex
from .errors import CorruptSnapshotError, SnapshotNotFoundError
from .files import fsync_dir, tmp_name
from .format import ST_DTYPES, dtype_name
from .manifest import FileEntry

_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_WRITE_STEP = 1 << 20  # bytes written, then checksummed, at a time


def _byte_view(t: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (the tensor must outlive the view)."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


def _write_all(fd: int, buf: memoryview) -> None:
    while len(buf):
        done = os.write(fd, buf)
        buf = buf[done:]


def _write_and_checksum(fd: int, buffers: Sequence[memoryview]) -> int:
    """Write ``buffers`` to ``fd`` a MiB at a time, each MiB's CRC-32 right after its write (the bytes are then
    still in the cache); returns the CRC-32 of all of them. (A checksum thread one step behind the writes was
    slower on this project's 2-core machine: no core is free there.)"""
    crc = 0
    for buf in buffers:
        for s in range(0, len(buf), _WRITE_STEP):
            step = buf[s : s + _WRITE_STEP]
            _write_all(fd, step)
            crc = crc_range([step], crc)
    return crc


def write_datafile(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str], durable: bool) -> dict[str, Any]:
    """Write ``tensors`` as the safetensors file ``path`` (temporary name, then rename; ``durable``: fsynced), its
    CRC-32 computed as the bytes are written (each MiB right after its write). The file is
    created with mode 0o666, so the umask applies. Returns the manifest's file entry ``{"name", "bytes",
    "crc32"}``.

    Example:
        >>> write_datafile(Path("s/a/000000000001-ab12.p0.safetensors"), {"w": w}, {}, False)  # doctest: +SKIP
        {'name': '000000000001-ab12.p0.safetensors', 'bytes': 4152, 'crc32': '1c291ca3'}
    """
    held = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    order = sorted(held, key=lambda k: (-held[k].element_size(), k))  # every tensor aligned to its element size
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for k in order:
        t = held[k]
        n = t.numel() * t.element_size()
        header[k] = {
            "dtype": ST_DTYPES[dtype_name(t.dtype, k)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    buffers = [memoryview(bytearray(struct.pack("<Q", len(text)) + text))] + [
        _byte_view(held[k].reshape(-1)) for k in order
    ]
    size = sum(len(b) for b in buffers)
    tmp = tmp_name(path)
    fd = os.open(tmp, _O_CREATE, 0o666)
    try:
        try:
            crc = _write_and_checksum(fd, buffers)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return {"name": path.name, "bytes": size, "crc32": crc_hex(crc)}


def open_regular(path: Path, what: str, err: dict[str, Any]) -> int:
    """An fd of ``path`` for reading: never through a symlink, never blocking, only a regular file."""
    try:
        fd = os.open(path, _O_READ)
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{what}: {path} is missing (pruned while opening?)") from None
    except OSError as exc:  # ELOOP: a symlink
        raise CorruptSnapshotError(f"{what}: cannot open {path} as a regular file ({exc.strerror})", **err) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptSnapshotError(f"{what}: {path} is not a regular file", **err)
    return fd


class DataFile:
    """One data file, opened: its safetensors handle (memory-mapped), and its CRC-32 checked on first use."""

    def __init__(self, folder: Path, entry: FileEntry, where: str, agent: str | None, step: int | None) -> None:
        from safetensors import safe_open

        self.entry, self.where = entry, where
        self._args = (folder, entry, where, agent, step)
        self.err = {"agent": agent, "step": step, "file": entry.name}
        path = folder / entry.name
        fd = open_regular(path, where, self.err)
        try:
            size = os.fstat(fd).st_size
            if size != entry.bytes:
                self.fail(f"{size} bytes, the manifest says {entry.bytes}")
            # hashed later from this mapping: the very file opened here, even if the name is replaced or removed
            # (copy-on-write, never written: a writable buffer, which the native CRC kernel takes)
            self._map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) if entry.crc32 else None
            # the handle reads the same open file (not the name again) where /proc/self/fd exists
            source = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(path)
            try:
                self.handle = safe_open(source, framework="pt", device="cpu")
            except Exception as exc:  # noqa: BLE001 - safetensors' own error types
                self.fail(f"not a readable safetensors file ({type(exc).__name__}: {exc})")
        finally:
            os.close(fd)
        self._check_tensors()
        self._lock = threading.Lock()
        self.verified = entry.crc32 is None
        self._damage = ""  # why the checksum check failed, once it has: every later use fails the same way

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as where it lies (a search's worker process opens, maps and checks the file again)."""
        return (DataFile, self._args)

    def fail(self, message: str) -> NoReturn:
        raise CorruptSnapshotError(f"{self.where}: data file {self.entry.name}: {message}", **self.err)

    def _check_tensors(self) -> None:
        """The file holds exactly the tensors the manifest names, of the dtypes and sizes it needs."""
        try:
            names = set(self.handle.keys())
        except Exception as exc:  # noqa: BLE001
            self.fail(f"unreadable header ({exc})")
        if names != set(self.entry.needs):
            missing, extra = sorted(set(self.entry.needs) - names), sorted(names - set(self.entry.needs))
            self.fail(f"holds other tensors than the manifest names (missing {missing[:3]}, extra {extra[:3]})")
        for name, (dtypes, shape, numel) in self.entry.needs.items():
            try:
                s = self.handle.get_slice(name)
                dtype, got = s.get_dtype(), tuple(s.get_shape())
            except Exception as exc:  # noqa: BLE001
                self.fail(f"tensor {name!r}: unreadable ({exc})")
            n = 1
            for d in got:
                n *= d
            if dtype not in dtypes or (shape is not None and got != shape) or n != numel:
                self.fail(
                    f"tensor {name!r} is {dtype} {list(got)}, the manifest needs {sorted(dtypes)} "
                    f"{list(shape) if shape is not None else f'of {numel} elements'}"
                )

    def verify(self) -> None:
        """Compare the file's CRC-32 with the manifest's, once (:class:`CorruptSnapshotError` if they differ)."""
        if self.verified:
            return
        with self._lock:
            if self.verified:
                return
            mapping = self._map
            if mapping is None:  # an earlier check found the file damaged (and closed the mapping)
                self.fail(self._damage or "its checksum could not be checked (the file was closed)")
            if hasattr(mmap, "MADV_SEQUENTIAL"):
                mapping.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapping)
            try:
                got = crc_hex(crc32([view]))
            finally:
                view.release()
            mapping.close()
            self._map = None
            if got != self.entry.crc32:
                self._damage = (
                    f"checksum mismatch (crc32 {got}, the manifest says {self.entry.crc32}): the file is damaged"
                )
                self.fail(self._damage)
            self.verified = True

    def tensor(self, name: str) -> Tensor:
        self.verify()
        try:
            return self.handle.get_tensor(name)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"tensor {name!r}: {exc}")

    def slice(self, name: str, slices: Sequence[slice]) -> Tensor:
        self.verify()
        try:
            return self.handle.get_slice(name)[tuple(slices)]
        except Exception as exc:  # noqa: BLE001
            self.fail(f"tensor {name!r}: {exc}")


class Files:
    """The data files of one manifest, opened (they survive a later unlink: memory-mapped)."""

    def __init__(
        self, folder: Path, entries: Sequence[FileEntry], where: str, agent: str | None = None, step: int | None = None
    ) -> None:
        self.files = [DataFile(folder, e, where, agent, step) for e in entries]

    def tensor(self, file: int, name: str | None) -> Tensor | None:
        return None if name is None else self.files[file].tensor(name)

    def slice(self, file: int, name: str, slices: Sequence[slice]) -> Tensor:
        return self.files[file].slice(name, slices)

    def verify(self) -> int:
        """Verify every file now; returns the bytes checked."""
        for f in self.files:
            f.verify()
        return sum(f.entry.bytes for f in self.files if f.entry.crc32 is not None)
