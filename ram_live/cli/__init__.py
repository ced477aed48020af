"""The ``ram-live`` command: :mod:`.main` (entry point, error reporting), :mod:`.parser` (built without torch, so
``--help`` is quick), :mod:`.commands` (what each command does), :mod:`.search` (``ram-live search``),
:mod:`.output` (``--force`` and value printing)."""

from .main import main, run_command

__all__ = ["main", "run_command"]
