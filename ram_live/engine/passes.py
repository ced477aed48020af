"""The passes over the inputs: the statistics pass (activity counts over every merged tensor), the in-place dry run,
and the merge pass (each tensor into the sink, then the copied and tied keys)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from ..io import memory
from ..methods.base import MergeMethod, MethodKernels
from ..progress import ProgressHook
from ..io.sinks import Sink
from ..types import Activity, MergeInfo, Plan, RamStatistics, TensorSpec
from .checks import DeferredChecks
from .counts import ADDED
from .dispatch import StreamView, count_tensor, merge_kernel
from .grouped import count_groups, merge_groups
from .plan import PlanCache
from .reader import Reader, check_equal
from .digest import digest_update
from .stream import DeltaStream
from .threads import worker_count

__all__ = ["Job", "statistics_pass", "dry_run", "merge_pass", "merge_tensor", "finish_pass", "fits", "recheck"]


@dataclass
class Job:
    """What every tensor of one merge shares."""

    reader: Reader
    method: MergeMethod
    config: Any
    sink: Sink
    activity: Activity | None
    info: MergeInfo
    chunk_numel: int
    workers: int | None
    compile: bool = False
    kernels: MethodKernels | None = None  # the method's fast paths for this config
    workspace: dict[Any, Tensor] = field(default_factory=dict)
    plans: PlanCache | None = None  # shared by merges over these unchanged sources


def statistics_pass(
    reader: Reader,
    plan: Plan,
    activity: Activity,
    chunk_numel: int,
    workspace: dict[Any, Tensor],
    progress: ProgressHook | None = None,
    workers: int | None = None,
    compile: bool = False,
    digest: Any = None,
    amax: dict[str, tuple[float, float]] | None = None,
    check_auxiliary: bool = False,
    kernels: MethodKernels | None = None,
) -> RamStatistics:
    """Pass 1: activity counts over every merged tensor (also checks that every input is finite); ``digest``: fed
    by :func:`digest_update` for every tensor; ``amax``: gets (max |τ|, max |θ₀|) per tensor where the kernels
    track them; ``check_auxiliary``: also validates the method's auxiliary inputs (the in-place validation pass);
    ``kernels``: the method's fast paths (its counter runs first)."""
    k = len(reader.agents)
    host = [torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64), torch.zeros(k + 1, dtype=torch.int64)]
    totals: dict[torch.device, Tensor] = {}  # device passes: the running counts on each device, read once
    checks = DeferredChecks(plan.merge)
    if progress:
        progress.start("statistics", len(plan.merge), sum(reader.nbytes(key) for key in plan.merge))
    plain = not compile and amax is None and not check_auxiliary
    done = count_groups(reader, plan, activity, kernels, checks, totals, progress) if plain else {}
    run: list[list[Tensor]] = []  # counted tensors' inputs not yet fed to the digest: fed together, in order
    for index, key in enumerate(plan.merge):
        counted_inputs = done.get(key)
        if counted_inputs is not None:
            if digest is not None:  # fed in the plan's order, as every pass feeds it
                run.append([counted_inputs[0], *counted_inputs[1]])
            continue
        if run:
            digest.update_many(run)
            run = []
        base, agents, device = reader.read(key)
        stream = DeltaStream(key, base, agents, reader.names, device, chunk_numel, activity, workspace, compile=compile)
        stream.deferred = checks.slot(index, device)
        counted = reader.base.spec(key).counted
        if stream.deferred is not None and counted:
            if device not in totals:
                totals[device] = torch.zeros(3 * k + 1, dtype=torch.int64, device=device)
            stream.totals = totals[device]
        if digest is not None:
            digest_update(digest, stream)
        stream.range_done = reader.range_releaser(key)
        tops: list[tuple[float, float]] | None = None if amax is None else []
        stats = count_tensor(stream, k, worker_count(workers, device), tops, kernels)
        if check_auxiliary:
            reader.stream(stream).validate_auxiliary()
        if tops:
            amax[key] = tops[0]  # type: ignore[index]
        if counted and stats is not ADDED:
            for into, part in zip(host, (stats.active, stats.unique, stats.histogram)):
                into += part.cpu()
        reader.release(key)
        if progress:
            progress.update(key, reader.nbytes(key))
    if run:
        digest.update_many(run)
    checks.raise_first(lambda key: recheck(reader, key, activity, chunk_numel))
    for key in plan.check_equal:
        check_equal(reader, key)
    if progress:
        progress.close()
    for running in totals.values():  # one read per device
        host = [h + part for h, part in zip(host, running.cpu().split([k, k, k + 1]))]
    return RamStatistics(*host)


def recheck(
    reader: Reader,
    key: str,
    activity: Activity | None,
    chunk_numel: int,
    out: Tensor | None = None,
    written: torch.dtype | None = None,
) -> None:
    """Read ``key`` again and raise naming the input at fault (a device kernel counted invalid entries in it);
    ``written``: the dtype the merge wrote (where no input is at fault, the merged value overflowed it)."""
    base, agents, device = reader.read(key)
    stream = reader.stream(DeltaStream(key, base, agents, reader.names, device, chunk_numel, activity, {}))
    stream.validate_auxiliary()
    stream.raise_nonfinite(0, stream.numel, out, written)


class _ScratchSink:
    """Where :func:`dry_run` merges to: destinations are given, nothing is kept."""

    def commit(self, key: str) -> None:
        pass


