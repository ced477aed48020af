"""The ``ram-live`` command: :mod:`.main` (entry point, error reporting), :mod:`.parser` (built without torch, so
``--help`` is quick), :mod:`.commands` (what each command does), :mod:`.search` (``ram-live search``),
:mod:`.output` (``--force`` and value printing), :mod:`.running` (one command's errors and exit status)."""

from .main import BROKEN_PIPE_STATUS, main
from .running import run_command

__all__ = ["BROKEN_PIPE_STATUS", "main", "run_command"]
