"""RAM's device path: its merge and its counts as ``torch.library`` custom ops, ``torch.ops.ram_live.ram_merge_``
and ``torch.ops.ram_live.ram_counts_``, one launch per tensor (fake implementations let torch.compile, FSDP and
tracing see one op). Each runs the Triton kernels of :mod:`ram_live.kernels.device.ram_triton` where Triton
serves the device, else the same arithmetic in torch over the whole tensor (:class:`~.accumulators.RamAccumulator`,
whose bits the kernels give). Both add the entries they find invalid to an int64 slot that the engine reads once
per pass (:mod:`ram_live.engine.checks`): no host sync per tensor.

Not ``from __future__ import annotations``: ``torch.library.custom_op`` reads the annotations as types.
"""

import functools
from typing import Optional

import torch
from torch import Tensor

from ...engine.counts import ADDED
from ...engine.ops import call_op
from ...engine.stream import DeltaStream
from ...functional.activity import apply_activity_
from ...functional.counting import ram_statistics
from ...kernels.device.common import OUT_DTYPES, group_takes, launch, per_tensor, triton_takes
from ..base import GroupItem, GroupMerge, group_columns
from ...types import RamStatistics
from .accumulators import RamAccumulator, WeightedRamAccumulator

__all__ = ["merge_device", "device_statistics", "group_runner", "count_group_runner"]

#: Programs of the counting kernel per multiprocessor (each adds its sums once).
COUNT_PROGRAMS_PER_SM = 8
#: Entries per step of the torch implementation (its float32 scratch is bounded by this, not by the tensor).
TORCH_STEP = 1 << 24


def _triton_takes(out: Optional[Tensor], base: Tensor, agents: list[Tensor], importances: list[Tensor]) -> bool:
    if out is not None and out.dtype not in OUT_DTYPES:
        return False
    return triton_takes([base, *agents, *importances, *([] if out is None else [out])], len(agents))


@torch.library.custom_op("ram_live::ram_merge_", mutates_args=("out", "invalid"))
def ram_merge_(
    out: Tensor,
    base: Tensor,
    agents: list[Tensor],
    importances: list[Tensor],
    lambdas: Optional[Tensor],
    eps: float,
    sign: bool,
    invalid: Tensor,
) -> None:
    """RAM's merge of one flat tensor into ``out`` (``importances``: empty, or one per agent; ``lambdas``: float32
    ``[K]`` or None for λ = 1; ``sign``: ``shared="sign"``); adds to ``invalid`` the NaN/Inf outputs and invalid
    importances."""
    takes = _triton_takes(out, base, agents, importances)
    args = (out, base, agents, importances, lambdas, eps, sign, invalid)
    launch("ram_merge_kernel", takes, _triton_merge, _torch_merge, *args)


@ram_merge_.register_fake
def _(out, base, agents, importances, lambdas, eps, sign, invalid) -> None:
    return None


@torch.library.custom_op("ram_live::ram_merge_group_", mutates_args=("outs", "invalid"))
def ram_merge_group_(
    outs: list[Tensor],
    bases: list[Tensor],
    agents: list[Tensor],
    importances: list[Tensor],
    lambdas: Optional[Tensor],
    eps: float,
    sign: bool,
    invalid: Tensor,
    slots: list[int],
) -> None:
    """:func:`ram_merge_` of many contiguous tensors in one launch: tensor ``i`` merges ``bases[i]`` and agents
    ``agents[i*K:(i+1)*K]`` (importances likewise, or none) into ``outs[i]`` and adds its invalid entries to
    ``invalid[slots[i]]``."""
    per, hs = per_tensor(agents, len(bases)), per_tensor(importances, len(bases))
    takes = group_takes(outs, bases, agents, importances)
    launch("ram_merge_group_kernel", takes, _triton_group, _torch_group, outs, bases, per, hs, lambdas, eps, sign,
           invalid, slots)  # fmt: skip


@ram_merge_group_.register_fake
def _(outs, bases, agents, importances, lambdas, eps, sign, invalid, slots) -> None:
    return None


def _triton_group(outs, bases, agents, importances, lambdas, eps, sign, invalid, slots) -> None:
    from ...kernels.device.group_triton import launch_ram_merge_group

    launch_ram_merge_group(outs, bases, agents, importances, lambdas, eps, sign, invalid, slots)


def _torch_group(outs, bases, agents, importances, lambdas, eps, sign, invalid, slots) -> None:
    for i, (out, base) in enumerate(zip(outs, bases)):
        hs = [h.view(-1) for h in importances[i]] if importances else []
        flat = [a.view(-1) for a in agents[i]]
        _torch_merge(out.view(-1), base.view(-1), flat, hs, lambdas, eps, sign, invalid[slots[i]])


