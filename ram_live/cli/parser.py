"""The ``ram-live`` argument parser, built without importing torch (``ram-live --help`` stays fast): the method
names are the baselines' static names and RAM's short names (:data:`ram_live.methods.ram.rules.RAM_METHODS`), which
``tests/test_cli_conventions.py`` keeps equal to :func:`ram_live.available_methods`.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Collection

from .. import __version__
from ..methods.ram.config import flat_fields
from ..methods.ram.rules import RAM_METHODS
from ..reward_options import DTYPE_NAMES, REWARD_OPTIONS, SHARED_FLAGS

__all__ = [
    "build_parser",
    "METHOD_NAMES",
    "DTYPE_NAMES",
    "PROBE_OPTIONS",
    "common_options",
    "ram_arguments",
    "ram_flags",
    "reward_arguments",
]

#: The registered merge methods (``ram_live.available_methods()`` without importing torch).
METHOD_NAMES = tuple(sorted(("dare_linear", "dare_ties", "linear", "task_arithmetic", "ties", *RAM_METHODS)))
_METHODS_HELP = ", ".join(METHOD_NAMES)
#: The RAM options ``probe`` takes (it reports λ for every variant).
#: ``search --sampler``'s Optuna samplers: flag value -> class in ``optuna.samplers`` (seeded by ``--seed``).
OPTUNA_SAMPLERS = {
    "optuna-tpe": "TPESampler",
    "optuna-gp": "GPSampler",
    "optuna-cmaes": "CmaEsSampler",
    "optuna-random": "RandomSampler",
    "optuna-nsga2": "NSGAIISampler",
}
PROBE_OPTIONS = ("r", "alpha", "eps", "activity")  # ram_live.probing.PROBE_OPTIONS (the parser imports no torch)


def _debug(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")


def _force(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an output that exists when the command starts (moved aside, removed once the new "
        "one is in place, put back on failure); never one created while it runs",
    )


def common_options(p: argparse.ArgumentParser) -> None:
    """The agents/--base/--store/--device/--quiet/--debug options of probe, merge and search."""
    p.add_argument("agents", nargs="*", help="agent checkpoints: file.safetensors or HF folder, or name=path")
    p.add_argument("--base", help="the base checkpoint every agent was trained from (not with --store)")
    p.add_argument(
        "--store",
        help="a snapshot store: the latest snapshot of every agent (or of the named agents), with the store's base",
    )
    p.add_argument("--device", default=None, help="compute device (default: cpu)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    _debug(p)


def ram_arguments(p: argparse.ArgumentParser, names: Collection[str], *, given_only: bool = False) -> None:
    """``--<option>`` flags for the named flat keywords of :class:`~ram_live.RamConfig` and its λ rules
    (:func:`ram_live.methods.ram.config.flat_fields`; ``rho_scope`` as ``--rho-scope``), their help, choices and parsing
    from the dataclasses' fields. ``given_only``: a flag not given is not
    in the namespace (the method's own default applies); else its default is the field's."""
    group = p.add_argument_group(
        "RAM options",
        "fields of ram_live.RamConfig and its λ rule"
        + (" (for the RAM methods ram, ram_plus, ram_plus_soft)" if given_only else ""),
    )
    for f in flat_fields():
        if f.name not in names:
            continue
        meta = f.metadata
        extra = {k: meta[k] for k in ("choices", "metavar") if meta[k] is not None}
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=_parsed(meta["parse"]),
            help=meta["help"],
            default=argparse.SUPPRESS if given_only else f.default,
            **extra,
        )


def _parsed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` whose ValueError argparse reports with its message (a usage error, exit status 2)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def ram_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The RAM options in a parsed namespace (those given, under ``given_only``)."""
    return {f.name: getattr(args, f.name) for f in flat_fields() if hasattr(args, f.name)}


#: The RAM flags of merge and merge-adapters: every flat keyword (the λ rule is ``--method``).
_MERGE_RAM_OPTIONS = tuple(f.name for f in flat_fields())


def reward_arguments(p: argparse.ArgumentParser) -> None:
    """``search``'s flags for the keywords of :func:`ram_live.evaluate.rewards`, from
    :data:`ram_live.reward_options.REWARD_OPTIONS` (``--device`` is the command's own). A flag not given is not in
    the namespace: ``rewards()``' own default applies, as in the API."""
    group = p.add_argument_group(
        "evaluation options", "with --reward: the keywords of ram_live.evaluate.rewards (docs/evaluate.md)"
    )
    for option in REWARD_OPTIONS:
        if option.name in SHARED_FLAGS:
            continue
        shown = option.default is not None and option.default is not False and "default" not in option.help
        group.add_argument(
            option.flag,
            dest=option.dest,
            default=argparse.SUPPRESS,
            help=option.help + (f" (default {option.default})" if shown else ""),
            **option.argparse,
        )


def _probe(sub: Any) -> None:
    p = sub.add_parser("probe", help="density, shared/unique entries, rho and lambda per agent")
    common_options(p)
    ram_arguments(p, PROBE_OPTIONS)
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="the report as JSON: alone (or '-') on stdout instead of the table; with FILE, written "
        "there next to the table",
    )
    p.add_argument("--plot", metavar="PNG", help="save per-layer heatmaps (needs the plot extra)")


