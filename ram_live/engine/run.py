"""A merge from start to end (:func:`run_merge`): plan and check, count (or reuse counts, or count while merging
in one read), validate an in-place merge, merge. Orchestration only: the passes and kernels live in the modules
beside this one."""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..auxiliary import resolve as resolve_auxiliary
from ..io.distributed import Distributed, RemoteRankError
from ..errors import ConfigError
from ..methods.base import MergeMethod, RunContext
from ..progress import ProgressHook
from ..io.sinks import Sink
from ..io.sources import TensorSource
from ..types import Activity, MergeInfo, Plan, RamStatistics, TensorSpec
from .compiling import compiler_works, resolve_compile
from .dispatch import method_kernels
from .passes import Job, dry_run, merge_pass, statistics_pass
from .plan import PlanCache, kept_agents, planned
from .reader import Reader, check_ties_and_copies, on_current
from .results import check_reusable, stamped
from .digest import inputs_digest
from .stream import DEFAULT_CHUNK_NUMEL
from .unchanged import report_unchanged

__all__ = ["run_merge"]


def run_merge(
    base: TensorSource,
    agents: Sequence[TensorSource],
    method: MergeMethod,
    config: Any,
    sink: Sink,
    *,
    device: torch.device | None = None,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    validate_first: bool = False,
    progress: ProgressHook | None = None,
    workers: int | None = None,
    dist: Distributed | None = None,
    compile: bool | str = "auto",
    statistics: RamStatistics | None = None,
    auxiliary: Any = None,
    plans: PlanCache | None = None,
) -> MergeInfo:
    """Merge ``agents`` onto ``base`` with ``method`` into ``sink``; see :func:`ram_live.merge`. ``statistics``:
    counts of an earlier pass over the same inputs, used instead of pass 1 (checked against the agents, the
    activity rule and the number of entries before the merge, and against the digest of the inputs' first and
    last entries after it, before the sink finishes; not with ``validate_first``, whose pass 1 validates).
    ``auxiliary``: the method's per-agent auxiliary inputs, ``{name: {agent name: TensorSource}}`` (RAM:
    ``"importance"``), streamed like the agents (see :mod:`ram_live.auxiliary`). ``plans``: a
    :class:`~ram_live.engine.plan.PlanCache` shared by merges over these unchanged sources (a search's)."""
    t0 = time.perf_counter()
    device = on_current(device) if device is not None else None
    agents = kept_agents(agents, getattr(config, "exclude", ()))
    plan, specs = plans.plan(base, agents) if plans is not None else planned(base, agents)
    counted = sum(specs[key].numel for key in plan.merge if specs[key].counted)
    if dist is not None and not dist.sharded:
        owner = dist.owners(plan, specs)
        if hasattr(sink, "distribute"):
            sink.distribute(dist, plan, owner, specs)
        plan = dist.local_plan(plan, owner)
    reader = Reader(base, agents, device)
    reader.auxiliary = resolve_auxiliary(method, auxiliary, agents, plan.merge, base)
    check_ties_and_copies(reader, plan)
    names = reader.names
    info = MergeInfo(method=method.name, config=config, agents=names)
    run_device = device or (base.spec(plan.merge[0]).device if plan.merge else torch.device("cpu"))
    kernels = method_kernels(method, config)
    compile = resolve_compile(compile, run_device, sum(specs[key].numel for key in plan.merge) * len(names), kernels)
    if compile:
        compile = compiler_works(kernels, run_device, len(names), bool(reader.auxiliary))
    info.extra["compiled"] = compile
    if reader.auxiliary:
        info.extra["auxiliary"] = reader.auxiliary.names
    job = Job(reader, method, config, sink, method.activity(config), info, chunk_numel, workers, compile, kernels)
    job.plans = plans
    activity = job.activity or Activity()

    if (
        statistics is None
        and not validate_first
        and dist is None
        and not compile
        and not reader.auxiliary
        and kernels is not None
        and kernels.single_read is not None
        and kernels.reads_once is not None
        and not (kernels.device is not None and kernels.device(run_device))  # the device kernels read twice
        and method.needs_statistics(config)
        and kernels.reads_once(sink, len(names))
    ):
        digest = inputs_digest()
        counts, run_state = kernels.single_read(job, plan, specs, progress, run_device, digest)
        info.statistics = stamped(counts, names, activity, counted, digest)
        if plans is not None:
            plans.counted(info.statistics, base, agents)
        if method.record is not None:
            method.record(config, info, run_state)
        report_unchanged(info, reader, plan.merge, f"{method.name}: ")
        info.seconds = time.perf_counter() - t0
        return info
    amax: dict[str, tuple[float, float]] = {}
    reuse = statistics
    if reuse is not None and method.needs_statistics(config) and not validate_first:
        info.statistics = check_reusable(reuse, names, activity, counted)
    elif method.needs_statistics(config) or validate_first:
        info.statistics = _count(
            job, plan, activity, progress, dist, counted, amax if validate_first else None, validate_first
        )
        info.passes = 2
        if plans is not None:
            plans.counted(info.statistics, base, agents)
    run_state = method.setup(config, RunContext(names, info.statistics, run_device)) if method.setup else None
    if method.record is not None:
        method.record(config, info, run_state)
    if dist is None or info.statistics is not None:  # before anything is written: a warning may be an error
        report_unchanged(info, reader, plan.merge, f"{method.name}: ")
    if validate_first:  # in place: nothing is written until every merged value is known to fit
        _validate(job, plan, specs, run_state, amax, dist)
        info.passes += 1 if info.extra["dry_run"] else 0
    reused = reuse is not None and info.statistics is reuse and bool(reuse.fingerprint)
    reused = reused and not (plans is not None and plans.trusts(reuse, base, agents))  # counted over these sources
    _write(job, plan, specs, run_state, progress, validate_first, reuse.fingerprint if reused else None, dist)
    info.seconds = time.perf_counter() - t0
    return info


