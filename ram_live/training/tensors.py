"""Pieces of :mod:`ram_live.training.schedule`: the merge result, and the tensor plumbing of a schedule (the base cut
into this process's boxes, merged values swapped in and out of a live model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..io.distributed import RemoteRankError
from ..methods.ram.rules import Given
from ..store import (
    BaseMismatchError,
    Collective,
    LocalModel,
    LocalTensor,
    SnapshotNotFoundError,
    SnapshotStore,
    StoreError,
)
from .failures import agreed_sum

__all__ = ["MergeResult", "ScheduleAdapter"]


@dataclass
class MergeResult:
    """A generalist merged from the latest snapshot of every agent (:meth:`RAMSchedule.merge`).

    Attributes:
        step: the training step of the merge.
        tensors: the merged tensors by name (this process's shards where the model is sharded).
        agents: the snapshot step used per agent.
        lambdas, rho, density: the probe numbers of the merge per agent (λ, ρ, share of entries updated).
        seconds: how long the merge took.
        variant: the method that ran (``"ram_plus"``, or the one a search picked).
        extra: ``"runs"`` (the store run of each agent's snapshot), ``"search"`` (the search's record) and
            ``"importance"`` where they apply.

    >>> result = schedule.merge(model, step=200); result.metrics()["ram/coder/lambda"]  # doctest: +SKIP
    """

    step: int
    tensors: dict[str, Tensor]
    agents: dict[str, int]
    lambdas: dict[str, float]
    rho: dict[str, float]
    density: dict[str, float]
    seconds: float
    variant: str
    extra: dict[str, Any] = field(default_factory=dict)

    def metrics(self, prefix: str = "ram/") -> dict[str, float]:
        """The probe numbers as flat metrics.

        Args:
            prefix: put before every name.

        Returns:
            ``{name: float}``: the number of agents, the merge's seconds, and per agent its snapshot step, density,
            ρ and λ.
        """
        out: dict[str, float] = {f"{prefix}agents": float(len(self.agents)), f"{prefix}merge_seconds": self.seconds}
        for name, step in self.agents.items():
            out[f"{prefix}{name}/snapshot_step"] = float(step)
            if name in self.density:
                out[f"{prefix}{name}/density"] = self.density[name]
            if name in self.rho:
                out[f"{prefix}{name}/rho"] = self.rho[name]
            if name in self.lambdas:
                out[f"{prefix}{name}/lambda"] = self.lambdas[name]
        return out


class ScheduleAdapter:
    """What the framework callbacks built on a :class:`~ram_live.RAMSchedule` (``self.schedule``) share."""

    schedule: Any

    @property
    def history(self) -> list[dict[str, float]]:
        """Every merge's logged metrics, with its ``step``."""
        return self.schedule.history

    @property
    def store(self) -> SnapshotStore:
        return self.schedule.store


# ----------------------------------------------------------------------------------------------- helpers


def metric_float(value: Any) -> float:
    """An evaluation metric as a float (a tensor: the mean of its values)."""
    if isinstance(value, Tensor):
        return float(value.detach().float().mean().item())
    return float(value)


def _global_numel(base: LocalModel, agents: Sequence[Any], collective: Collective) -> int:
    """Entries the merge merges, over all ranks (each box counted once)."""
    from ..engine.plan import build_plan

    plan = build_plan(base, agents)
    mine = sum(base.tensors[k].tensor.numel() for k in plan.merge if base.tensors[k].owner)
    return int(collective.all_reduce_sum_(torch.tensor([mine], dtype=torch.int64)).item())


def _pick(sched: Any) -> dict[str, int]:
    """Rank 0 names the snapshot of every agent to merge; every rank gets the same names."""
    c = sched.collective
    picks, runs, failure = None, None, None
    if c.rank == 0:
        try:
            names = sched.agents if sched.agents is not None else sched.store.agents()
            picks, runs = {}, {}
            for name in names:  # this run's own snapshots; every other agent's from its current run
                run = (sched.run if name == sched.agent else None) or sched.store.current_run(name)
                steps = sched.store.steps(name, run=run) if run is not None else []
                if steps:
                    picks[name], runs[name] = steps[-1], run
        except Exception as exc:
            if c.world_size == 1:
                raise
            failure = exc  # raised after the broadcast: the other ranks are not left waiting in it
    if c.world_size == 1:
        sched.picked_runs = runs
        return picks  # type: ignore[return-value]
    shared = c.broadcast_json({"picks": picks, "runs": runs, "failed": failure is not None})
    if failure is not None:
        raise failure
    if shared["failed"]:
        raise RemoteRankError(
            f"rank {c.rank}: rank 0 failed picking the snapshots to merge (its error is raised there)"
        )
    sched.picked_runs = shared["runs"]
    return shared["picks"]


def _open_latest(sched: Any, live: LocalModel, step: int) -> tuple[dict[str, int], dict[str, Any]]:
    """The picked snapshots, opened (this run's own as ``live`` when it was just written losslessly); picks again
    when one is pruned in between, on every rank alike."""
    c = sched.collective
    for _ in range(5):
        picks = _pick(sched)
        sources: dict[str, Any] = {}
        ok, failure = True, None
        try:
            for name, snap_step in picks.items():
                if (
                    name == sched.agent
                    and snap_step == step == sched.last_snapshot_step
                    and sched.snapshot_activity == "changed"
                ):
                    sources[name] = live  # the snapshot just written holds exactly these weights
                else:
                    sources[name] = sched.store.open(name, snap_step, run=sched.picked_runs[name])
        except SnapshotNotFoundError:  # pruned between the pick and the open: pick again
            ok = False
        except Exception as exc:
            if c.world_size == 1:
                raise
            failure = exc  # raised after the all-reduce, on every rank
        if c.world_size > 1:  # a failure raised on every rank; every rank picks again where one missed a snapshot
            missed = agreed_sum(c, torch.tensor([0.0 if ok else 1.0]), failure, "opening the snapshots to merge")
            ok = float(missed[0]) == 0
        if ok:
            if not picks:
                raise SnapshotNotFoundError(f"{sched.store.root}: no snapshot of any agent to merge")
            return picks, sources
    raise SnapshotNotFoundError(f"{sched.store.root}: snapshots kept disappearing while opening them")


def _stored_importance(sched: Any, picks: dict[str, int], sources: dict[str, Any], base: LocalModel) -> dict[str, Any]:
    """The picked snapshots' stored importances (this process's boxes when sharded), every agent's
    (``importance="stored"``); a ConfigError names the agents whose snapshots carry none."""
    from ..importance.sources import stored_importance_of, stored_sources

    per_agent = {}
    for name, src in sources.items():
        snap = sched.store.open(name, picks[name], run=sched.run) if isinstance(src, LocalModel) else src
        if snap.importance is not None and sched.sharded:
            snap = snap.restrict(base.boxes(), name)
        per_agent[name] = stored_importance_of(snap)
    return stored_sources(per_agent)


def _probe_numbers(
    sched: Any,
    info: Any,
    base: LocalModel,
    agents: Sequence[Any],
    names: list[str],
    distributed: bool,
    *,
    searched: bool,
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """λ, ρ and density per agent of a schedule's merge (λ as the merge reported them when it was searched)."""
    from ..methods.ram.lambdas import rho as rho_of
    from ..methods import Activity
    from ..store import LocalCollective, ram_statistics

    opts = sched.ram
    density: dict[str, float] = {}
    rho: dict[str, float] = {}
    lambdas: dict[str, float] = {}
    if info.statistics is not None and opts.rho_scope == "global":
        active, unique = info.statistics.active.tolist(), info.statistics.unique.tolist()
        total = _global_numel(base, agents, sched.collective if distributed else LocalCollective())
    else:  # plain RAM (or per-tensor ρ) needs no global statistics pass; the probe numbers do
        stats = ram_statistics(
            base,
            agents,
            Activity(opts.activity, opts.eps),  # type: ignore[arg-type]
            owned=lambda key: base.tensors[base.aliases().get(key, key)].owner,
            collective=sched.collective if distributed else None,
            chunk_numel=sched.chunk_numel,
        )
        active, unique, total = stats["active"].tolist(), stats["unique"].tolist(), stats["total"]
    given = isinstance(opts.lam, Given)
    if info.lambdas is not None and (opts.rho_scope == "global" or given):
        lambdas = dict(info.lambdas)
    for name, a, u in zip(names, active, unique):
        density[name] = a / total if total else 0.0
        rho[name] = rho_of(float(u), float(a))
        if searched:
            continue  # λ as the chosen merge reported them (none for the baselines)
        if name in lambdas or name in opts.exclude:
            continue
        if given:
            continue
        if not opts.lam.uses_rho:
            lambdas[name] = 1.0
        elif opts.rho_scope == "global":
            lambdas[name] = opts.lam.value(rho[name])
    return lambdas, rho, density


def _load_base(store: SnapshotStore, live: LocalModel) -> LocalModel:
    """The store's base, cut into this process's boxes of ``live`` and put on its devices."""
    source = store.base_source()
    tensors = {}
    for key, t in live.tensors.items():
        data = source.get_box(key, t.offsets, tuple(t.tensor.shape)).to(t.tensor.device)
        if data.dtype != t.tensor.dtype:
            raise BaseMismatchError(f"tensor {key!r}: the store's base is {data.dtype}, the model {t.tensor.dtype}")
        tensors[key] = LocalTensor(data, t.global_shape, t.offsets, t.owner, t.is_buffer)
    return LocalModel(tensors, live.aliases(), live.keys(), "base", live.distributed)


def _like(given: LocalModel, live: LocalModel) -> LocalModel:
    """A given base (whole tensors, or shards like the model's) as copies in the model's boxes and devices."""
    tensors = {}
    for key, t in live.tensors.items():
        g = given.tensors.get(key)
        if g is None:
            raise BaseMismatchError(f"the given base has no tensor {key!r}")
        if g.global_shape != t.global_shape:
            raise BaseMismatchError(
                f"tensor {key!r}: the given base has shape {g.global_shape}, the model {t.global_shape}"
            )
        if g.box == t.box:
            data = g.tensor
        elif g.full:
            data = g.tensor[tuple(slice(o, o + n) for o, n in zip(t.offsets, t.tensor.shape))]
        else:
            raise BaseMismatchError(f"tensor {key!r}: the given base is sharded differently from the model")
        data = data.to(t.tensor.device).clone(memory_format=torch.contiguous_format)
        tensors[key] = LocalTensor(data, t.global_shape, t.offsets, t.owner, t.is_buffer)
    like = LocalModel(tensors, live.aliases(), live.keys(), "base", live.distributed)
    like.model_files = lambda: given.model_files() or live.model_files()  # the given base's config, else the model's
    return like


def swap_tensors(live: LocalModel, tensors: dict[str, Tensor]) -> None:
    """Exchange the values of ``live``'s tensors and ``tensors`` in place (twice restores both)."""
    with torch.no_grad():
        for key, t in live.tensors.items():
            other = tensors[key]
            if other.shape != t.tensor.shape or other.dtype != t.tensor.dtype:
                raise StoreError(f"merged tensor {key!r} does not fit the model ({other.shape} vs {t.tensor.shape})")
            tmp = t.tensor.clone()
            t.tensor.copy_(other)
            other.copy_(tmp)
