"""Output conventions of ``ram-live``: ``--force`` (replace what existed at the start, nothing else) and values
made JSON-able for ``--json``.

>>> with replacing(Path("merged"), force=True):          # doctest: +SKIP
...     merge(agents, base=base, out="merged")
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..methods.ram.config import RamConfig
from ..io.outputs import rename_noreplace
from ..errors import ConfigError

__all__ = ["replacing", "jsonable"]


@contextmanager
def replacing(out: Path, force: bool) -> Iterator[None]:
    """With ``force``, an output ``out`` that exists now is renamed aside (into a hidden folder
    ``.<name>.replaced-XXXXXXXX`` next to it) for the body to write a new one, removed when the body succeeds
    and renamed back when it fails. What the body (or another process) creates at ``out`` is never removed: if
    the old output cannot go back, it stays in the hidden folder, which stderr names. A symlink ``out`` is
    refused (the command would write through it, and replacing the link's target is not what ``--force`` says).

    Args:
        out: the output path as given on the command line.
        force: whether to replace; without it an output that exists (a file, a folder that is not empty) is
            refused now, naming ``--force``.

    Raises:
        ConfigError: without ``force``, ``out`` exists; with it, ``out`` is a symbolic link.
    """
    if not force:
        _refuse_existing(out)
        yield
        return
    if not os.path.lexists(out):
        yield
        return
    if out.is_symlink():
        raise ConfigError(
            f"--force: output {out} is a symbolic link; --force replaces only a real file or folder "
            "(remove the link, or pass the path it points to)"
        )
    if out.is_dir() and not any(out.iterdir()):
        yield  # an empty folder is accepted as the output as it is
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.replaced-", dir=out.parent))
    old = aside / out.name
    os.rename(out, old)  # within one folder: atomic, nothing copied
    try:
        yield
    except BaseException:
        try:
            rename_noreplace(old, out)
        except OSError:
            print(
                f"ram-live: the earlier output {out} is kept in {aside} (something now exists at {out})",
                file=sys.stderr,
            )
        else:
            aside.rmdir()
        raise
    shutil.rmtree(aside)  # only what was at ``out`` when the command started; rmtree follows no symlink


def _refuse_existing(out: Path) -> None:
    """The library's own refusal (``output_target``), said before it and with the flag that replaces the output; a
    symbolic link is left to the library (``--force`` does not replace one)."""
    if out.is_symlink() or not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"output {out} exists; pass --force to replace it")
    if any(out.iterdir()):
        raise ConfigError(f"output {out} exists and is not empty; pass --force to replace it")


def jsonable(value: Any) -> Any:
    """``value`` with dataclasses as dicts (a :class:`~ram_live.RamConfig` as ``{"method": ..., keyword: value}``),
    enums as values, tensors as lists, paths as strings and non-finite
    floats as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (``json.dumps(..., allow_nan=False)`` then works)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, RamConfig):
        return jsonable(value.record())  # RAM's config as its flat spelling, every keyword
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # a tensor (or numpy value)
        return jsonable(value.tolist())
    return str(value)
