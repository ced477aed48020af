"""RAM+ with global ρ in one read of the inputs: each tensor merged as RAM while the same read counts, an owner
map recording who changed each entry alone; once every count is in, λ is applied there (:func:`single_read_pass`).
``RAM_LIVE_SINGLE_READ=0``: never; ``=1``: no budget on the owner maps."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ... import settings
from ...engine import threads
from ...engine.counts import native_counts
from ...engine.dispatch import StreamView, count_tensor
from ...engine.passes import Job, finish_pass, merge_tensor
from ...engine.reader import check_equal
from ...engine.digest import digest_update
from ...engine.stream import DeltaStream
from ...engine.threads import worker_count
from ...io import memory
from ...io.sinks import Sink
from ...progress import ProgressHook
from ...types import Activity, Plan, RamStatistics, TensorSpec
from ..base import RunContext
from . import native as ram_native
from .fast import native_for

__all__ = ["reads_once", "owner_map_budget", "owner_map_arena", "single_read_pass", "merge_unscaled", "rescale"]


def reads_once(sink: Sink, k: int) -> bool:
    """Whether a merge that needs global counts reads its inputs once (:func:`single_read_pass`): a sink whose fresh
    destinations stay in memory, and the native kernels for this many agents (``RAM_LIVE_SINGLE_READ=0``: never).
    The engine rules out ``validate_first``, reused counts, ``dist``, ``compile`` and methods without global
    counts."""
    return (
        settings.single_read() != "0"
        and bool(getattr(sink, "revisable", False))
        and k <= ram_native.MAX_UNSCALED_AGENTS
        and ram_native.kernels() is not None
    )


def owner_map_budget(plan: Plan, specs: dict[str, TensorSpec]) -> float:
    """Bytes the owner maps of a single-read merge may hold: twice the largest tensor, so that extra memory stays
    ≤ output + 2 × largest tensor as with two passes (``RAM_LIVE_SINGLE_READ=1``: unbounded)."""
    if settings.single_read() == "1":
        return math.inf
    return 2 * max((specs[key].numel * specs[key].dtype.itemsize for key in plan.merge), default=0)


def owner_map_arena(plan: Plan, specs: dict[str, TensorSpec], k: int) -> Tensor:
    """One int32 buffer the owner maps are cut from, in merge order, as far as :func:`owner_map_budget` allows.
    One buffer, not one per tensor: it faults in as huge pages (:mod:`ram_live.io.memory`), which made a fresh
    33 MB map 3.3 ms to fill instead of 10.9 ms here; the part no map reaches is never touched."""
    need = sum(ram_native.planes_numel(specs[key].numel, k) for key in plan.merge)
    numel = int(min(need, owner_map_budget(plan, specs) // 4))
    return memory.empty(numel, dtype=torch.int32, device="cpu")


def single_read_pass(
    job: Job,
    plan: Plan,
    specs: dict[str, TensorSpec],
    progress: ProgressHook | None,
    run_device: torch.device,
    digest: Any,
) -> tuple[RamStatistics, Any]:
    """RAM+ with global ρ reading the agents once: λ scales only the entries one agent alone changed, so each
    tensor is merged as RAM (those entries keep the agent's own value) while the same read counts, and an owner map
    (:func:`.native.plane_count` bits per entry) records who changed them alone; once every count is
    in, λ is applied there from the base and the output. The bits equal the two-pass merge's (same float32 ops in
    the same order). Tensors the native kernels do not take, and those whose owner map would pass
    :func:`owner_map_budget`, are counted in the first loop and merged after it (read twice).
    Returns the statistics and the method's run state (λ)."""
    reader, sink, k = job.reader, job.sink, len(job.reader.names)
    for key in plan.check_equal:
        check_equal(reader, key)
    sink.begin(plan, specs)
    active = torch.zeros(k, dtype=torch.int64)
    unique = torch.zeros_like(active)
    deferred: list[tuple[str, Tensor, Tensor]] = []  # (key, flat output, owner map), λ still to apply
    rest: list[tuple[str, Tensor]] = []  # (key, destination), merged once λ is known
    arena = owner_map_arena(plan, specs, k)
    used = 0
    if progress:
        progress.start("merge", len(plan.merge), sum(reader.nbytes(key) for key in plan.merge))
    for key in plan.merge:
        size = ram_native.planes_numel(specs[key].numel, k)
        fits = used + size <= arena.numel()
        stats, dest, planes = merge_unscaled(job, key, digest, arena[used : used + size] if fits else None)
        if planes is None:
            rest.append((key, dest))
        else:
            deferred.append((key, dest.view(-1), planes))
            used += size
        if reader.base.spec(key).counted:
            active += stats.active
            unique += stats.unique
        if progress:
            progress.update(key, reader.nbytes(key))
    if progress:
        progress.close()
    statistics = RamStatistics(active, unique, torch.zeros(k + 1, dtype=torch.int64))
    run_state = (
        job.method.setup(job.config, RunContext(reader.names, statistics, run_device)) if job.method.setup else None
    )
    while deferred:  # last merged first: some of its lines are still in the cache
        rescale(job, *deferred.pop(), run_state)
    for key, dest in rest:
        merge_tensor(job, key, run_state, dest=dest)
    finish_pass(reader, plan, sink)
    job.info.passes = 2 if rest else 1
    job.info.extra["single_read"] = len(plan.merge) - len(rest)
    return statistics, run_state


