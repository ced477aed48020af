"""``ram-live search``: pick the merge that scores best on your evaluation function, write it and the table.

    ram-live search coder=ckpt/coder tools=ckpt/tools --base ckpt/base --eval mypkg.evals:held_out \\
        --budget 60 --out searched/ [--confirm mypkg.evals:test] [--space '["ram_plus", "lambdas"]'] [--json] [--force]

``--eval`` names ``package.module:function``; the function receives the merged model as a state dict
(``{name: tensor}``, the base's dtypes, on ``--device``) and returns a float, higher is better. The current
folder is importable. ``--out`` gets the best merge (as ``ram-live merge --out`` writes it: a Hugging Face folder
with the base folder's config and tokenizer files), ``search.json`` (``SearchResult.to_dict()``) and
``table.txt``; with ``--plot``, a PNG.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import ConfigError
from ..loading import load_callable

__all__ = ["run_search"]


def run_search(args: argparse.Namespace) -> int:
    """The ``search`` subcommand: check the output first, search, write the winner and the table."""
    from .output import replacing

    out = Path(args.out)
    if out.suffix == ".safetensors":
        raise ConfigError("--out of search is a folder (the merge, search.json and table.txt go in it)")
    with replacing(out, getattr(args, "force", False)):
        return _search_into(args, out)


def _search_into(args: argparse.Namespace, out: Path) -> int:
    from .commands import inputs
    from ..api import merge
    from ..io.outputs import output_target
    from ..search.result import from_json
    from ..search.run import search

    output_target(out, single=False)  # before a long search: a non-empty or unusable --out is refused now
    space = None
    if args.space is not None:
        try:
            space = from_json(json.loads(args.space))  # "inf" for an uncapped alpha
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--space is not JSON: {exc}") from None
    evaluate = load_callable(args.eval, "--eval", from_cwd=True)
    confirm = load_callable(args.confirm, "--confirm", from_cwd=True) if args.confirm else None
    agents, base = inputs(args)
    result = search(agents, base=base, evaluate=evaluate, budget=args.budget, space=space, seed=args.seed,
                    confirm=confirm, confirm_top=args.confirm_top, device=args.device)
    merge(agents, base=base, out=out, device=args.device, **result.best)
    result.save(out)
    if args.plot:
        result.plot(args.plot)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    elif not args.quiet:
        print(result.table())
        print(f"-> {out}")
    return 0
