"""``ram-live``: probe and merge checkpoints from the command line.

    ram-live probe coder=ckpt/coder tools=ckpt/tools --base ckpt/base [--json report.json] [--plot probe.png]
    ram-live merge coder=ckpt/coder tools=ckpt/tools --base ckpt/base --out merged/ [--method ties -O density=0.2]
    ram-live search coder=ckpt/coder tools=ckpt/tools --base ckpt/base --eval mypkg.evals:score --budget 60 --out best/
    torchrun --nproc-per-node 8 -m ram_live merge ... --out merged/ --distributed --device cuda

Agents are safetensors files or Hugging Face folders, optionally named ``name=path``. Errors print one line and
exit non-zero (2 for bad input, 1 otherwise); ``--debug`` shows the traceback. ``ram-live clean DIR`` removes the
temporary folders killed merges left in DIR (docs/trust.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .errors import ConfigError, RamLiveError

__all__ = ["main", "run_command"]

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


def _agents(specs: Sequence[str]) -> dict[str, str]:
    agents: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec.rstrip("/")).stem, spec
        if name in agents:
            raise ConfigError(f"two agents are named {name!r}: name them explicitly as name=path")
        agents[name] = path
    return agents


def _option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"-O takes key=value, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ram-live", description="Merge RL-trained agents with RAM.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("agents", nargs="*", help="agent checkpoints: file.safetensors or HF folder, or name=path")
        p.add_argument("--base", help="the base checkpoint every agent was trained from (not with --store)")
        p.add_argument("--store", help="a snapshot store: the latest snapshot of every agent (or of the named "
                                       "agents), with the store's base")
        p.add_argument("--device", default=None, help="compute device (default: cpu)")
        p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")

    p = sub.add_parser("probe", help="density, shared/unique entries, rho and lambda per agent")
    common(p)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--activity", choices=("abs", "changed"), default="abs")
    p.add_argument("--r", type=float, default=0.1)
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--json", metavar="FILE", help="write the report as JSON ('-' for stdout)")
    p.add_argument("--plot", metavar="PNG", help="save per-layer heatmaps (needs ram-live[plot])")

    m = sub.add_parser("merge", help="merge agents into a new checkpoint")
    common(m)
    m.add_argument("--out", required=True, help="output folder (HF layout) or file.safetensors")
    m.add_argument("--method", default="ram_plus", help="merge method (default: ram_plus)")
    m.add_argument("--config", metavar="YML", help="a mergekit YAML config: models, base, method and options "
                                                   "come from it (needs ram-live[yaml]; see docs/mergekit.md)")
    m.add_argument("-O", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="method option, e.g. -O density=0.2 -O weights=[1,2]; repeatable")
    m.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="output dtype (default: the base's)")
    m.add_argument("--max-shard-size", type=float, default=5.0, metavar="GB", help="shard size in GB (default 5)")
    m.add_argument("--distributed", action="store_true",
                   help="under torchrun: split the tensors over the ranks (gloo on CPU, nccl with --device cuda)")

    st = sub.add_parser("stores", help="what a snapshot store holds")
    st.add_argument("store", help="the snapshot store folder")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument("--verify", action="store_true",
                    help="check every manifest and data file (sizes, tensors, CRC-32); exit status 1 on damage")
    st.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")

    c = sub.add_parser("clean", help="remove the temporary folders killed merges left in a folder")
    c.add_argument("folder", help="the folder outputs were written into (the parent of --out)")
    c.add_argument("--min-age", type=float, default=None, metavar="S",
                   help="only folders unchanged for S seconds (default 60); live merges are never touched")
    c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")

    from .search.cli import add_parser as add_search_parser

    add_search_parser(sub, common)

    v = sub.add_parser("verl-snapshot", add_help=False, help="turn verl checkpoints into snapshots (see --help)")
    v.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _run(args: argparse.Namespace) -> int:
    from . import merge, probe
    from .progress import TerminalProgress

    if args.command == "stores":
        return _stores(args)
    if args.command == "clean":
        return _clean(args)
    if args.command == "search":
        from .search.cli import run_search

        return run_search(args)
    if getattr(args, "config", None):
        return _merge_config(args)
    agents, base = _inputs(args)
    if args.command == "probe":
        report = probe(agents, base=base, eps=args.eps, activity=args.activity, r=args.r, alpha=args.alpha,
                       device=args.device)
        if args.json == "-":
            print(json.dumps(report.to_dict(), indent=2, allow_nan=False))
        else:
            print(report.table())
            if args.json:
                Path(args.json).write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False))
        if args.plot:
            report.plot(args.plot)
        return 0
    options = dict(_option(o) for o in args.option)
    if args.distributed:
        _init_distributed(args)
        args.quiet = args.quiet or torch.distributed.get_rank() != 0  # rank 0 reports for all
    _, info = merge(
        agents, base=base, method=args.method, out=args.out, device=args.device,
        dtype=_DTYPES[args.dtype] if args.dtype else None, max_shard_bytes=int(args.max_shard_size * 1e9),
        progress=None if args.quiet else TerminalProgress(), return_info=True,
        process_group=True if args.distributed else None, **options,
    )
    if not args.quiet:
        print(f"merged {len(info.agents)} agents ({info.tensors} tensors, {info.parameters:,} parameters"
              f"{' on rank 0' if args.distributed else ''}) with "
              f"{info.method} in {info.seconds:.1f} s -> {args.out}")
        if info.lambdas:
            print("lambda: " + ", ".join(f"{n}={v:.4f}" for n, v in info.lambdas.items()))
    return 0


def _merge_config(args: argparse.Namespace) -> int:
    """``merge --config file.yml``: a mergekit config; agents, --base, --store, --method and -O come from it."""
    from .mergekit_yaml import from_mergekit_yaml
    from .progress import TerminalProgress

    given = [n for n, v in (("agent paths", args.agents), ("--base", args.base), ("--store", args.store),
                            ("-O", args.option), ("--distributed", args.distributed)) if v]
    if args.method != "ram_plus":
        given.append("--method")
    if given:
        raise ConfigError(f"--config names the models, base and method itself: drop {', '.join(given)}")
    plan = from_mergekit_yaml(args.config)
    overrides: dict[str, Any] = {"dtype": _DTYPES[args.dtype]} if args.dtype else {}
    _, info = plan.merge(out=args.out, device=args.device, max_shard_bytes=int(args.max_shard_size * 1e9),
                         progress=None if args.quiet else TerminalProgress(), return_info=True, **overrides)
    if not args.quiet:
        print(f"merged {len(info.agents)} agents with {info.method} ({plan.mergekit_method} in {args.config}) "
              f"in {info.seconds:.1f} s -> {args.out}")
    return 0


def _inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(agents, base) from paths and --base, or from --store (optionally restricted to the named agents)."""
    if args.store:
        from .store import SnapshotStore

        if args.base:
            raise ConfigError("pass either --store (which holds the base) or --base, not both")
        store = SnapshotStore(args.store, create=False)
        snapshots = store.latest_all(args.agents or None)
        if not snapshots:
            raise ConfigError(f"snapshot store {args.store} holds no snapshot")
        return snapshots, None
    if not args.agents or not args.base:
        raise ConfigError("name the agents' checkpoints and --base (or pass --store)")
    return _agents(args.agents), args.base


