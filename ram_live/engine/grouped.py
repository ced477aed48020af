"""A device merge's tensors in few launches: where the method merges many tensors in one launch
(:attr:`~ram_live.methods.base.MethodKernels.group`) and the sink holds its outputs in memory, every tensor on an
accelerator whose inputs and output :func:`~ram_live.kernels.device.common.group_key` admits is merged in one
launch per device and dtypes (:func:`merge_groups`), before the merge pass walks the rest one by one; the
statistics pass counts likewise (:func:`count_groups`, :attr:`~ram_live.methods.base.MethodKernels.group_counts`).
Per tensor the host then only takes its inputs and its destination: a model of hundreds of tensors costs it one
launch, not hundreds."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..kernels.device.common import PLAIN_TENSORS, group_key, output_key
from ..methods.base import GroupItem
from ..progress import ProgressHook
from ..types import Plan, TensorSpec
from . import checks as checks_mod
from .checks import DeferredChecks

__all__ = ["merge_groups", "count_groups"]


def _here(wanted: torch.device | None, device: torch.device) -> bool:
    """Whether a tensor on ``device`` is read where it is for a merge on ``wanted`` (an index-less ``wanted``, of a
    backend without a current device, is its type's one device)."""
    return wanted is None or wanted == device or (wanted.index is None and wanted.type == device.type)


def _members(reader: Any, plan: Plan) -> list[tuple[int, str, Any, Tensor, list[Tensor], tuple | None]]:
    """``(index, key, spec, base, agents, inputs' group key)`` of the merged tensors on an accelerator, read where
    they are (no copy to another device): none where a source makes a tensor per read (held until their group's
    launch, a model's worth would add up), none after a tensor subclass (whose tensors the merge pass then reads one
    by one, as before). Read once per merge: its statistics pass and its merge pass share them."""
    if reader.grouped is not None and reader.grouped[0] is plan:
        return reader.grouped[1]
    if not all(getattr(src, "stores_tensors", False) for src in (reader.base, *reader.agents)):
        return []  # a source that makes a tensor per read (a file mapped to a device, zeros): held, they would add up
    members = []
    for index, key in enumerate(plan.merge):
        spec = reader.base.spec(key)
        if not checks_mod.deferred_device(spec.device) or not _here(reader.device, spec.device):
            continue
        base, agents, _ = reader.read(key)
        if type(base) not in PLAIN_TENSORS:  # a subclass (DTensor, FakeTensor): the pass's tensors all are
            return []
        if base.device != spec.device:  # copied to the merge's device: not held (the merge pass reads it)
            continue
        members.append((index, key, spec, base, agents, group_key(None, base, agents)))
    reader.grouped = (plan, members)
    return members


def _inputs(job: Any, plan: Plan) -> list[tuple[int, str, Any, Tensor, list[Tensor], tuple | None]]:
    """:func:`_members`, read once for all the merges that share ``job.plans`` (their sources do not change)."""
    if job.plans is None:
        return _members(job.reader, plan)
    return job.plans.kept(plan, ("grouped inputs", job.reader.device), lambda: _members(job.reader, plan))


def merge_groups(
    job: Any,
    plan: Plan,
    specs: dict[str, TensorSpec],
    run_state: Any,
    checks: DeferredChecks,
    progress: ProgressHook | None,
    digest: Any,
) -> tuple[set[str], dict[str, Tensor]]:
    """Merge the tensors that join groups and commit them; returns their keys, and the destinations taken of
    tensors that did not join one (the merge pass writes those). Nothing is grouped with the method's auxiliary
    inputs, ``compile``, a digest of the inputs to feed, or a sink that writes as it goes.

    Args:
        job: the merge's :class:`~ram_live.engine.passes.Job`.
        plan, specs: the merge's plan and its tensors' specs.
        run_state: the method's state for the whole merge (RAM: λ per agent).
        checks: the pass's deferred checks (each tensor adds its invalid entries to its own slot).
        progress: told of every merged tensor.
        digest: the inputs' digest the pass feeds, or None.
    """
    kernels, reader, sink = job.kernels, job.reader, job.sink
    if (
        kernels is None
        or kernels.group is None
        or job.compile
        or reader.auxiliary
        or digest is not None
        or not type(sink).__dict__.get("holds_outputs", False)  # its own: a subclass may write as it goes
    ):
        return set(), {}
    grouped = kernels.group(run_state, job.activity, reader.names)  # a GroupMerge
    if grouped is None:
        return set(), {}
    groups: dict[tuple, list[GroupItem]] = {}
    taken: dict[str, Tensor] = {}
    for index, key, spec, base, agents, inputs in _inputs(job, plan):
        if inputs is None or not grouped.accepts(base, agents):
            continue
        dest = sink.destination(key, spec)
        found = output_key(dest, inputs)  # contiguous tensors: the kernels see them flat, no view is made
        if found is None:
            taken[key] = dest
            continue
        groups.setdefault(found, []).append(GroupItem(index, key, dest, base, agents))
    merged: set[str] = set()
    for found, items in groups.items():
        checks.written.update((item.key, found[1]) for item in items)
        grouped.merge(items, checks.buffer(found[0]))
        for item in items:
            sink.commit(item.key)
            reader.release(item.key)
            merged.add(item.key)
            if progress:
                progress.update(item.key, reader.nbytes(item.key))
        job.info.count_kernel("device", len(items))
        job.info.tensors += len(items)
        job.info.parameters += sum(specs[item.key].numel for item in items)
    return merged, taken


def count_groups(
    reader: Any,
    plan: Plan,
    activity: Any,
    kernels: Any,
    checks: DeferredChecks,
    totals: dict[torch.device, Tensor],
    progress: ProgressHook | None,
) -> dict[str, tuple[Tensor, list[Tensor]]]:
    """The statistics pass's counts of the tensors that join groups, added to the pass's running counts on their
    device (``totals``, int64 ``[3K + 1]``, made where missing); returns their inputs by key (the pass feeds its
    digest with them, in its order). Only counted tensors (not a
    DTensor's replicated shards) and no auxiliary inputs.

    Args:
        reader: the pass's :class:`~ram_live.engine.reader.Reader`.
        plan: the merge's plan.
        activity: the method's activity rule.
        kernels: the method's :class:`~ram_live.methods.base.MethodKernels`, or None.
        checks: the pass's deferred checks.
        totals: the pass's running counts per device.
        progress: told of every counted tensor.
    """
    if kernels is None or kernels.group_counts is None or reader.auxiliary:
        return {}
    grouped = kernels.group_counts(activity)  # a GroupMerge
    if grouped is None:
        return {}
    groups: dict[tuple, list[tuple[int, Tensor, list[Tensor], str]]] = {}
    for index, key, spec, base, agents, found in _members(reader, plan):
        if found is not None and spec.counted and grouped.accepts(base, agents):
            groups.setdefault(found, []).append((index, base, agents, key))
    done: dict[str, tuple[Tensor, list[Tensor]]] = {}
    k = len(reader.agents)
    for (device, *_), items in groups.items():
        if device not in totals:
            totals[device] = torch.zeros(3 * k + 1, dtype=torch.int64, device=device)
        grouped.merge(
            [GroupItem(index, key, totals[device], base, agents) for index, base, agents, key in items],
            checks.buffer(device),
        )
        for _, base, agents, key in items:
            reader.release(key)
            done[key] = (base, agents)
            if progress:
                progress.update(key, reader.nbytes(key))
    return done
