"""``ram-live``: probe and merge checkpoints from the command line.

    ram-live probe coder=ckpt/coder tools=ckpt/tools --base ckpt/base [--json [report.json]] [--plot probe.png]
    ram-live merge coder=ckpt/coder tools=ckpt/tools --base ckpt/base --out merged/ [--method ties -O density=0.2]
    ram-live merge-adapters lora/coder lora/tools --out merged-lora/ [--rank 16] [--into-base --base ckpt/base]
    ram-live search coder=ckpt/coder tools=ckpt/tools --base ckpt/base --eval mypkg.evals:score --budget 60 --out best/
    torchrun --nproc-per-node 8 -m ram_live merge ... --out merged/ --distributed --device cuda

Agents are safetensors files or Hugging Face folders, optionally named ``name=path``. ``--json`` prints one JSON
object on stdout; ``--force`` replaces an output that exists when the command starts. Errors print one line on
stderr and exit non-zero (2 for bad input, 1 otherwise; also with ``--json``); ``--debug`` shows the traceback. A
closed stdout (``| head``) ends the command quietly with status 141. ``ram-live clean DIR`` removes the
temporary folders killed merges left in DIR (docs/trust.md). Building the parser imports no torch, so ``--help``
is quick; the commands import it when they run.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from .running import run_command

__all__ = ["main", "BROKEN_PIPE_STATUS"]

#: Exit status when stdout is closed early (``ram-live probe ... | head -1``): 128 + SIGPIPE, as a shell reports
#: a command that SIGPIPE ended.
BROKEN_PIPE_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command; its exit status.

    Args:
        argv: the arguments after the program name.

    Example: ``main(["merge", "a.safetensors", "b.safetensors", "--base", "base.safetensors", "--out", "m/"])``
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        status = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python's recipe (docs: signal, "Note on SIGPIPE"): stdout to devnull so that the flush at exit does
        # not fail again, then exit without a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE_STATUS
    return status


def _main(argv: list[str]) -> int:
    if "verl-snapshot" in argv[:2]:
        from ram_live.integrations.verl.cli import main as verl_main

        return verl_main(argv[argv.index("verl-snapshot") + 1 :])
    from .parser import build_parser

    args = build_parser().parse_args(argv)

    def run() -> int:
        from .quiet import quiet_libraries

        with quiet_libraries(getattr(args, "quiet", False)):
            if args.command == "search":  # here, not in .commands, which .search imports
                from .search import run_search

                return run_search(args)
            from .commands import run as run_parsed

            return run_parsed(args)

    return run_command(run, "ram-live", args.debug)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