def _stores(args: argparse.Namespace) -> int:
    import warnings

    from .store import SnapshotStore, StoreError, UnverifiedSnapshotWarning

    store = SnapshotStore(args.store, create=False)
    if args.verify:
        report = store.verify()
        print(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
        return 0 if report.ok else 1
    rows = []
    with warnings.catch_warnings(record=True) as unverified:
        warnings.simplefilter("always", UnverifiedSnapshotWarning)
        for info in store.list():
            try:
                snap = info.open()
            except StoreError as exc:  # one damaged snapshot does not hide the others
                rows.append({"agent": info.agent, "step": info.step, "error": str(exc)})
                continue
            rows.append({"agent": info.agent, "step": info.step, "changed": snap.changed, "numel": snap.numel,
                         "density": snap.density, "bytes": snap.bytes, "dense_bytes": snap.dense_bytes})
    if args.json:
        print(json.dumps({"store": str(store.root), "base": store.base_fingerprint, "snapshots": rows}, indent=2))
        return 0
    print(f"store {store.root}  base {store.base_fingerprint or '(none)'}")
    print(f"{'agent':<16}{'step':>10}{'density':>10}{'changed':>14}{'on disk':>12}{'dense':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['agent'][:15]:<16}{r['step']:>10}  unreadable: {r['error']}")
            continue
        print(f"{r['agent'][:15]:<16}{r['step']:>10}{r['density']:>10.2%}{r['changed']:>14,}"
              f"{r['bytes'] / 1e6:>10.1f}MB{r['dense_bytes'] / 1e6:>10.1f}MB")
    if unverified:
        print(f"{len(unverified)} of them (or the base) carry no checksums (written by an older ram_live); "
              "--verify checks the others")
    return 0


def _clean(args: argparse.Namespace) -> int:
    from ._outputs import STALE_AGE, clean_stale

    folder = Path(args.folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    removed = clean_stale(folder, min_age=STALE_AGE if args.min_age is None else args.min_age)
    for path in removed:
        print(f"removed {path}")
    if not removed:
        print(f"no stale temporary folder in {folder}")
    return 0


def _init_distributed(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    if "RANK" not in os.environ:
        raise ConfigError("--distributed needs torchrun (RANK, WORLD_SIZE, MASTER_ADDR are not set)")
    cuda = args.device is not None and str(args.device).startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        args.device = f"cuda:{torch.cuda.current_device()}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "verl-snapshot" in argv[:2]:
        from ram_live.integrations.verl.cli import main as verl_main

        return verl_main(argv[argv.index("verl-snapshot") + 1:])
    args = _parser().parse_args(argv)
    return run_command(lambda: _run(args), "ram-live", args.debug)


def run_command(run: Callable[[], int], prog: str, debug: bool,
                unexpected: tuple[type[Exception], ...] = (OSError, ImportError, RuntimeError)) -> int:
    """``run()``'s exit status, its errors reported in one line on stderr: a :class:`RamLiveError` (bad input or
    settings) as ``<prog>: error: <message>``, status 2; one of ``unexpected`` as ``<prog>: error: <Type>:
    <message>``, status 1. ``debug`` re-raises them instead (the traceback)."""
    try:
        return run()
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
