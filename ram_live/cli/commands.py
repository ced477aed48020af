"""What each ``ram-live`` command does once its arguments are parsed (imported only to run one: torch and the
merge engine load here, not when ``ram-live --help`` builds the parser)."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from ..io.jsonable import jsonable
from .output import replacing
from .parser import DTYPE_NAMES, ram_flags
from ..errors import ConfigError
from ..option_checks import parse_json

__all__ = ["run", "agents_from_specs", "inputs"]


def _dtype(name: str | None) -> torch.dtype | None:
    return getattr(torch, DTYPE_NAMES[name]) if name else None


def agents_from_specs(specs: Sequence[str], what: str = "agents") -> dict[str, str]:
    """``name=path`` (or a bare path, named after its stem) per spec; two of one name are an error."""
    agents: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = Path(spec.rstrip("/")).stem, spec
        if name in agents:
            raise ConfigError(f"two {what} are named {name!r}: name them explicitly as name=path")
        agents[name] = path
    return agents


def _option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"-O takes key=value, got {text!r}")
    return key, parse_json(f"-O {key}", raw, plain_text=True)


def method_options(args: argparse.Namespace) -> dict[str, Any]:
    """The method's options of ``merge`` / ``merge-adapters``: ``-O KEY=VALUE`` and the RAM flags given."""
    from ..methods import RAM_METHODS

    options = dict(_option(o) for o in args.option)
    flags = ram_flags(args)
    if flags and args.method not in RAM_METHODS:
        raise ConfigError(
            f"{', '.join('--' + n.replace('_', '-') for n in flags)}: RAM options, for --method "
            f"{', '.join(RAM_METHODS)}, not {args.method} (its options go in -O KEY=VALUE)"
        )
    both = sorted(set(flags) & set(options))
    if both:
        raise ConfigError(f"{', '.join(both)}: given both as a flag and as -O; give each option once")
    return {**options, **flags}


def _print_json(data: Any) -> None:
    print(json.dumps(jsonable(data), indent=2, allow_nan=False))


def _adapter_hint(paths: Sequence[str]) -> None:
    """PEFT adapter folders given to ``merge`` (whose tensors would not match the base's): say which command."""
    adapters = [p for p in paths if (Path(p) / "adapter_config.json").is_file()]
    if adapters:
        raise ConfigError(
            f"{', '.join(adapters)}: these look like PEFT adapter folders (adapter_config.json): use "
            "ram-live merge-adapters FOLDERS --out DIR (or --into-base --base MODEL)"
        )


def inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(agents, base) from paths and --base, or from --store (optionally restricted to the named agents)."""
    if args.store:
        from ..store import SnapshotStore

        if args.base:
            raise ConfigError("pass either --store (which holds the base) or --base, not both")
        store = SnapshotStore(args.store, create=False)
        snapshots = store.latest_all(args.agents or None)
        if not snapshots:
            raise ConfigError(f"snapshot store {args.store} holds no snapshot")
        return snapshots, None
    if not args.agents or not args.base:
        raise ConfigError("name the agents' checkpoints and --base (or pass --store)")
    agents = agents_from_specs(args.agents)
    _adapter_hint(list(agents.values()))
    return agents, args.base


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status."""
    if args.command == "stores":
        return _stores(args)
    if args.command == "clean":
        return _clean(args)
    if args.command == "merge-adapters":
        return _merge_adapters(args)
    if args.command == "probe":
        return _probe(args)
    if args.config:
        return _merge_config(args)
    return _merge(args)


def _probe(args: argparse.Namespace) -> int:
    from ..probing import probe

    if args.json not in (None, "-") and (
        "=" in args.json or args.json.endswith(".safetensors") or os.path.isdir(args.json)
    ):
        raise ConfigError(
            f"--json {args.json}: that looks like an agent, not the report's file; put --json after "
            "the agents, or write --json=FILE"
        )
    agents, base = inputs(args)
    report = probe(agents, base=base, device=args.device, **ram_flags(args))
    if args.json == "-":
        print(json.dumps(report.to_dict(), indent=2, allow_nan=False))
    else:
        print(report.table())
        if args.json:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False))
    if args.plot:
        report.plot(args.plot)
    return 0


