"""A device merge's tensors in few launches (:func:`merge_groups`): where the method merges many tensors in one
launch (:attr:`~ram_live.methods.base.MethodKernels.group`) and the sink holds its outputs in memory, every tensor
on an accelerator whose inputs and output :func:`~ram_live.kernels.device.common.group_key` admits is merged in
one launch per device and dtypes, before the merge pass walks the rest one by one. Per tensor the host then only
takes its inputs and its destination: a model of hundreds of tensors costs it one launch, not hundreds."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..kernels.device.common import group_key
from ..progress import ProgressHook
from ..types import Plan, TensorSpec
from . import checks as checks_mod
from .checks import DeferredChecks

__all__ = ["merge_groups"]


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
        or not getattr(sink, "holds_outputs", False)
    ):
        return set(), {}
    grouped = kernels.group(run_state, job.activity)  # a GroupMerge
    if grouped is None:
        return set(), {}
    groups: dict[tuple, list[tuple[int, Tensor, Tensor, list[Tensor], str]]] = {}
    taken: dict[str, Tensor] = {}
    for index, key in enumerate(plan.merge):
        spec = specs[key]
        if not checks_mod.deferred_device(spec.device) or (reader.device or spec.device) != spec.device:
            continue
        base, agents, _ = reader.read(key)
        if not grouped.accepts(base, agents):
            continue
        dest = sink.destination(key, spec)
        found = group_key(dest, base, agents)  # contiguous tensors: the kernels see them flat, no view is made
        if found is None:
            taken[key] = dest
            continue
        groups.setdefault(found, []).append((index, dest, base, agents, key))
    merged: set[str] = set()
    for found, items in groups.items():
        grouped.merge([(index, out, base, agents) for index, out, base, agents, _ in items], checks.buffer(found[0]))
        for *_, key in items:
            sink.commit(key)
            reader.release(key)
            job.info.count_kernel("device")
            job.info.tensors += 1
            job.info.parameters += specs[key].numel
            merged.add(key)
            if progress:
                progress.update(key, reader.nbytes(key))
    return merged, taken