def fits(job: Job, spec: TensorSpec, amax: tuple[float, float] | None, run_state: Any = None) -> bool:
    """Whether the merge of a tensor with these (max |τ|, max |θ₀|) fits its dtype whatever the entries, by the
    method's overflow bound B: |θ*| ≤ max |θ₀| + B · K · max |τ|, kept 1 % under the dtype's largest value for
    rounding."""
    if amax is None or job.method.overflow_bound is None:
        return False
    bound = job.method.overflow_bound(job.config, run_state)
    tau, base = amax
    return base + bound * len(job.reader.names) * tau < 0.99 * torch.finfo(spec.dtype).max


def dry_run(
    job: Job, plan: Plan, specs: dict[str, TensorSpec], run_state: Any, amax: dict[str, tuple[float, float]]
) -> None:
    """Merge into one scratch buffer (per device, as large as the largest tensor), and drop, every tensor that
    :func:`fits` cannot clear from ``amax`` (what the validation pass saw): such merges raise
    :class:`NonFiniteError` where a merged value does not fit its dtype (float16 past 65504, a scale that
    overflows), which an in-place merge must find before it writes into the base. The same kernels run again to
    write, so they give the same bits."""
    dry = replace(
        job, sink=_ScratchSink(), info=MergeInfo(method=job.info.method, config=job.config, agents=job.info.agents)
    )
    keys = [key for key in plan.merge if not fits(job, specs[key], amax.get(key), run_state)]
    job.info.extra["dry_run"] = len(keys)
    need: dict[torch.device, int] = {}
    for key in keys:
        spec = specs[key]
        need[spec.device] = max(need.get(spec.device, 0), spec.numel * spec.dtype.itemsize)
    scratch = {device: memory.empty(n, dtype=torch.uint8, device=device) for device, n in need.items()}
    checks = DeferredChecks(keys)
    for index, key in enumerate(keys):
        spec = specs[key]
        buffer = scratch[spec.device][: spec.numel * spec.dtype.itemsize]
        merge_tensor(dry, key, run_state, dest=buffer.view(spec.dtype).view(spec.shape), checks=(checks, index))
    checks.raise_first(
        lambda key: recheck(job.reader, key, job.activity, job.chunk_numel, None, checks.written.get(key))
    )


def merge_pass(
    job: Job,
    plan: Plan,
    specs: dict[str, TensorSpec],
    run_state: Any,
    progress: ProgressHook | None,
    validate_first: bool,
    digest: Any = None,
) -> None:
    """Pass 2: every merged tensor into the sink (``digest``: fed as in the statistics pass), then the copied
    and tied keys."""
    reader, sink = job.reader, job.sink
    for key in plan.check_equal:
        if not validate_first:
            check_equal(reader, key)
    sink.begin(plan, specs)
    if progress:
        progress.start("merge", len(plan.merge), sum(reader.nbytes(key) for key in plan.merge))
    checks = DeferredChecks(plan.merge)
    grouped, taken = merge_groups(job, plan, specs, run_state, checks, progress, digest)
    for index, key in enumerate(plan.merge):
        if key in grouped:
            continue
        merge_tensor(job, key, run_state, digest, dest=taken.get(key), checks=(checks, index))
        if progress:
            progress.update(key, reader.nbytes(key))
    checks.raise_first(lambda key: recheck(reader, key, job.activity, job.chunk_numel, None, checks.written.get(key)))
    if progress:
        progress.close()
    finish_pass(reader, plan, sink)


def merge_tensor(
    job: Job,
    key: str,
    run_state: Any,
    digest: Any = None,
    dest: Tensor | None = None,
    checks: tuple[DeferredChecks, int] | None = None,
) -> None:
    """Merge ``key`` into the sink's destination (``dest`` when it was already taken) and commit it; ``checks``:
    the pass's deferred checks and this tensor's index in them (device merges count invalid entries there)."""
    reader, method, config, sink, info = job.reader, job.method, job.config, job.sink, job.info
    base_t, agent_ts, dev = reader.read(key)
    stream = reader.stream(
        DeltaStream(
            key, base_t, agent_ts, reader.names, dev, job.chunk_numel, job.activity, job.workspace, compile=job.compile
        )
    )
    if checks is not None:
        stream.deferred = checks[0].slot(checks[1], dev)
    if digest is not None:
        digest_update(digest, stream)
    stream.range_done = reader.range_releaser(key, sink)
    state = method.prepare(config, StreamView(stream, job.kernels), run_state) if method.prepare else None
    if dest is None:
        dest = sink.destination(key, reader.base.spec(key))
    if checks is not None:
        checks[0].written[key] = dest.dtype
    flat = dest.view(-1) if dest.is_contiguous() else torch.empty(dest.numel(), dtype=dest.dtype, device=dest.device)
    kind, kernel = merge_kernel(
        method, config, state, run_state, stream, flat, worker_count(job.workers, dev), job.kernels
    )
    info.count_kernel(kind)
    if stream.auxiliary and kind not in ("native", "device"):  # those kernels check the values as they go
        stream.validate_auxiliary()
    kernel(stream, flat)
    if flat.data_ptr() != dest.data_ptr():
        dest.copy_(flat.view(dest.shape))
    sink.commit(key)
    reader.release(key)
    info.tensors += 1
    info.parameters += stream.numel


def finish_pass(reader: Reader, plan: Plan, sink: Sink) -> None:
    """The unmerged tensors (copied from the base) and the tied names."""
    for key in plan.copy:
        sink.copy_from_base(key, reader.base.get(key))
    for alias, canonical in plan.alias.items():
        sink.alias(alias, canonical)