def _merge(sub: Any) -> None:
    m = sub.add_parser("merge", help="merge agents into a new checkpoint")
    common_options(m)
    m.add_argument("--out", required=True, help="output folder (HF layout) or file.safetensors")
    m.add_argument("--method", default="ram_plus", help=f"merge method: {_METHODS_HELP} (default: ram_plus)")
    m.add_argument(
        "--config",
        metavar="YML",
        help="a mergekit YAML config: models, base, method and options "
        "come from it (needs the yaml extra; see docs/mergekit.md)",
    )
    m.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method option, e.g. -O density=0.2 -O weights=[1,2]; repeatable",
    )
    ram_arguments(m, _MERGE_RAM_OPTIONS, given_only=True)
    m.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default=None, help="output dtype (default: the base's)")
    m.add_argument("--max-shard-size", type=float, default=5.0, metavar="GB", help="shard size in GB (default 5)")
    m.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: split the tensors over the ranks (gloo on CPU, nccl with --device cuda)",
    )
    m.add_argument("--json", action="store_true", help="print what the merge did as one JSON object")
    _force(m)


def _merge_adapters(sub: Any) -> None:
    a = sub.add_parser("merge-adapters", help="merge PEFT LoRA adapter folders (into a new adapter, or a model)")
    a.add_argument(
        "adapters",
        nargs="+",
        help="PEFT adapter folders (adapter_config.json + adapter_model.safetensors), or name=folder",
    )
    a.add_argument(
        "--out",
        required=True,
        help="output: an adapter folder; with --into-base, a model folder (HF layout) or file.safetensors",
    )
    a.add_argument("--base", help="the base model (safetensors file or HF folder); only with --into-base")
    a.add_argument(
        "--into-base",
        action="store_true",
        help="fold the merged delta into --base and write the model, instead of a new adapter",
    )
    a.add_argument("--method", default="ram_plus", help=f"merge method: {_METHODS_HELP} (default: ram_plus)")
    a.add_argument(
        "-O",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method option, e.g. -O density=0.2; repeatable",
    )
    ram_arguments(a, _MERGE_RAM_OPTIONS, given_only=True)
    a.add_argument(
        "--rank", type=int, default=None, help="rank of the merged adapter (default: the largest input rank)"
    )
    a.add_argument(
        "--energy",
        type=float,
        default=None,
        help="per module the smallest rank whose singular values keep this fraction of the energy (at most --rank)",
    )
    a.add_argument(
        "--sparsify",
        default="auto",
        metavar="RULE",
        help="which delta entries count as updated: auto (the recommended rule for RAM), none, "
        "topk[:DENSITY], relative[:THRESHOLD] (default auto)",
    )
    a.add_argument(
        "--dtype",
        choices=sorted(DTYPE_NAMES),
        default=None,
        help="output dtype (default: the adapters' for an adapter, the base's for a model)",
    )
    a.add_argument("--device", default=None, help="compute device (default: cpu)")
    a.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    a.add_argument("--json", action="store_true", help="print the merge report as one JSON object")
    _force(a)
    _debug(a)


def _stores_and_clean(sub: Any) -> None:
    st = sub.add_parser("stores", help="what a snapshot store holds")
    st.add_argument("store", help="the snapshot store folder")
    st.add_argument("--json", action="store_true", help="print JSON")
    st.add_argument(
        "--verify",
        action="store_true",
        help="check every manifest and data file (sizes, tensors, CRC-32); exit status 1 on damage",
    )
    _debug(st)
    c = sub.add_parser("clean", help="remove the temporary folders killed merges left in a folder")
    c.add_argument("folder", help="the folder outputs were written into (the parent of --out)")
    c.add_argument(
        "--min-age",
        type=float,
        default=None,
        metavar="S",
        help="only folders unchanged for S seconds (default 60); live merges are never touched",
    )
    c.add_argument("--json", action="store_true", help="print the removed folders as one JSON object")
    _debug(c)


