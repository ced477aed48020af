"""Output conventions of ``ram-live``: ``--force`` (replace what existed at the start, nothing else) and values
made JSON-able for ``--json``.

>>> with replacing(Path("merged"), force=True):          # doctest: +SKIP
...     merge(agents, base=base, out="merged")
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..io.outputs import rename_noreplace
from ..errors import ConfigError

__all__ = ["replacing"]


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
