"""Task arithmetic, linear and DARE-linear on the device as one ``torch.library`` custom op,
``torch.ops.ram_live.linear_merge_``: one launch per tensor, each input read once and the output written once. It
runs :func:`.linear_triton.linear_merge_kernel` where Triton serves the device, else the CPU path's own torch
functions over the whole tensor (in steps that bound its scratch), whose bits the kernel gives (K <= 4; see
``docs/methods.md`` for K >= 5). Invalid entries (NaN/Inf task vectors or outputs) are added to an int64 slot
on the device that the engine reads once per pass.

Not ``from __future__ import annotations``: ``torch.library.custom_op`` reads the annotations as types.
"""

import torch
from torch import Tensor

from ...functional.combine import task_arithmetic_combine
from .common import (
    MAX_AGENTS,
    OUT_DTYPES,
    agent_args,
    block_size,
    group_takes,
    per_tensor,
    kernel_out,
    launch,
    register_cap,
    triton_takes,
)
from .philox import keep_mask
from .select import TORCH_STEP

__all__ = ["linear_merge_", "linear_merge_group_", "MERGE_WARPS"]

#: Warps per program of the merge kernel (each program merges one block of the tensor).
MERGE_WARPS = 4


@torch.library.custom_op("ram_live::linear_merge_", mutates_args=("out", "invalid"))
def linear_merge_(
    out: Tensor,
    base: Tensor,
    agents: list[Tensor],
    weights: Tensor,
    scale: float,
    densities: list[float],
    seeds: list[int],
    invalid: Tensor,
) -> None:
    """θ* = θ₀ + scale · Σ_t w_t τ_t into ``out`` (flat, like ``base`` and each agent); ``weights``: float64
    ``[K]`` on the device; ``densities``/``seeds``: empty, or DARE's drop per agent (density >= 1: kept whole).
    Adds to ``invalid`` (int64, 0-d) the NaN/Inf task vectors and outputs."""
    takes = out.dtype in OUT_DTYPES and triton_takes([base, *agents, out], len(agents))
    args = (out, base, agents, weights, scale, densities, seeds, invalid)
    launch("linear_merge_kernel", takes, _triton_linear, _torch_linear, *args)


@linear_merge_.register_fake
def _(out, base, agents, weights, scale, densities, seeds, invalid) -> None:
    return None


@torch.library.custom_op("ram_live::linear_merge_group_", mutates_args=("outs", "invalid"))
def linear_merge_group_(
    outs: list[Tensor],
    bases: list[Tensor],
    agents: list[Tensor],
    weights: Tensor,
    scale: float,
    densities: list[float],
    seeds: list[int],
    invalid: Tensor,
    slots: list[int],
) -> None:
    """:func:`linear_merge_` of many contiguous tensors in one launch: tensor ``i`` merges ``bases[i]`` and agents
    ``agents[i*K:(i+1)*K]`` (DARE: ``densities`` per agent, ``seeds[i*K:(i+1)*K]``; both empty: no drop) into
    ``outs[i]`` and adds its invalid entries to ``invalid[slots[i]]``."""
    per, per_seeds = per_tensor(agents, len(bases)), per_tensor(seeds, len(bases))
    takes = group_takes(outs, bases, agents, []) and len(seeds) in (0, len(agents))
    args = (outs, bases, per, weights, scale, densities, per_seeds, invalid, slots)
    launch("linear_merge_group_kernel", takes, _triton_group, _torch_group, *args)


@linear_merge_group_.register_fake
def _(outs, bases, agents, weights, scale, densities, seeds, invalid, slots) -> None:
    return None


def _triton_group(outs, bases, agents, weights, scale, densities, seeds, invalid, slots) -> None:
    from .group_baseline_triton import launch_linear_merge_group

    drop, _, density_args = drop_arguments(densities, [])
    launch_linear_merge_group(outs, bases, agents, weights, scale, seeds, drop, density_args, invalid, slots)


def _torch_group(outs, bases, agents, weights, scale, densities, seeds, invalid, slots) -> None:
    for i, (out, base) in enumerate(zip(outs, bases)):
        flat = [a.view(-1) for a in agents[i]]
        agent_seeds = list(seeds[i]) if seeds else []
        _torch_linear(out.view(-1), base.view(-1), flat, weights, scale, densities, agent_seeds, invalid[slots[i]])


def drop_arguments(densities: list[float], seeds: list[int]) -> tuple[int, list[int], list[float]]:
    """The kernels' DARE arguments: the bitmask of agents that drop, and eight seeds and densities."""
    mask = sum(1 << t for t, d in enumerate(densities) if d < 1.0)
    return (
        mask,
        [*seeds, *([0] * (MAX_AGENTS - len(seeds)))],
        [*map(float, densities), *([1.0] * (MAX_AGENTS - len(densities)))],
    )


def _triton_linear(out, base, agents, weights, scale, densities, seeds, invalid) -> None:
    from .linear_triton import linear_merge_kernel

    written, bf16 = kernel_out(out)
    numel = base.numel()
    drop, seed_args, density_args = drop_arguments(densities, seeds)
    block = block_size([base, *agents], MERGE_WARPS)
    linear_merge_kernel[(max(1, -(-numel // block)),)](
        written, base, *agent_args(agents), weights, invalid, numel, float(scale), *seed_args, *density_args,
        K=len(agents), DROP=drop, SCALED=scale != 1.0, OUT_BF16=bf16, BLOCK=block, num_warps=MERGE_WARPS,
        enable_fp_fusion=False, **register_cap(base.device),
    )  # fmt: skip


def dropped_(deltas: Tensor, start: int, densities: list[float], seeds: list[int]) -> Tensor:
    """DARE's drop of the ``[K, n]`` rows (entries ``start`` on) in place, with the masks the kernels draw."""
    for t, row in enumerate(deltas):
        if densities and densities[t] < 1.0:
            row.mul_(keep_mask(seeds[t], start, start + row.numel(), densities[t], row.device)).div_(densities[t])
    return deltas


def stacked_deltas(base_f: Tensor, agents: list[Tensor], start: int, end: int, invalid: Tensor) -> Tensor:
    """The ``[K, n]`` float32 task vectors of entries ``[start, end)``; adds their NaN/Inf count to ``invalid``."""
    deltas = torch.stack([a[start:end].to(torch.float32) for a in agents]).sub_(base_f)
    invalid += (~torch.isfinite(deltas)).sum()
    return deltas


def write_merged(out: Tensor, start: int, tau: Tensor, base_f: Tensor, invalid: Tensor) -> None:
    """θ₀ + τ* into ``out[start:]`` (the base's bits where τ* = 0), counting NaN/Inf written values."""
    written = out[start : start + base_f.numel()]
    written.copy_(torch.where(tau != 0, tau + base_f, base_f))
    invalid += (~torch.isfinite(written)).sum()


def _torch_linear(out, base, agents, weights, scale, densities, seeds, invalid) -> None:
    numel, k = base.numel(), len(agents)
    step = max(1, TORCH_STEP // max(k, 1))
    for start in range(0, numel, step):
        end = min(numel, start + step)
        base_f = base[start:end].to(torch.float32)
        deltas = dropped_(stacked_deltas(base_f, agents, start, end, invalid), start, densities, seeds)
        tau = task_arithmetic_combine(deltas, weights)
        if scale != 1.0:
            tau.mul_(scale)
        write_merged(out, start, tau, base_f, invalid)