def _info_dict(info: Any, out: str) -> dict[str, Any]:
    return {
        "out": out,
        "method": info.method,
        "agents": list(info.agents),
        "tensors": info.tensors,
        "parameters": info.parameters,
        "seconds": info.seconds,
        "passes": info.passes,
        "lambdas": info.lambdas,
        "rho": info.rho,
        "config": info.config,
    }


def _merge(args: argparse.Namespace) -> int:
    from ..api import merge
    from ..progress import TerminalProgress

    agents, base = inputs(args)
    options = method_options(args)
    if args.distributed:
        if args.force:
            raise ConfigError("--force is not available with --distributed: remove the output first")
        _init_distributed(args)
        args.quiet = args.quiet or torch.distributed.get_rank() != 0  # rank 0 reports for all
    with replacing(Path(args.out), args.force):
        _, info = merge(
            agents,
            base=base,
            method=args.method,
            out=args.out,
            device=args.device,
            dtype=_dtype(args.dtype),
            max_shard_bytes=_shard_bytes(args.max_shard_size),
            progress=None if args.quiet else TerminalProgress(),
            return_info=True,
            process_group=True if args.distributed else None,
            **options,
        )
    if args.json:
        if not args.distributed or torch.distributed.get_rank() == 0:
            _print_json(_info_dict(info, args.out))
    elif not args.quiet:
        print(
            f"merged {len(info.agents)} agents ({info.tensors} tensors, {info.parameters:,} parameters"
            f"{' on rank 0' if args.distributed else ''}) with "
            f"{info.method} in {info.seconds:.1f} s -> {args.out}"
        )
        if info.lambdas:
            print("lambda: " + ", ".join(f"{n}={v:.4f}" for n, v in info.lambdas.items()))
        _say_if_no_config(Path(args.out))
    return 0


def _say_if_no_config(out: Path) -> None:
    """A merged folder without ``config.json`` (the base had none) does not load with ``from_pretrained``: say so."""
    if out.is_dir() and not (out / "config.json").exists():
        print(
            f"note: {out} holds the weights and ram_merge.json but no config.json: the base has none (a state dict, "
            "or a store whose base was one); copy the base model's config and tokenizer files into it to load it "
            "with from_pretrained"
        )


def _merge_config(args: argparse.Namespace) -> int:
    """``merge --config file.yml``: a mergekit config; agents, --base, --store, --method and -O come from it."""
    from ..mergekit_yaml import from_mergekit_yaml
    from ..progress import TerminalProgress

    given = [
        n
        for n, v in (
            ("agent paths", args.agents),
            ("--base", args.base),
            ("--store", args.store),
            ("-O", args.option),
            ("--distributed", args.distributed),
        )
        if v
    ]
    given += ["--" + n.replace("_", "-") for n in ram_flags(args)]
    if args.method != "ram_plus":
        given.append("--method")
    if given:
        raise ConfigError(f"--config names the models, base and method itself: drop {', '.join(given)}")
    plan = from_mergekit_yaml(args.config)
    overrides: dict[str, Any] = {"dtype": _dtype(args.dtype)} if args.dtype else {}
    with replacing(Path(args.out), args.force):
        _, info = plan.merge(
            out=args.out,
            device=args.device,
            max_shard_bytes=_shard_bytes(args.max_shard_size),
            progress=None if args.quiet else TerminalProgress(),
            return_info=True,
            **overrides,
        )
    if args.json:
        _print_json({**_info_dict(info, args.out), "config_file": args.config, "mergekit_method": plan.mergekit_method})
    elif not args.quiet:
        print(
            f"merged {len(info.agents)} agents with {info.method} ({plan.mergekit_method} in {args.config}) "
            f"in {info.seconds:.1f} s -> {args.out}"
        )
    return 0


def _shard_bytes(gb: float) -> int:
    """``--max-shard-size`` (GB) in bytes: at least one byte, and finite."""
    if not (math.isfinite(gb) and 1 <= gb * 1e9 <= 2**63):
        raise ConfigError(f"--max-shard-size must be a number of GB from 1e-9 to 9e9, got {gb!r}")
    return int(gb * 1e9)


def _sparsify(text: str) -> Any:
    rule, sep, value = text.partition(":")
    if rule in ("auto", "none") and not sep:
        return None if rule == "none" else "auto"
    if rule in ("topk", "relative"):
        if not sep:
            return rule
        try:
            return (rule, float(value))
        except ValueError:
            pass
    raise ConfigError(f"--sparsify takes auto, none, topk[:DENSITY] or relative[:THRESHOLD], got {text!r}")


