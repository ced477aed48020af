"""TIES and DARE-TIES on the device as one ``torch.library`` custom op, ``torch.ops.ram_live.ties_merge_``: the trim
(thresholds from :mod:`.select`'s histograms) or DARE's drop, the sign election and the disjoint mean in one read
of the inputs and one write of the output. It runs :func:`.ties_triton.ties_merge_kernel` where Triton serves the
device, else the CPU path's own torch functions (:func:`ram_live.functional.ties_combine`) over the whole tensor in
steps, whose bits the kernel gives (K <= 4; see ``docs/methods.md`` for K >= 5). Invalid entries (NaN/Inf task
vectors or outputs) are added to an int64 slot on the device that the engine reads once per pass.

Not ``from __future__ import annotations``: ``torch.library.custom_op`` reads the annotations as types.
"""

from typing import Optional

import torch
from torch import Tensor

from ...functional.trimming import ties_combine, trim_
from .common import (
    OUT_DTYPES,
    agent_args,
    block_size,
    group_takes,
    kernel_out,
    per_tensor,
    launch,
    register_cap,
    triton_takes,
)
from .linear import drop_arguments, dropped_, stacked_deltas, write_merged
from .select import NBINS, PASSES, TORCH_STEP, MagnitudeSelection, _torch_histogram

__all__ = ["ties_merge_", "ties_group_", "dare_ties_group_", "MAJORITY", "DIVIDE"]

#: The election and division options as the op takes them (their index).
MAJORITY = ("total", "frequency")
DIVIDE = ("count", "weights", "none")
#: Warps per program of the merge kernel (each program merges one block of the tensor).
MERGE_WARPS = 4


@torch.library.custom_op("ram_live::ties_merge_", mutates_args=("out", "invalid"))
def ties_merge_(
    out: Tensor,
    base: Tensor,
    agents: list[Tensor],
    weights: Tensor,
    histograms: Optional[Tensor],
    ranks: list[int],
    densities: list[float],
    seeds: list[int],
    scale: float,
    majority: int,
    weighted_election: bool,
    divide: int,
    invalid: Tensor,
) -> None:
    """θ* = θ₀ + scale · TIES(τ) into ``out``. Trim: ``ranks`` per agent (:func:`.select.selection_rank`; empty:
    no trim) with the radix select's ``histograms``; DARE: ``densities``/``seeds`` (empty: no drop). ``majority``,
    ``divide``: indices into :data:`MAJORITY`, :data:`DIVIDE`; ``weighted_election``: elect on w_t τ_t. Adds to
    ``invalid`` (int64, 0-d) the NaN/Inf task vectors and outputs."""
    takes = out.dtype in OUT_DTYPES and triton_takes([base, *agents, out], len(agents))
    args = (out, base, agents, weights, histograms, ranks, densities, seeds, scale, majority, weighted_election)
    launch("ties_merge_kernel", takes, _triton_ties, _torch_ties, *args, divide, invalid)


@ties_merge_.register_fake
def _(out, base, agents, weights, histograms, ranks, densities, seeds, scale, majority, weighted, divide, invalid):
    return None


@torch.library.custom_op("ram_live::dare_ties_group_", mutates_args=("outs", "invalid"))
def dare_ties_group_(
    outs: list[Tensor],
    bases: list[Tensor],
    agents: list[Tensor],
    weights: Tensor,
    densities: list[float],
    seeds: list[int],
    scale: float,
    majority: int,
    weighted_election: bool,
    divide: int,
    invalid: Tensor,
    slots: list[int],
) -> None:
    """:func:`ties_merge_` without the trim (DARE-TIES) of many contiguous tensors in one launch: tensor ``i`` merges
    ``bases[i]`` and agents ``agents[i*K:(i+1)*K]`` with seeds ``seeds[i*K:(i+1)*K]`` into ``outs[i]`` and adds its
    invalid entries to ``invalid[slots[i]]``."""
    per, per_seeds = per_tensor(agents, len(bases)), per_tensor(seeds, len(bases))
    takes = group_takes(outs, bases, agents, []) and len(seeds) in (0, len(agents))
    args = (outs, bases, per, weights, densities, per_seeds, scale, majority, weighted_election, divide)
    launch("dare_ties_group_kernel", takes, _triton_group, _torch_group, *args, invalid, slots)


@dare_ties_group_.register_fake
def _(outs, bases, agents, weights, densities, seeds, scale, majority, weighted, divide, invalid, slots):
    return None


def _triton_group(outs, bases, agents, weights, densities, seeds, scale, majority, weighted, divide, invalid, slots):
    from .group_baseline_triton import launch_dare_ties_group

    drop, _, density_args = drop_arguments(densities, [])
    launch_dare_ties_group(
        outs, bases, agents, weights, scale, seeds, drop, density_args, majority, weighted, divide, invalid, slots
    )


def _torch_group(outs, bases, agents, weights, densities, seeds, scale, majority, weighted, divide, invalid, slots):
    for i, (out, base) in enumerate(zip(outs, bases)):
        flat = [a.view(-1) for a in agents[i]]
        agent_seeds = list(seeds[i]) if seeds else []
        _torch_ties(out.view(-1), base.view(-1), flat, weights, None, [], densities, agent_seeds, scale, majority,
                    weighted, divide, invalid[slots[i]])  # fmt: skip


