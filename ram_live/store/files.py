"""Files written atomically (temporary name, then rename; ``durable``: fsynced), manifests read back (regular
files only, strict JSON), and store files removed (only regular files of the store's own names)."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any

from .errors import CorruptSnapshotError, SnapshotNotFoundError

_MAX_MANIFEST = 1 << 30  # bytes
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def tmp_name(final: Path) -> Path:
    return final.parent / f".tmp-{uuid.uuid4().hex[:12]}-{final.name}"


def write_json(path: Path, obj: Any, durable: bool, exclusive: bool = False) -> bool:
    """Write ``obj`` as JSON to a temporary name, then rename it into place, so readers see all of it or nothing
    (``durable``: fsync the file and its folder; ``exclusive``: only if ``path`` does not exist; returns False
    when it did). The file is created with mode 0o666: the umask applies."""
    tmp = tmp_name(path)
    data = json.dumps(obj, indent=1, allow_nan=False).encode()
    try:
        fd = os.open(tmp, _O_CREATE, 0o666)
        try:
            view = memoryview(data)
            while len(view):
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(path: Path) -> Any:
    """The JSON document in ``path``: a regular file (never through a symlink, never a FIFO), strict JSON (no NaN
    or Infinity), at most 1 GiB. :class:`SnapshotNotFoundError` if it is missing, :class:`CorruptSnapshotError`
    otherwise."""
    try:
        fd = os.open(path, _O_READ)
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such manifest (pruned?)") from None
    except OSError as exc:
        raise CorruptSnapshotError(f"{path}: cannot open the manifest as a regular file ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptSnapshotError(f"{path}: the manifest is not a regular file")
        if st.st_size > _MAX_MANIFEST:
            raise CorruptSnapshotError(f"{path}: a manifest of {st.st_size} bytes (at most {_MAX_MANIFEST})")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return json.loads(b"".join(chunks), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # never for files this module wrote (renamed in place whole)
        raise CorruptSnapshotError(f"{path}: unreadable manifest ({type(exc).__name__}: {str(exc)[:200]})") from None


def remove_file(path: Path) -> bool:
    """Unlink ``path`` if it is a regular file (never a symlink's target, never a folder); True if it went. The
    caller has checked that the name is one of the store's own."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)  # unlink never follows a symlink (one swapped in meanwhile goes, not its target)
    except FileNotFoundError:
        return False
    except IsADirectoryError:  # pragma: no cover - swapped for a folder meanwhile
        return False
    return True


def real_folder(path: Path) -> bool:
    """``path`` is a folder itself, not a symlink to one (the store never makes symlinks)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
