"""The merge of the adapters' ΔW with the engine: in ΔW space (zero base), or into a base model."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from ..engine.run import run_merge
from ..types import MergeInfo
from ..errors import ConfigError
from ..methods import Activity, get_method, make_config
from ..io.sources import TensorSpec, as_source
from .deltas import BasePlusDeltaSource, CallbackSink, AdapterDeltas, DeltaSource, ZeroBase
from .errors import DenseDeltaWarning
from .factors import AdapterSet, check_consistent, weight_key
from .report import AdapterMergeReport
from .sparsify import RAM_FAMILY, RECOMMENDED_SPARSIFY, SparsifyRule, sparsify_rule
from .svd_options import SvdOptions


@dataclass
class PreparedMerge:
    method: str
    rule: SparsifyRule | None
    options: dict[str, Any]
    deltas: list[AdapterDeltas]


def prepare_merge(adapters: AdapterSet, method: str, options: Mapping[str, Any], sparsify: Any) -> PreparedMerge:
    """Check options and inputs (nothing is computed) and set up each adapter's ΔW reader."""
    rule = sparsify_rule(sparsify, method)
    get_method(method)
    opts = dict(options)
    if rule is not None and method in RAM_FAMILY:
        opts.setdefault("eps", 0.0)  # the rule decides what is active; every kept entry counts
    make_config(method, None, **opts)
    check_consistent(adapters)
    # what the merge counts as active (the RAM family's own activity; the paper's |Δ| > 1e-5 for the others)
    activity = Activity(options.get("activity", "abs"), float(options.get("eps", 1e-5)))
    deltas = [AdapterDeltas(a, adapters.factors[a], rule, activity) for a in adapters.names]
    return PreparedMerge(method, rule, opts, deltas)


def finish_report(prep: PreparedMerge, info: MergeInfo, report: "AdapterMergeReport", warn_dense: bool) -> None:
    report.method = prep.method
    report.config = info.config
    report.sparsify = str(prep.rule) if prep.rule is not None else None
    report.lambdas = info.lambdas
    report.rho = info.rho
    report.merge_seconds = info.seconds
    for d in prep.deltas:
        report.density[d.name], report.active[d.name] = d.density()
    if warn_dense and prep.rule is None and prep.method in RAM_FAMILY:
        dense = {a: x for a, x in report.density.items() if x > 0.5}
        if dense:
            shown = ", ".join(f"{a!r} {100 * x:.1f} %" for a, x in dense.items())
            eps = prep.deltas[0].eps
            warnings.warn(
                f"RAM on dense LoRA deltas: {shown} of the ΔW entries exceed eps={eps:g}, so nearly every entry is "
                "shared and RAM reduces to a plain mean of the adapters. Pass a sparsifying activity rule, e.g. "
                f"sparsify={RECOMMENDED_SPARSIFY!r} (the recommended one, which sparsify='auto' uses).",
                DenseDeltaWarning,
                stacklevel=3,
            )


def merge_in_delta_space(
    adapters: AdapterSet,
    prep: PreparedMerge,
    on_module: Callable[[str, Tensor], None],
    *,
    device: torch.device | None,
    chunk_numel: int,
) -> MergeInfo:
    """Merge the ΔW_t (zero base) with the engine, module by module; ``on_module`` gets each ΔW*."""
    from ..api import check_run_options

    device = check_run_options(device, chunk_numel, None)
    specs = {}
    for m in adapters.order:
        f = adapters.module(m)
        specs[weight_key(m)] = TensorSpec(f.weight_shape, torch.float32, device or f.B.device)
    sources = [DeltaSource(d, specs) for d in prep.deltas]
    cfg = make_config(prep.method, None, **prep.options)
    return run_merge(
        ZeroBase(specs),
        sources,
        get_method(prep.method),
        cfg,
        CallbackSink(on_module),
        device=device,
        chunk_numel=chunk_numel,
    )


def merge_into_base(
    base: Any,
    prep: PreparedMerge,
    *,
    inplace: bool,
    out: Any,
    device: Any,
    dtype: Any,
    max_shard_bytes: int,
    chunk_numel: int,
) -> tuple[Any, MergeInfo]:
    """θ* = θ₀ + merged ΔW through :func:`ram_live.merge`, with agents "base + ΔW_t" read lazily."""
    from ..api import merge

    base_source = as_source(base, "base")
    agents = {d.name: BasePlusDeltaSource(base_source, d) for d in prep.deltas}
    kwargs: dict[str, Any] = {}
    if out is not None:
        kwargs["max_shard_bytes"] = max_shard_bytes
    return merge(
        agents,
        base=base,
        method=prep.method,
        inplace=inplace,
        out=out,
        device=device,
        dtype=dtype,
        chunk_numel=chunk_numel,
        return_info=True,
        **kwargs,
        **prep.options,
    )


def check_options(
    svd_options: SvdOptions | None,
    svd_keywords: Mapping[str, Any],
    rank: int | None,
    inplace: bool,
    into_base: bool,
    where: str,
) -> SvdOptions:
    """The entry point's :class:`SvdOptions` (``svd_options=``, or its old keyword spellings and the ``rank``
    that PEFT's ``svd_rank=`` may have spelled), and :class:`ConfigError` for ``inplace`` without ``into_base``."""
    keywords = {**svd_keywords, "rank": rank} if rank is not None else dict(svd_keywords)
    options = SvdOptions.of(svd_options, where=where, **keywords)
    if inplace and not into_base:
        raise ConfigError("inplace=True applies to into_base=True only")
    return options