def _merge_adapters(args: argparse.Namespace) -> int:
    from ..peft import ram_merge_adapter_files

    if args.base and not args.into_base:
        raise ConfigError("--base is used with --into-base only (a merged adapter needs no base)")
    if args.into_base and not args.base:
        raise ConfigError("--into-base needs --base (the model the adapters were trained on)")
    adapters = agents_from_specs(args.adapters, "adapters")
    options = method_options(args)
    with replacing(Path(args.out), args.force):
        result, report = ram_merge_adapter_files(
            adapters,
            args.out,
            args.method,
            base=args.base,
            into_base=args.into_base,
            rank=args.rank,
            energy=args.energy,
            sparsify=_sparsify(args.sparsify),
            device=args.device,
            dtype=_dtype(args.dtype),
            return_info=True,
            **options,
        )
    if args.json:
        _print_json({"out": str(result), "into_base": args.into_base, **report.to_dict()})
    elif not args.quiet:
        print(report.table())
        print(f"-> {result}")
    return 0


def _stores(args: argparse.Namespace) -> int:
    import time
    import warnings

    from ..store import SnapshotStore, StoreError, UnverifiedSnapshotWarning

    store = SnapshotStore(args.store, create=False)
    if args.verify:
        report = store.verify()
        print(json.dumps(report.to_dict(), indent=2) if args.json else report.table())
        return 0 if report.ok else 1
    rows = []
    runs = {a: store.runs(a) for a in store.agents()}
    with warnings.catch_warnings(record=True) as unverified:
        warnings.simplefilter("always", UnverifiedSnapshotWarning)
        for info in store.list():
            row: dict[str, Any] = {"agent": info.agent, "run": info.run, "step": info.step}
            try:
                snap = info.open()
            except StoreError as exc:  # one damaged snapshot does not hide the others
                rows.append({**row, "error": str(exc)})
                continue
            rows.append(
                {
                    **row,
                    "changed": snap.changed,
                    "numel": snap.numel,
                    "density": snap.density,
                    "bytes": snap.bytes,
                    "dense_bytes": snap.dense_bytes,
                }
            )
    if args.json:
        listed = {
            a: [{"run": r.run, "started": r.started, "steps": list(r.steps), "current": r is rs[-1]} for r in rs]
            for a, rs in runs.items()
        }
        doc = {"store": str(store.root), "base": store.base_fingerprint, "runs": listed, "snapshots": rows}
        print(json.dumps(doc, indent=2))
        return 0
    print(f"store {store.root}  base {store.base_fingerprint or '(none)'}")
    for agent, rs in runs.items():
        for r in rs:
            began = "before runs" if r.started is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.started))
            current = "  (current: merges take this run)" if r is rs[-1] and len(rs) > 1 else ""
            steps = f"steps {r.steps[0]}-{r.steps[-1]}"
            print(f"run {agent}/{r.run}: {len(r.steps)} snapshot(s), {steps}, began {began}{current}")
    print(f"{'agent':<16}{'run':<24}{'step':>10}{'density':>10}{'changed':>14}{'on disk':>12}{'dense':>12}")
    for r in rows:
        lead = f"{r['agent'][:15]:<16}{r['run'][:23]:<24}{r['step']:>10}"
        if "error" in r:
            print(f"{lead}  unreadable: {r['error']}")
            continue
        print(
            f"{lead}{r['density']:>10.2%}{r['changed']:>14,}"
            f"{r['bytes'] / 1e6:>10.1f}MB{r['dense_bytes'] / 1e6:>10.1f}MB"
        )
    if unverified:
        print(
            f"{len(unverified)} of them (or the base) carry no checksums (written by an older ram_live); "
            "--verify checks the others"
        )
    return 0


def _clean(args: argparse.Namespace) -> int:
    from ..io.outputs import STALE_AGE, clean_stale

    folder = Path(args.folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder")
    removed = clean_stale(folder, min_age=STALE_AGE if args.min_age is None else args.min_age)
    if args.json:
        _print_json({"folder": str(folder), "removed": [str(p) for p in removed]})
        return 0
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
