"""``ram-live verl-snapshot``: a folder of verl checkpoints (any verl version with FSDP/FSDP2 actor checkpoints)
turned into snapshots of one agent, offline; optionally merged.

    ram-live verl-snapshot --ckpt-root checkpoints/proj/coder --agent coder --store /shared/ram_store \\
        --base Qwen/Qwen2.5-7B-Instruct [--weights master|bf16] [--steps 100,200] [--merge-dir merged/]

``--ckpt-root`` is verl's ``trainer.default_local_dir`` (holding ``global_step_<N>/actor``), one
``global_step_<N>`` folder or its ``actor`` folder. Steps already in the store are skipped (``--overwrite``
re-takes them). ``--base`` may be left out when the store already holds the base.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "ram-live verl-snapshot") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Snapshot verl checkpoints into a ram_live store.")
    p.add_argument(
        "--ckpt-root", required=True, help="trainer.default_local_dir, a global_step_N folder, or its actor/"
    )
    p.add_argument("--agent", required=True, help="the agent's name in the store")
    p.add_argument("--store", required=True, help="the snapshot store folder")
    p.add_argument("--base", default=None, help="the base model's Hugging Face folder (default: the store's base)")
    p.add_argument(
        "--weights",
        default="master",
        choices=["master", "bf16", "fp16", "fp32"],
        help="snapshot the checkpoint's own (master) weights or their cast (default: master)",
    )
    p.add_argument("--steps", default=None, help="comma-separated global steps (default: every checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="re-take steps the store already holds")
    p.add_argument(
        "--merge-dir",
        default=None,
        help="afterwards merge the latest snapshot of every agent into MERGE_DIR/<agent>/global_step_<last step>",
    )
    p.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other ram option (ram.<KEY>), e.g. -O keep=3 -O variant=ram -O lora_rank=16",
    )
    p.add_argument("--json", action="store_true", help="print the metrics of every step as JSON lines")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ram-live verl-snapshot``: snapshot every (or every ``--steps``) checkpoint under ``--ckpt-root`` not yet
    in the store, then merge with ``--merge-dir``. Errors are reported on stderr in one line (``--debug``: raised).

    Args:
        argv: the command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0; 2 for bad input or settings (a :class:`~ram_live.errors.RamLiveError`: an unknown or
        invalid option, a missing step, no checkpoint, an unreadable checkpoint, ...); 1 for any other error.

    Raises:
        SystemExit: from argparse, on ``--help`` (status 0) or arguments it cannot parse (status 2).
        RamLiveError: with ``--debug``, the errors above are raised (with their traceback) instead of reported.

    Example:
        >>> main(["--ckpt-root", "ckpts/coder", "--agent", "coder", "--store", "runs/ram"])  # doctest: +SKIP
    """
    args = build_parser().parse_args(argv)
    from ram_live.cli.running import run_command

    return run_command(lambda: _run(args), "ram-live verl-snapshot", args.debug, unexpected=(Exception,))


def _run(args: argparse.Namespace) -> int:
    from ram_live.errors import ConfigError
    from ram_live.store.runs import find_run_marker

    from .checkpoint import find_checkpoints
    from .config import options_from_mapping
    from .core import RAMVerl

    values: dict[str, Any] = {}
    for item in args.option:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"-O {item!r}: expected KEY=VALUE")
        values[key.strip().removeprefix("ram.")] = _value(text)
    values.update(store=args.store, agent=args.agent, weights=args.weights)
    if args.base is not None:
        values["base"] = args.base
    if args.merge_dir is not None:
        values["merged_dir"] = args.merge_dir
    opts = options_from_mapping(values)
    found = find_checkpoints(args.ckpt_root)
    if args.steps:
        wanted = {int(s) for s in args.steps.split(",") if s.strip()}
        missing = wanted - {s for s, _ in found}
        if missing:
            raise ConfigError(f"--steps: no checkpoint of step(s) {sorted(missing)} under {args.ckpt_root}")
        found = [(s, p) for s, p in found if s in wanted]
    if not found:
        raise ConfigError(f"{args.ckpt_root}: no verl checkpoint (global_step_N/actor/model_world_size_W_rank_R.pt)")
    ram = RAMVerl(opts)
    # the run these checkpoints went to before (recorded in them), else a new one
    ram.run = find_run_marker([p for _, p in reversed(found)], ram.store.root, opts.agent)
    have = set(ram.store.steps(opts.agent, run=ram.run)) if ram.run is not None else set()
    done = 0
    for step, folder in found:
        if step in have and not args.overwrite:
            print(f"{opts.agent} step {step}: in the store already (--overwrite re-takes it)", file=sys.stderr)
            continue
        metrics = ram.snapshot(folder, step)
        done += 1
        _report(args, opts.agent, step, metrics)
    if args.merge_dir is not None:
        step = found[-1][0]
        metrics = ram.merge(step)
        _report(args, "merge", step, metrics)
        print(f"merged into {ram.last_merged}", file=sys.stderr)
    print(f"{done} snapshot(s) of {opts.agent!r} written to {ram.store.root}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace, who: str, step: int, metrics: dict[str, float]) -> None:
    if args.json:
        print(json.dumps({"who": who, "step": step, **metrics}))
    else:
        shown = " ".join(f"{k.removeprefix('ram/')}={v:.4g}" for k, v in metrics.items())
        print(f"{who} step {step}: {shown}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
