"""Running one command: its errors reported in one line, its exit status (used by every ``ram-live`` command and
by ``ram-live verl-snapshot``, which lives in the integrations and must not import the command's entry point)."""

from __future__ import annotations

import sys
from typing import Callable

from ..errors import RamLiveError

__all__ = ["run_command"]


def run_command(
    run: Callable[[], int],
    prog: str,
    debug: bool,
    unexpected: tuple[type[Exception], ...] = (OSError, ImportError, RuntimeError),
) -> int:
    """``run()``'s exit status, its errors reported in one line on stderr: a :class:`RamLiveError` (bad input or
    settings) as ``<prog>: error: <message>``, status 2; one of ``unexpected`` as ``<prog>: error: <Type>:
    <message>``, status 1. ``debug`` re-raises them instead (the traceback). A closed stdout
    (``BrokenPipeError``) is passed on for :func:`main` to end quietly. The commands never exit by ``SystemExit``:
    one that reaches here came from user code (an evaluation or reward function calling ``sys.exit``), and is an
    error, status 1 (never a silent status 0 with nothing done)."""
    try:
        return run()
    except BrokenPipeError:
        raise
    except SystemExit as exc:
        if debug:
            raise
        print(f"{prog}: error: user code called sys.exit({exc.code!r}) during the command", file=sys.stderr)
        return 1
    except RamLiveError as exc:
        if debug:
            raise
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except unexpected as exc:
        if debug:
            raise
        print(f"{prog}: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