@torch.library.custom_op("ram_live::ram_counts_", mutates_args=("counts", "invalid"))
def ram_counts_(base: Tensor, agents: list[Tensor], eps: float, counts: Tensor, invalid: Tensor) -> None:
    """Adds to ``counts`` (int64 ``[3K + 1]``: active per agent, unique per agent, histogram of the active count)
    adds to ``invalid`` the entries whose inputs or task vectors are NaN/Inf."""
    takes = _triton_takes(None, base, agents, [])
    launch("activity_counts_kernel", takes, _triton_counts, _torch_counts, base, agents, eps, counts, invalid)


@ram_counts_.register_fake
def _(base, agents, eps, counts, invalid) -> None:
    return None


@torch.library.custom_op("ram_live::ram_counts_group_", mutates_args=("counts", "invalid"))
def ram_counts_group_(
    bases: list[Tensor], agents: list[Tensor], eps: float, counts: Tensor, invalid: Tensor, slots: list[int]
) -> None:
    """:func:`ram_counts_` of many contiguous tensors in one launch (agents ``agents[i*K:(i+1)*K]`` of
    ``bases[i]``), all added to ``counts``; tensor ``i``'s invalid entries to ``invalid[slots[i]]``."""
    per = per_tensor(agents, len(bases))
    takes = group_takes([], bases, agents, [])
    launch("activity_counts_group_kernel", takes, _triton_counts_group, _torch_counts_group, bases, per, eps, counts,
           invalid, slots)  # fmt: skip


@ram_counts_group_.register_fake
def _(bases, agents, eps, counts, invalid, slots) -> None:
    return None


def _triton_counts_group(bases, agents, eps, counts, invalid, slots) -> None:
    from ...kernels.device.group_triton import launch_activity_counts_group

    launch_activity_counts_group(bases, agents, eps, counts, invalid, slots)


def _torch_counts_group(bases, agents, eps, counts, invalid, slots) -> None:
    for i, base in enumerate(bases):
        _torch_counts(base.view(-1), [a.view(-1) for a in agents[i]], eps, counts, invalid[slots[i]])


def _triton_merge(out, base, agents, importances, lambdas, eps, sign, invalid) -> None:
    from ...kernels.device.ram_triton import launch_ram_merge

    launch_ram_merge(out, base, agents, importances, lambdas, eps, sign, invalid)


def _triton_counts(base, agents, eps, counts, invalid) -> None:
    from ...kernels.device.counts_triton import launch_activity_counts

    launch_activity_counts(base, agents, eps, counts, None, invalid, programs_per_sm=COUNT_PROGRAMS_PER_SM)


def _deltas(base_f: Tensor, agents: list[Tensor], start: int, end: int, eps: float):
    for t, agent in enumerate(agents):
        delta = agent[start:end].to(torch.float32) - base_f
        yield t, apply_activity_(delta, eps)


def _torch_merge(out, base, agents, importances, lambdas, eps, sign, invalid) -> None:
    """The op without Triton: RAM's accumulator over steps of :data:`TORCH_STEP` entries."""
    numel, k = base.numel(), len(agents)
    step = max(1, min(numel, TORCH_STEP))
    cls = WeightedRamAccumulator if importances else RamAccumulator
    accumulator = cls(step, k, base.device, torch.float32, None, sign=sign)
    accumulator.lambdas = None if lambdas is None else lambdas.to(torch.float32)
    for start in range(0, numel, step):
        end = min(numel, start + step)
        base_f = base[start:end].to(torch.float32)
        accumulator.begin(end - start)
        for t, delta in _deltas(base_f, agents, start, end, eps):
            if importances:
                h = importances[t][start:end].to(torch.float32)
                invalid += (~((h >= 0) & (h != float("inf")))).sum()
                accumulator.add(t, delta, importance=h)
            else:
                accumulator.add(t, delta)
        written = out[start:end]
        written.copy_(accumulator.merged(base_f))
        invalid += (~torch.isfinite(written)).sum()


def _torch_counts(base, agents, eps, counts, invalid) -> None:
    numel, k = base.numel(), len(agents)
    step = max(1, min(numel, TORCH_STEP))
    for start in range(0, numel, step):
        end = min(numel, start + step)
        base_f = base[start:end].to(torch.float32)
        bad = ~torch.isfinite(base_f)
        masks = torch.empty(k, end - start, dtype=torch.bool, device=base.device)
        for t, agent in enumerate(agents):
            a = agent[start:end].to(torch.float32)
            delta = a - base_f
            bad |= ~torch.isfinite(a) | ~torch.isfinite(delta)
            torch.ne(apply_activity_(delta, eps), 0, out=masks[t])
        invalid += bad.sum()
        counts += torch.cat(ram_statistics(masks))


