"""The baselines' device path (task arithmetic, linear, TIES, DARE-linear, DARE-TIES): which tensors it takes
(:func:`device_stream`), and the engine's kernels that merge one tensor by one custom op
(:func:`merge_linear`: ``torch.ops.ram_live.linear_merge_``; :func:`merge_ties`: ``torch.ops.ram_live.ties_merge_``,
after TIES' radix select in its ``prepare``). A method's ``prepare`` hook returns a device state only for a tensor
this path takes, and its ``kernels.merge`` runs the device kernel exactly for such a state, so the CPU and every
tensor the path does not take merge as before. Invalid entries are counted into the stream's deferred slot: no host
sync per tensor (on a CPU, :meth:`~ram_live.engine.stream.DeltaStream.settle` raises at once)."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
from torch import Tensor

from ..engine import checks
from ..engine.ops import call_op
from ..engine.stream import DeltaStream
from ..kernels.device import linear as _linear  # registers torch.ops.ram_live.linear_merge_
from ..kernels.device import ties as _ties  # registers torch.ops.ram_live.ties_merge_
from ..kernels.device.common import INPUT_DTYPES
from ..kernels.device.select import MagnitudeSelection, selection_rank
from ..functional import stable_seed
from .base import GroupItem, GroupMerge, agent_densities, group_columns
from ..kernels.device.ties import DIVIDE, MAJORITY

__all__ = ["device_stream", "merge_linear", "merge_ties", "linear_merge_hook", "linear_group", "ties_group"]


def device_stream(view: Any) -> DeltaStream | None:
    """The stream behind a ``prepare`` hook's view where the device path takes its tensor, else None: inputs on one
    accelerator in float32/bfloat16/float16 (float32 compute), no activity rule, no auxiliary inputs.

    Example:
        >>> device_stream(object()) is None
        True
    """
    stream = getattr(view, "stream", None)
    if not isinstance(stream, DeltaStream) or not checks.deferred_device(stream.device):
        return None
    if stream.dtype != torch.float32 or stream.activity is not None or stream.auxiliary:
        return None
    tensors = (stream.base, *stream.tensors)
    if any(t.device != stream.device or t.dtype not in INPUT_DTYPES for t in tensors):
        return None
    return stream


def merge_linear(
    stream: DeltaStream,
    flat: Tensor,
    weights: Tensor,
    scale: float,
    densities: Sequence[float] = (),
    seeds: Sequence[int] = (),
) -> None:
    """θ₀ + scale · Σ_t w_t τ_t (DARE's drop first where ``densities`` are given) into ``flat``: one launch."""
    slot = stream.invalid_slot()
    call_op(
        _linear.linear_merge_,
        flat,
        stream.base,
        list(stream.tensors),
        weights.to(stream.device),
        float(scale),
        [float(d) for d in densities],
        list(seeds),
        slot,
    )
    stream.settle(slot, flat)


def merge_ties(
    stream: DeltaStream,
    flat: Tensor,
    weights: Tensor,
    config: Any,
    selection: MagnitudeSelection | None = None,
    densities: Sequence[float] = (),
    seeds: Sequence[int] = (),
) -> None:
    """TIES (``selection``: the trim's radix select) or DARE-TIES (``densities``/``seeds``) with ``config``'s
    election options into ``flat``: one launch."""
    slot = stream.invalid_slot()
    call_op(
        _ties.ties_merge_,
        flat,
        stream.base,
        list(stream.tensors),
        weights.to(stream.device),
        None if selection is None else selection.histograms,
        [] if selection is None else list(selection.ranks),
        [float(d) for d in densities],
        list(seeds),
        float(config.scale),
        MAJORITY.index(config.majority_sign),
        config.elect_on == "weighted",
        DIVIDE.index(config.divide_by),
        slot,
    )
    stream.settle(slot, flat)


def linear_merge_hook(scale: float) -> Any:
    """A ``MethodKernels.merge`` for task arithmetic and linear, whose ``prepare`` gives the weights (a float64
    device tensor) for the tensors this path takes and None elsewhere."""

    def merge(stream: DeltaStream, out: Tensor, state: Any, workers: int) -> Any:
        if state is None:
            return None
        return "device", functools.partial(merge_linear, weights=state, scale=scale)

    return merge


def linear_group(
    scale: float, weights: Tensor | None, activity: Any, agents: Sequence[str] = (), dare: Any = None
) -> GroupMerge | None:
    """A ``MethodKernels.group`` for task arithmetic, linear, DARE-linear and DARE-TIES (``dare``: DARE's config,
    whose ``seed`` and densities drop each tensor's entries as :func:`~ram_live.methods.dare.dare_prepare` seeds
    them): the merge's weights (its run state, a float64 tensor) for every tensor, in one launch of
    ``torch.ops.ram_live.linear_merge_group_`` (DARE-TIES: ``dare_ties_group_``). None with an activity rule (the
    device path takes none)."""
    if weights is None or activity is not None:
        return None
    densities = [] if dare is None else agent_densities(dare, agents)
    elect = dare is not None and hasattr(dare, "majority_sign")

    def merge(items: list[GroupItem], invalid: Tensor) -> None:
        outs, bases, tensors, slots = group_columns(items)
        on_device = weights.to(bases[0].device)
        seeds = [] if dare is None else [stable_seed("dare", dare.seed, a, i.key) for i in items for a in agents]
        if elect:
            options = (float(dare.scale), MAJORITY.index(dare.majority_sign), dare.elect_on == "weighted")
            call_op(_ties.dare_ties_group_, outs, bases, tensors, on_device, densities, seeds, *options,
                    DIVIDE.index(dare.divide_by), invalid, slots)  # fmt: skip
        else:
            call_op(_linear.linear_merge_group_, outs, bases, tensors, on_device, float(scale), densities, seeds,
                    invalid, slots)  # fmt: skip

    return GroupMerge(lambda base, tensors: True, merge)


def ties_group(config: Any, weights: Tensor | None, activity: Any, agents: Sequence[str] = ()) -> GroupMerge | None:
    """A ``MethodKernels.group`` for TIES: each tensor's ranks (its agents' densities of its entries), the tensors of
    one trim pattern (which agents select, which keep nothing) in five launches of
    ``torch.ops.ram_live.ties_group_``; None with an activity rule."""
    if weights is None or activity is not None:
        return None
    densities = agent_densities(config, agents)
    election = (MAJORITY.index(config.majority_sign), config.elect_on == "weighted", DIVIDE.index(config.divide_by))

    def merge(items: list[GroupItem], invalid: Tensor) -> None:
        patterns: dict[tuple, list[tuple[GroupItem, list[int]]]] = {}
        by_size: dict[int, tuple[tuple, list[int]]] = {}  # a model's tensors come in few sizes
        for item in items:
            numel = item.base.numel()
            if numel not in by_size:
                ranks = [selection_rank(d, numel) for d in densities]
                by_size[numel] = (tuple((r > 0, r == 0) for r in ranks), ranks)
            pattern, ranks = by_size[numel]
            patterns.setdefault(pattern, []).append((item, ranks))
        on_device = weights.to(items[0].base.device)
        for group in patterns.values():
            outs, bases, tensors, slots = group_columns([item for item, _ in group])
            ranks = [r for _, row in group for r in row]
            call_op(_ties.ties_group_, outs, bases, tensors, on_device, ranks, float(config.scale), *election,
                    invalid, slots)  # fmt: skip

    return GroupMerge(lambda base, tensors: True, merge)