def _count(
    job: Job,
    plan: Plan,
    activity: Activity,
    progress: ProgressHook | None,
    dist: Distributed | None,
    counted: int,
    amax: dict[str, tuple[float, float]] | None,
    validate: bool,
) -> RamStatistics:
    """The statistics pass, its counts summed over ranks (every rank reaches the collective, failed or not) and
    stamped with what they were counted over."""
    names = job.reader.names
    digest = inputs_digest()
    try:
        counts = statistics_pass(
            job.reader,
            plan,
            activity,
            job.chunk_numel,
            job.workspace,
            progress,
            job.workers,
            job.compile,
            digest,
            amax,
            check_auxiliary=validate,
            kernels=job.kernels,
        )
    except BaseException:
        if dist is not None:  # this rank's error wins over the remote one
            try:
                dist.reduce_statistics(None, len(names))
            except RemoteRankError:
                pass
        raise
    if dist is not None:
        counts = dist.reduce_statistics(counts, len(names))
    return stamped(counts, names, activity, counted, digest)


def _validate(
    job: Job,
    plan: Plan,
    specs: dict[str, TensorSpec],
    run_state: Any,
    amax: dict[str, tuple[float, float]],
    dist: Distributed | None,
) -> None:
    """The in-place dry run, agreed over ranks."""
    ok = False
    try:
        dry_run(job, plan, specs, run_state, amax)
        ok = True
    finally:
        if dist is not None and not dist.all_ok(ok) and ok:
            raise RemoteRankError(f"rank {dist.rank}: another rank's merged values do not fit (see its error)")


def _write(
    job: Job,
    plan: Plan,
    specs: dict[str, TensorSpec],
    run_state: Any,
    progress: ProgressHook | None,
    validate_first: bool,
    fingerprint: str | None,
    dist: Distributed | None,
) -> None:
    """The merge pass; ``fingerprint``: of reused statistics, checked against the inputs before the sink's
    ``finish``; agreed over ranks."""
    check = inputs_digest() if fingerprint is not None else None
    try:
        merge_pass(job, plan, specs, run_state, progress, validate_first, check)
        if check is not None and check.hexdigest() != fingerprint:
            raise ConfigError(
                "statistics= were counted over other weights (the first and last entries of some "
                "tensor differ): count them again, or pass the checkpoints they came from"
            )
    except BaseException:
        if dist is not None:
            dist.all_ok(False)
        raise
    if dist is not None and not dist.all_ok(True):
        raise RemoteRankError(f"rank {dist.rank}: another rank failed while merging (see its error)")
