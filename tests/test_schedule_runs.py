"""Runs of a plain-loop ``RAMSchedule``: a second, fresh run of an agent prunes (``keep=``) only its own snapshots,
saves its search record beside the first run's instead of over it, and merges its own snapshot."""

from __future__ import annotations

import json

import pytest

from ram_live.store import SnapshotStore
from ram_live.training.schedule import RAMSchedule
from ram_live.training.search import SearchSetting
from test_schedule_search import _distance, _net, _train

pytest.importorskip("ram_live.selection")


def _run(store, seed, target, keep=None):
    setting = SearchSetting(evaluate=lambda m: {"d": _distance(m, target)}, metric="d", mode="min", budget=4)
    sched = RAMSchedule(store, "b", snapshot_every=1, merge_every=3, search=setting, keep=keep, durable=False)
    model = _net()
    sched.attach(model)
    for step in (1, 2, 3):
        _train(model, seed + step)
        sched.on_step(model, step)
    return sched


def test_a_second_schedule_run_keeps_the_first_runs_snapshots_and_search_record(tmp_path):
    store = tmp_path / "store"
    a = _net()
    other = RAMSchedule(store, "a", durable=False)
    other.attach(a)
    _train(a, 1)
    other.snapshot(a, 3)
    target = {k: v + 0.1 for k, v in _net().state_dict().items()}
    first = _run(store, 10, target, keep=1)
    record = store / "_search" / "b" / "step_3.json"
    saved = record.read_bytes()
    assert json.loads(saved)["run"] == first.run
    second = _run(store, 20, target, keep=1)
    s = SnapshotStore(store)
    assert [(r.run, r.steps) for r in s.runs("b")] == [(first.run, (3,)), (second.run, (3,))]  # each pruned its own
    assert record.read_bytes() == saved  # the first run's record, as it was
    mine = store / "_search" / "b" / f"step_3.{second.run}.json"
    assert second.last_search["file"] == str(mine) and json.loads(mine.read_text())["run"] == second.run
    assert second.last_result.extra["runs"] == {"a": other.run, "b": second.run}
    assert second.history[-1]["ram/b/snapshot_step"] == 3.0
    third = _run(store, 30, target)  # a third run at the same step: beside both
    assert (store / "_search" / "b" / f"step_3.{third.run}.json").exists() and record.read_bytes() == saved


def _ddp_run(rank, tmp, seed):
    """A replicated (DDP-like) run of agent 'b' on two ranks: rank 0 writes; every rank merges."""
    model = _net()
    sched = RAMSchedule(tmp / "store", "b", snapshot_every=2, merge_every=2, durable=False)
    sched.attach(model)
    _train(model, seed)
    metrics = sched.on_step(model, 2)
    out = {"run": sched.run, "picked": sched.picked_runs, "step": metrics["ram/b/snapshot_step"]}
    (tmp / f"rank{rank}-{seed}.json").write_text(json.dumps(out))


def test_ddp_ranks_write_and_merge_one_run(tmp_path):
    from tests.test_distributed import spawn

    a = _net()
    other = RAMSchedule(tmp_path / "store", "a", durable=False)
    other.attach(a)
    _train(a, 1)
    other.snapshot(a, 4)
    for seed in (10, 20):  # two fresh DDP runs of b
        spawn(_ddp_run, tmp_path, seed)
    runs = [[json.loads((tmp_path / f"rank{r}-{seed}.json").read_text()) for r in range(2)] for seed in (10, 20)]
    for ranks in runs:  # every rank knows its run, and merged that run's snapshot
        assert ranks[0] == ranks[1] and ranks[0]["picked"] == {"a": other.run, "b": ranks[0]["run"]}
    s = SnapshotStore(tmp_path / "store")
    assert [r.run for r in s.runs("b")] == [runs[0][0]["run"], runs[1][0]["run"]]
    assert [r.steps for r in s.runs("b")] == [(2,), (2,)]
