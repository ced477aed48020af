"""Files written atomically (temporary name, then rename; ``durable``: fsynced) and manifests read back."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from torch import Tensor

from .errors import CorruptSnapshotError, SnapshotNotFoundError


def _fsync_dir(path: Path) -> None:
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


def _tmp_name(final: Path) -> Path:
    return final.parent / f".tmp-{uuid.uuid4().hex[:12]}-{final.name}"


def _write_safetensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str], durable: bool) -> int:
    from safetensors.torch import save_file

    tmp = _tmp_name(path)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def write_json(path: Path, obj: Any, durable: bool, exclusive: bool = False) -> bool:
    """Write ``obj`` as JSON to a temporary name, then rename it into place, so readers see all of it or nothing
    (``durable``: fsync the file and its folder; ``exclusive``: only if ``path`` does not exist; returns False
    when it did)."""
    tmp = _tmp_name(path)
    data = json.dumps(obj, indent=1, allow_nan=False).encode()
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
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
        _fsync_dir(path.parent)
    return True


def _read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        raise SnapshotNotFoundError(f"{path}: no such manifest (pruned?)") from None
    except json.JSONDecodeError as exc:  # never for files this module wrote (renamed in place whole)
        raise CorruptSnapshotError(f"{path}: unreadable manifest ({exc})") from None