@torch.library.custom_op("ram_live::ties_group_", mutates_args=("outs", "invalid"))
def ties_group_(
    outs: list[Tensor],
    bases: list[Tensor],
    agents: list[Tensor],
    weights: Tensor,
    ranks: list[int],
    scale: float,
    majority: int,
    weighted_election: bool,
    divide: int,
    invalid: Tensor,
    slots: list[int],
) -> None:
    """:func:`ties_merge_` with the trim (no DARE) of many contiguous tensors: tensor ``i`` merges ``bases[i]`` and
    agents ``agents[i*K:(i+1)*K]`` trimmed to their ranks ``ranks[i*K:(i+1)*K]`` (:func:`.select.selection_rank`;
    which agents select and which keep nothing is the same for every tensor) into ``outs[i]``, adding its invalid
    entries to ``invalid[slots[i]]``: five launches for them all (three digit passes, the thresholds, the merge)."""
    per, per_ranks = per_tensor(agents, len(bases)), per_tensor(ranks, len(bases))
    takes = group_takes(outs, bases, agents, []) and len(ranks) == len(agents) and _one_pattern(ranks, len(per[0]))
    args = (outs, bases, per, weights, per_ranks, scale, majority, weighted_election, divide, invalid, slots)
    launch("ties_group_kernel", takes, _triton_ties_group, _torch_ties_group, *args)


def _one_pattern(ranks: list[int], k: int) -> bool:
    """Whether every tensor's ranks (``k`` each, in order) have one trim pattern: each agent selects (rank > 0),
    keeps nothing (0) or keeps all (-1) in every tensor."""
    columns = [ranks[t::k] for t in range(k)]
    return all(min(c) > 0 or min(c) == max(c) for c in columns)


@ties_group_.register_fake
def _(outs, bases, agents, weights, ranks, scale, majority, weighted, divide, invalid, slots) -> None:
    return None


def _triton_ties_group(outs, bases, agents, weights, ranks, scale, majority, weighted, divide, invalid, slots):
    from .group_ties_triton import launch_ties_group

    launch_ties_group(outs, bases, agents, weights, ranks, scale, majority, weighted, divide, invalid, slots)


def _torch_ties_group(outs, bases, agents, weights, ranks, scale, majority, weighted, divide, invalid, slots):
    for i, (out, base) in enumerate(zip(outs, bases)):
        flat_base, flat = base.view(-1), [a.view(-1) for a in agents[i]]
        hist = None
        if any(r > 0 for r in ranks[i]):
            hist = torch.zeros(3, len(flat), NBINS, dtype=torch.int32, device=base.device)
            for p in range(len(PASSES)):
                _torch_histogram(flat_base, flat, list(ranks[i]), p, hist)
        _torch_ties(out.view(-1), flat_base, flat, weights, hist, list(ranks[i]), [], [], scale, majority, weighted,
                    divide, invalid[slots[i]])  # fmt: skip


def _triton_ties(
    out, base, agents, weights, hist, ranks, densities, seeds, scale, majority, weighted, divide, invalid
) -> None:
    from .select import triton_thresholds
    from .ties_triton import ties_merge_kernel

    written, bf16 = kernel_out(out)
    k, numel = len(agents), base.numel()
    drop, seed_args, density_args = drop_arguments(densities, seeds)
    trim = sum(1 << t for t, r in enumerate(ranks) if r > 0) if hist is not None else 0
    none_kept = sum(1 << t for t, r in enumerate(ranks) if r == 0)
    thresholds = triton_thresholds(hist, ranks) if trim else None  # once for the tensor
    block = block_size([base, *agents], MERGE_WARPS)
    ties_merge_kernel[(max(1, -(-numel // block)),)](
        written, base, *agent_args(agents), weights, thresholds, invalid, numel, float(scale), *seed_args,
        *density_args,
        K=k, TRIM=trim, NONE_KEPT=none_kept, DROP=drop, SCALED=scale != 1.0, FREQUENCY=majority == 1,
        WEIGHTED=weighted, DIVIDE=divide, OUT_BF16=bf16, BLOCK=block, num_warps=MERGE_WARPS,
        enable_fp_fusion=False, **register_cap(base.device),
    )  # fmt: skip


def _torch_ties(
    out, base, agents, weights, hist, ranks, densities, seeds, scale, majority, weighted, divide, invalid
) -> None:
    numel, k = base.numel(), len(agents)
    thresholds = MagnitudeSelection(tuple(ranks), hist).thresholds(base.device) if ranks else None
    step = max(1, TORCH_STEP // max(k, 1))
    for start in range(0, numel, step):
        end = min(numel, start + step)
        base_f = base[start:end].to(torch.float32)
        deltas = dropped_(stacked_deltas(base_f, agents, start, end, invalid), start, densities, seeds)
        if thresholds is not None:
            trim_(deltas, thresholds)
        tau = ties_combine(
            deltas,
            weights,
            majority_sign=MAJORITY[majority],
            elect_on="weighted" if weighted else "unweighted",
            divide_by=DIVIDE[divide],
        )
        if scale != 1.0:
            tau.mul_(scale)
        write_merged(out, start, tau, base_f, invalid)