def _search(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    s = sub.add_parser("search", help="pick the merge that scores best on your evaluation (writes it and a table)")
    common(s)
    s.add_argument(
        "--eval",
        default=None,
        metavar="MODULE:FUNCTION",
        help="evaluation: a function state_dict -> float (higher is better), e.g. mypkg.evals:held_out",
    )
    reward_arguments(s)
    s.add_argument("--out", help="output folder: the best merge, search.json, table.txt (required but with --plan)")
    s.add_argument(
        "--plan",
        action="store_true",
        help="search nothing: print what the budget buys (candidates, prompt-evaluations, generations; full and raced)",
    )
    s.add_argument(
        "--seconds-per-candidate",
        type=float,
        default=None,
        metavar="S",
        help="with --plan: one candidate's evaluation time (e.g. timed on the base), for the plan's time",
    )
    s.add_argument(
        "--budget",
        type=_budget,
        default=60,
        metavar="N|Nx",
        help="the most candidates (default 60), or prompt-evaluations as e.g. 20x (twenty full "
        "evaluations' worth of prompts)",
    )
    s.add_argument(
        "--fidelity",
        choices=("full", "halving"),
        default="full",
        help="halving: race candidates on slices of the prompts, stop the clearly worse early (needs "
        "--reward and a budget like 20x); default full",
    )
    s.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="candidates scored at once by N worker processes (or Ray with --ray-address); default 1",
    )
    s.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="score candidates on Ray ('local' or a cluster address) with --parallel",
    )
    s.add_argument("--seed", type=int, default=0, help="orders the coordinate ascents, seeds DARE (default 0)")
    s.add_argument(
        "--sampler",
        choices=("moves", "tpe", *OPTUNA_SAMPLERS),
        default=None,
        help="what refines the arms: moves (coordinate ascents), tpe (a model of the scores) or an Optuna sampler "
        "seeded by --seed (needs optuna); default tpe in a race of 10x or more, else moves",
    )
    s.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="keep every scored candidate in an Optuna study (e.g. sqlite:///search.db): a killed search resumes, "
        "processes sharing it split the work (needs optuna)",
    )
    s.add_argument("--study", default=None, metavar="NAME", help="the study's name in --storage")
    s.add_argument(
        "--space",
        default=None,
        metavar="JSON",
        help="what to try, as JSON: a list of families/candidates or {family: grid} (default: all)",
    )
    s.add_argument(
        "--confirm",
        default=None,
        metavar="MODULE:FUNCTION",
        help="a second held-out evaluation of the top candidates (reported next to the score)",
    )
    s.add_argument("--confirm-top", type=int, default=3, help="how many candidates --confirm scores (default 3)")
    s.add_argument("--plot", metavar="PNG", help="also save the scores by family (needs matplotlib)")
    s.add_argument("--json", action="store_true", help="print search.json to stdout instead of the table")
    _force(s)


def _budget(text: str) -> int | str:
    """``--budget``: an int (candidates) or ``"20x"`` (prompt-evaluations; checked by the search)."""
    if text.strip().lower().endswith("x"):
        return text.strip()
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of candidates (60) nor of full evaluations' worth of prompts (20x)"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """The whole ``ram-live`` parser (``verl-snapshot`` only named: its own parser parses its arguments)."""
    parser = argparse.ArgumentParser(
        prog="ram-live",
        description="Merge RL-trained agents with RAM.",
        epilog=f"merge methods: {_METHODS_HELP}. Errors: one line on stderr, exit "
        "status 2 (bad input) or 1. docs/cli.md has every option.",
    )
    parser.add_argument(
        "--version", action="version", version=f"ram-live {__version__}", help="print the version and exit"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _probe(sub)
    _merge(sub)
    _merge_adapters(sub)
    _search(sub, common_options)
    _stores_and_clean(sub)
    v = sub.add_parser("verl-snapshot", add_help=False, help="turn verl checkpoints into snapshots (see --help)")
    v.add_argument("rest", nargs=argparse.REMAINDER, help="verl-snapshot's options (ram-live verl-snapshot --help)")
    return parser