def merge_unscaled(
    job: Job, key: str, digest: Any, planes: Tensor | None
) -> tuple[RamStatistics, Tensor, Tensor | None]:
    """Pass 1 of :func:`single_read_pass` on ``key``: its counts and destination, and where ``planes`` (room for
    its owner map) is given and the native kernels take it, that owner map, filled, of the destination merged but
    for λ (else None: only counted)."""
    reader, k = job.reader, len(job.reader.names)
    activity = job.activity or Activity()
    base_t, agent_ts, dev = reader.read(key)
    stream = DeltaStream(key, base_t, agent_ts, reader.names, dev, job.chunk_numel, activity, job.workspace)
    digest_update(digest, stream)
    stream.range_done = reader.range_releaser(key)
    workers = worker_count(job.workers, dev)
    dest = job.sink.destination(key, reader.base.spec(key))
    flat = dest.view(-1) if planes is not None and dest.is_contiguous() and dest.dtype == stream.base.dtype else None
    native = None if flat is None else native_for(stream, activity, flat, entries=("merge_unscaled", "rescale"))
    if flat is None or native is None:
        stats, planes = count_tensor(stream, k, workers, kernels=job.kernels), None
    else:
        kernels, eps = native
        out, owners = flat, planes
        stats = native_counts(
            stream,
            k,
            workers,
            lambda start, end, a, u: kernels.merge_unscaled(
                out, stream.base, stream.tensors, eps, start, end, owners, a, u
            ),
            out,
        )
        job.sink.commit(key)
    reader.release(key)
    return stats, dest, planes


def rescale(job: Job, key: str, flat: Tensor, planes: Tensor, run_state: Any) -> None:
    """Pass 2 of :func:`single_read_pass` on ``key``: λ applied where the owner map names an agent."""
    reader = job.reader
    base_t, agent_ts, dev = reader.read(key)
    stream = DeltaStream(key, base_t, agent_ts, reader.names, dev, job.chunk_numel, job.activity, job.workspace)
    stream.range_done = reader.range_releaser(key)
    view = StreamView(stream, job.kernels)
    state = job.method.prepare(job.config, view, run_state) if job.method.prepare else run_state
    lambdas = state.to(dtype=torch.float32).contiguous()
    kernels = ram_native.kernels()
    workers = worker_count(job.workers, dev)
    if threads.native_ranges(
        stream, workers, lambda start, end: kernels.rescale(flat, stream.base, planes, lambdas, start, end)
    ):
        stream.raise_nonfinite(0, stream.numel, flat)
    reader.release(key)
    job.info.count_kernel("native")
    job.info.tensors += 1
    job.info.parameters += stream.numel