def merge_device(
    stream: DeltaStream,
    flat: Tensor,
    lambdas: Tensor | None,
    eps: float,
    sign: bool,
    importances: list[Tensor] | None = None,
) -> None:
    """One tensor merged by :func:`ram_merge_` into ``flat`` (the engine's ``kernel(stream, flat)``)."""
    slot = stream.invalid_slot()
    lam = None if lambdas is None else _float32_on(lambdas, stream.device)
    call_op(ram_merge_, flat, stream.base, list(stream.tensors), list(importances or ()), lam, eps, sign, slot)
    stream.settle(slot, flat)


def group_runner(config, run_state: Optional[Tensor], activity, agents: tuple = ()) -> Optional[GroupMerge]:
    """RAM's grouped merge (:attr:`~ram_live.methods.base.MethodKernels.group`) for ``config``, with the merge's λ
    (``run_state``) and activity rule, or None where tensors need their own λ (ρ counted per tensor) or the device
    kernels take no tensor of this rule ("changed" between dtypes runs the CPU's paths)."""
    lam = getattr(config, "lam", None)
    if activity is None or lam is not None and lam.uses_rho and getattr(config, "rho_scope", "global") != "global":
        return None
    sign, eps = getattr(config, "shared", "mean") == "sign", activity.threshold

    def merge(items: list[GroupItem], invalid: Tensor) -> None:
        lambdas = None if run_state is None else _float32_on(run_state, items[0].base.device)
        outs, bases, agents, slots = group_columns(items)
        call_op(ram_merge_group_, outs, bases, agents, [], lambdas, eps, sign, invalid, slots)

    return GroupMerge(functools.partial(_accepts, activity), merge)


def _accepts(activity, base: Tensor, agents: list[Tensor]) -> bool:
    """Whether the device kernels take this tensor with ``activity``: not "changed" between dtypes (the CPU's
    paths run it)."""
    return activity.rule != "changed" or agents[0].dtype == base.dtype


def count_group_runner(activity) -> Optional[GroupMerge]:
    """RAM's grouped counts (:attr:`~ram_live.methods.base.MethodKernels.group_counts`): a
    :class:`~ram_live.methods.base.GroupMerge` whose items' ``out`` is the pass's running counts on the device, or
    None without an activity rule."""
    if activity is None:
        return None

    def count(items: list[GroupItem], invalid: Tensor) -> None:
        _, bases, agents, slots = group_columns(items)
        call_op(ram_counts_group_, bases, agents, activity.threshold, items[0].out, invalid, slots)

    return GroupMerge(functools.partial(_accepts, activity), count)


#: The last λ converted by :func:`_float32_on`, its version, and its float32 copy on the device.
_LAST_LAMBDAS: tuple[Tensor, int, Tensor] | None = None


def _float32_on(lambdas: Tensor, device: torch.device) -> Tensor:
    """``lambdas`` in float32 on ``device``, converted once per merge (a merge's tensors share one λ tensor): no
    conversion launch per tensor. An inference tensor (made under ``torch.inference_mode``) has no version counter
    to tell an in-place change, so it is converted every time."""
    global _LAST_LAMBDAS
    if lambdas.is_inference():
        return lambdas.to(device=device, dtype=torch.float32)
    last = _LAST_LAMBDAS
    if last is not None and last[0] is lambdas and last[1] == lambdas._version and last[2].device == device:
        return last[2]
    converted = lambdas.to(device=device, dtype=torch.float32)
    _LAST_LAMBDAS = (lambdas, lambdas._version, converted)
    return converted


def device_statistics(stream: DeltaStream, k: int) -> RamStatistics:
    """One tensor's activity counts by :func:`ram_counts_`: added into the statistics pass's running counts on the
    device where it gives them (``stream.totals``; returns :data:`~ram_live.engine.counts.ADDED`), else on their
    own, left on the device."""
    slot = stream.invalid_slot()
    eps = stream.activity.threshold if stream.activity is not None else 0.0
    counts = (
        stream.totals if stream.totals is not None else torch.zeros(3 * k + 1, dtype=torch.int64, device=stream.device)
    )
    call_op(ram_counts_, stream.base, list(stream.tensors), eps, counts, slot)
    stream.settle(slot)
    return ADDED if counts is stream.totals else RamStatistics(counts[:k], counts[k : 2 * k], counts[2 * k :])
