"""File-system steps of writing outputs safely: reserving bytes before a file is mapped, writing without mmap,
temporary folders that say whether their writer is alive, removing those of killed writers, and publishing a
finished output (index, side files, a final rename that never replaces what someone else created meanwhile).

>>> removed = clean_stale(Path("checkpoints"), min_age=0)        # doctest: +SKIP
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import numbers
import os
import re
import shutil
import stat
import struct
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError, OutOfSpaceError, OutputExistsError
from ..option_checks import shown
from .side_files import copy_side_files

__all__ = [
    "reserve",
    "write_all",
    "temp_folder",
    "locked_temp_folder",
    "unlock",
    "clean_stale",
    "rename_noreplace",
    "rename_output",
    "publish_folder",
    "remove_created",
    "is_full",
    "output_target",
    "make_folders",
    "STALE_AGE",
]

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NO_RESERVE = {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}
# statfs f_type of copy-on-write file systems, where an allocated block does not promise that an overwrite finds
# space (btrfs, ZFS, bcachefs): files there are written without mmap
_COW_FS = {0x9123683E, 0x2FC12FC1, 0xCA451A4E}
#: Temporary output folders younger than this (seconds since their last change) are never removed as stale.
STALE_AGE = 60.0
_TEMP_SUFFIX = re.compile(r"[a-z0-9_]{6,16}")
_libc = None


def is_full(exc: OSError) -> bool:
    """Whether ``exc`` says the disk (or the user's quota, or the file size limit) is full."""
    return exc.errno in _FULL


def _c() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        except OSError:
            _libc = False  # type: ignore[assignment]
    return _libc or None


def _copy_on_write(fd: int) -> bool:
    libc = _c()
    if libc is None or not hasattr(libc, "fstatfs"):
        return False
    buf = ctypes.create_string_buffer(512)  # struct statfs: f_type (a long) comes first on Linux
    if libc.fstatfs(fd, buf) != 0:
        return False
    return (struct.unpack_from("q" if struct.calcsize("P") == 8 else "i", buf)[0] & 0xFFFFFFFF) in _COW_FS


def reserve(fd: int, size: int, label: str) -> bool:
    """Allocate ``size`` bytes of ``fd``'s file on disk so that writes through a mapping cannot fault (SIGBUS) on
    a full disk. True when reserved; False when this file system cannot promise it (no ``posix_fallocate``, or
    copy-on-write): write without mmap then. A full disk raises :class:`OutOfSpaceError` naming ``label``."""
    if size == 0:
        return True
    if not hasattr(os, "posix_fallocate") or _copy_on_write(fd):
        return False
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if is_full(exc):
            raise OutOfSpaceError(f"no space left on device writing {label}: needs {size} bytes") from None
        if exc.errno in _NO_RESERVE:
            return False
        raise
    return True


def write_all(fd: int, data: memoryview | bytes, offset: int, label: str) -> None:
    """``pwrite`` all of ``data`` at ``offset``; a full disk raises :class:`OutOfSpaceError` naming ``label``."""
    view = memoryview(data).cast("B")
    done = 0
    try:
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
    except OSError as exc:
        if is_full(exc):
            raise OutOfSpaceError(
                f"no space left on device writing {label}: needs {len(view) - done} more bytes at byte {offset + done}"
            ) from None
        raise


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask must set one to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def temp_folder(parent: Path, name: str) -> Path:
    """A new hidden folder ``.<name>.tmp-XXXXXXXX`` in ``parent`` to write ``name`` into before it is renamed into
    place, with the mode a plain ``mkdir`` would give (``mkdtemp`` makes it 0700, which the renamed output folder
    would keep)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def lock(folder: Path) -> int:
    """A shared ``flock`` on ``folder`` held by the returned descriptor: while it is open, the folder's writer is
    alive and :func:`clean_stale` leaves the folder alone (the kernel drops the lock when a process dies)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:  # no locks on this file system: clean_stale cannot lock the folder either, so it keeps it
        pass
    return fd


def locked_temp_folder(parent: Path, name: str) -> tuple[Path, int]:
    """:func:`temp_folder` and the descriptor holding its :func:`lock`."""
    tmp = temp_folder(parent, name)
    return tmp, lock(tmp)


def unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _is_temp_name(entry: str, name: str | None) -> bool:
    if not entry.startswith("."):
        return False
    head, sep, tail = entry.rpartition(".tmp-")
    if not sep or not _TEMP_SUFFIX.fullmatch(tail) or len(head) < 2:
        return False
    return name is None or head == f".{name}"


def clean_stale(parent: Path, name: str | None = None, min_age: float = STALE_AGE) -> list[Path]:
    """Remove the temporary folders that killed writes left in ``parent`` (of output ``name``, or of any output),
    and return them. Only real folders (never a symlink, never followed) named as this library names them
    (``.<name>.tmp-<6 to 16 of a-z0-9_>``), unchanged for ``min_age`` seconds and whose writer holds no lock
    are removed; anything else is left alone.

    Args:
        parent: the folder outputs are written into.
        name: only the temporary folders of this output (its file or folder name), or None for any output.
        min_age: seconds a folder must have been unchanged (its writer locks it right after creating it).

    Raises:
        ConfigError: ``min_age`` is not a number of seconds >= 0 (NaN would remove a folder its writer has not
            locked yet).

    Example:
        >>> clean_stale(Path("checkpoints"), "merged")                 # doctest: +SKIP
        [PosixPath('checkpoints/.merged.tmp-k2x9_q1a')]
    """
    import fcntl

    if isinstance(min_age, bool) or not isinstance(min_age, numbers.Real) or not min_age >= 0:
        raise ConfigError(f"min_age (--min-age) must be a number of seconds >= 0, got {shown(min_age)}")

    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    now = time.time()
    for entry in entries:
        if not _is_temp_name(entry.name, name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or now - st.st_mtime < min_age:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not os.path.samestat(os.fstat(fd), st):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live writer holds it
                continue
            shutil.rmtree(entry.path)  # fd-based on Linux: links inside are removed, never followed
            removed.append(Path(entry.path))
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _renameat2(src: Path, dst: Path) -> bool:
    """``renameat2(RENAME_NOREPLACE)``: True when done; False where the kernel, libc or file system lacks it;
    FileExistsError when ``dst`` exists."""
    libc = _c()
    fn = getattr(libc, "renameat2", None) if libc is not None else None
    if fn is None:
        return False
    at_fdcwd, noreplace = -100, 1
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (then ``FileExistsError``, ``src`` untouched):
    ``renameat2(RENAME_NOREPLACE)`` where available, else a hard link then unlink for a file, else (a folder on a
    file system without either) a check then ``rename``, which may still replace an empty folder made in
    between."""
    if _renameat2(src, dst):
        return
    if not src.is_dir():
        try:
            os.link(src, dst)
        except FileExistsError:
            raise
        except OSError:
            pass
        else:
            os.unlink(src)
            return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "File exists", str(dst))
    os.rename(src, dst)


def output_target(path: Path, single: bool) -> Path:
    """Where the output ``path`` is written (symlinks followed), checked before anything is merged: its nearest
    existing ancestor must be a folder; a file output must not exist, a folder output must not exist or be empty."""
    target = Path(os.path.realpath(path))
    ancestor = target.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"cannot write output {path}: its parent {ancestor} is a file, not a folder")
    if target.exists():
        if single:
            raise ConfigError(f"output {path} exists")
        if not target.is_dir():
            raise ConfigError(f"output {path} exists and is not a folder")
        if any(target.iterdir()):
            raise ConfigError(f"output {path} exists and is not empty")
    return target


def make_folders(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders this call created, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    created = []
    for f in reversed(missing):
        try:
            f.mkdir()
        except FileExistsError:  # made meanwhile by someone else: not ours to remove
            if not f.is_dir():
                raise
            continue
        created.append(f)
    return created[::-1]


def remove_created(folders: list[Path]) -> None:
    """Remove ``folders`` (:func:`make_folders`' list, deepest first) while they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


def rename_output(source: Path, target: Path, path: Path) -> None:
    """The final rename of ``source`` to ``target`` (the output ``path`` resolved), never over something another
    process created meanwhile (:class:`OutputExistsError`)."""
    try:
        rename_noreplace(source, target)
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno in (
            errno.ENOTEMPTY,
            errno.EEXIST,
            errno.ENOTDIR,
            errno.EISDIR,
        ):
            raise OutputExistsError(
                f"output {path} was created by another process while the merge ran; "
                "it is left as it is and the merge's result removed"
            ) from None
        raise


def publish_folder(
    tmp: Path,
    target: Path,
    path: Path,
    weight_map: Mapping[str, str],
    total: int,
    copy_from: Path | None,
    *,
    replace_empty: bool,
    files: Mapping[str, bytes] | None = None,
) -> None:
    """Publish the finished temporary folder ``tmp`` as the output ``path`` (resolved: ``target``): the index
    (unless the folder is one ``model.safetensors``), ``copy_from``'s config/tokenizer files and ``files`` (a live
    model's config, ``ram_merge.json``), then the atomic rename. ``replace_empty``: ``target`` was an empty folder
    the user gave, replaced unless something was written into it meanwhile (:class:`OutputExistsError`); a full
    disk is an :class:`OutOfSpaceError`."""
    try:
        if set(weight_map.values()) != {"model.safetensors"}:
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        copy_side_files(copy_from, tmp, files)
    except OSError as exc:
        if is_full(exc):
            raise OutOfSpaceError(
                f"no space left on device writing {path} (index, config and tokenizer files): {exc.strerror}"
            ) from None
        raise
    if replace_empty:
        try:
            target.rmdir()
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise OutputExistsError(
                    f"output {path}: something was written into it while the merge "
                    "ran; it is left as it is and the merge's result removed"
                ) from None
            if exc.errno != errno.ENOENT:
                raise
    rename_output(tmp, target, path)
