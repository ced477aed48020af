"""How a :class:`~ram_live.training.schedule.RAMSchedule` gets its base (:func:`attach_base`): taken from the model
on a fresh run, loaded from the store on a resumed one, or given; persisted in the store or checked against it, on
every rank. Its store run is opened here too: a new run on a fresh start (kept apart from the agent's earlier runs),
the run its checkpoint recorded (``sched.run``, restored by ``load_state_dict``) on a resumed one."""

from __future__ import annotations

from typing import Any

from ..store import (
    BaseMismatchError,
    Collective,
    LocalCollective,
    LocalModel,
    SnapshotWriter,
    StoreError,
    default_collective,
    fingerprint,
)
from ..store.runs import say_run
from .tensors import _like, _load_base

__all__ = ["attach_base"]


def attach_base(sched: Any, model: Any, base: Any = None, collective: Collective | None = None) -> str:
    """:meth:`RAMSchedule.attach <ram_live.training.schedule.RAMSchedule.attach>` (its docstring says what it takes,
    returns and raises): sets ``sched.base``, ``sched.writer``, ``sched.sharded``, ``sched.collective`` and
    ``sched.base_fingerprint`` and ``sched.run``."""
    sched.collective = collective or default_collective()
    c = sched.collective
    live = LocalModel.from_obj(model, name=sched.agent)
    sched.sharded = live.sharded
    if sched.sharded or c.rank == 0:
        sched.store  # noqa: B018 - create the store folder before others look at it
    c.barrier()
    resumed = sched.base_fingerprint
    trusted: str | None = None
    if base is None and resumed is not None or isinstance(base, str) and base == "store":
        if not sched.store.has_base():
            raise StoreError(f"{sched.store.root}: no base in the store to resume from (was the store moved?)")
        store_fp = sched.store.base_fingerprint
        if resumed is not None and store_fp != resumed:
            raise BaseMismatchError(
                f"this run was trained against base {resumed}, but the store {sched.store.root} holds base {store_fp}"
            )
        local = _load_base(sched.store, live)
        trusted = store_fp
    elif base is None:
        local = live.clone("base")
    else:
        given = LocalModel.from_obj(base, name="base")
        local = _like(given, live)
    local.check_like(live, sched.agent)
    sched.base = local

    def writer(collective: Collective) -> SnapshotWriter:
        return SnapshotWriter(
            sched.store,
            sched.agent,
            local,
            activity=sched.snapshot_activity,
            eps=sched.snapshot_eps,
            collective=collective,
            clone_base=False,
            trusted_fingerprint=trusted,
            run=sched.run,  # None: a new run; a resumed trainer's: continued
        )

    if sched.sharded:  # every rank writes its own shards (into rank 0's run)
        sched.writer = writer(c)
        fp, run = sched.writer.fingerprint, sched.writer.run
    else:  # rank 0 writes the replicated model
        fp = run = None
        if c.rank == 0:
            sched.writer = writer(LocalCollective())
            fp, run = sched.writer.fingerprint, sched.writer.run
        c.barrier()
        if c.world_size > 1:  # every rank's state_dict names the run
            run = c.broadcast_json(run)
        if c.rank != 0:
            fp = trusted or fingerprint(local)
            if fp != sched.store.base_fingerprint:
                raise BaseMismatchError(f"rank {c.rank}: this rank's base differs from the store's base")
    if c.rank == 0:
        say_run(sched.store, sched.agent, run)  # type: ignore[arg-type]
    if resumed is not None and fp != resumed:
        raise BaseMismatchError(f"the base ({fp}) is not the one this run was trained against ({resumed})")
    sched.base_fingerprint, sched.run = fp, run
    return fp  # type: ignore[return-value]
