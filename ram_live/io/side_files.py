"""A base folder's side files: its config, generation config, tokenizer and other non-weight top-level files, which
a merged folder (and a snapshot store, and verl's merged checkpoints) copy so that the output loads as the base does.

Only regular files whose contents lie inside the base folder are copied. A side file that is a link must resolve
inside the folder, or to a Hugging Face cache file (``models--org--name/blobs/<hash>``, where the links of a cache
snapshot and of a ``--local-dir`` download point); any other link is a :class:`ConfigError` naming it,
raised where the base is read, before anything is written: a ``tokenizer_config.json`` linked to
``/proc/self/environ`` would otherwise put the merging process's environment (tokens included) into the output.

>>> sorted(side_files(Path("base")))                                                   # doctest: +SKIP
['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from ..errors import ConfigError

__all__ = ["PROVENANCE", "copy_side_files", "is_side_file", "read_side_file", "side_files"]

#: The provenance file of a merged folder.
PROVENANCE = "ram_merge.json"
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz", ".index.json")
_NOT_COPIED = {PROVENANCE, "adapter_config.json"}
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def is_side_file(name: str) -> bool:
    """Whether a base folder's top-level file ``name`` goes into a merged folder: not hidden, not weights in any
    format (nor their index), not an adapter's files, not the base's own ``ram_merge.json``.

    Args:
        name: the file's name.

    >>> is_side_file("tokenizer.json"), is_side_file("pytorch_model.bin.index.json")
    (True, False)
    """
    return not (
        name.startswith(".") or name.endswith(_WEIGHTS) or name in _NOT_COPIED or name.startswith("adapter_model")
    )


def _hub_blob(real: Path) -> bool:
    """Whether ``real`` is a file of a Hugging Face cache (``models--org--name/blobs/<hash>``), where a cache
    snapshot's links, and those of a folder ``huggingface-cli download --local-dir`` filled with links, point."""
    return real.parent.name == "blobs" and real.parent.parent.name.startswith("models--")


def side_files(folder: Path | None, skip: Collection[str] = ()) -> dict[str, Path]:
    """The side files of the base folder ``folder`` (:func:`is_side_file`, regular files; none for None or not a
    folder): name → the real path to read, sorted by name; names in ``skip`` are left out.

    Args:
        folder: the base folder.
        skip: names the caller writes itself.

    Raises:
        ConfigError: a side file is a link that resolves outside ``folder`` (and is no Hugging Face cache file),
            or cannot be read, naming it.
    """
    if folder is None or not folder.is_dir():
        return {}
    root = folder.resolve()
    out = {}
    for f in sorted(folder.iterdir()):
        if not is_side_file(f.name) or f.name in skip or not f.is_file():
            continue  # a dangling link, a link loop, a folder or a device is not a side file
        real = f.resolve()
        if not (real.is_relative_to(root) or _hub_blob(real)):
            raise ConfigError(
                f"base folder {folder}: {f.name} is a link to {real}, outside the folder; only files inside a base "
                "folder are copied into a merged one (copy the file into the folder, or remove the link)"
            )
        os.close(_open(real))  # unreadable: said now, not after the merge
        out[f.name] = real
    return out


def _open(real: Path) -> int:
    """``real`` opened for reading, refused unless it is (still) a regular file and not a link."""
    try:
        fd = os.open(real, _OPEN_FLAGS)
    except OSError as exc:
        raise ConfigError(f"base side file {real} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"base side file {real} is not a regular file")
    return fd


def read_side_file(real: Path) -> bytes:
    """The contents of a side file :func:`side_files` listed."""
    with os.fdopen(_open(real), "rb") as src:
        return src.read()


def copy_side_files(copy_from: Path | None, folder: Path, files: Mapping[str, bytes] | None = None) -> None:
    """The side files of the base folder ``copy_from`` (:func:`side_files`, checked again here) into ``folder``
    under their names in the base folder, with their mode and times, then ``files`` (name → content) written over
    them.

    Raises:
        ConfigError: a side file links outside the base folder.
    """
    files = files or {}
    for name, real in side_files(copy_from, skip=files).items():
        with os.fdopen(_open(real), "rb") as src, open(folder / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
            st = os.fstat(src.fileno())
        os.chmod(folder / name, stat.S_IMODE(st.st_mode))  # as shutil.copy2: the base's mode and times
        os.utime(folder / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    for name, data in files.items():
        (folder / name).write_bytes(data)
