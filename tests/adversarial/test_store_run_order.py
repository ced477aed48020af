"""A resumed older run is not its agent's current run while a later-started run holds snapshots: the line it
logs on resuming says so (a warning naming the later run), since other agents' merges take that run."""

from __future__ import annotations

import logging

import torch

from ram_live.store import SnapshotStore
from ram_live.store.runs import say_run


def _base():
    return {"w": torch.zeros(16)}


def test_resuming_an_older_run_warns_that_the_later_run_stays_current(tmp_path, caplog):
    store = SnapshotStore(tmp_path)
    store.set_base(_base())
    old = store.writer("a", _base())
    old.snapshot({"w": torch.ones(16)}, 4)
    abandoned = store.writer("a", _base())  # a fresh run, killed after its step-2 snapshot
    abandoned.snapshot({"w": torch.full((16,), 2.0)}, 2)
    resumed = store.writer("a", _base(), run=old.run)
    resumed.snapshot({"w": torch.full((16,), 3.0)}, 6)
    with caplog.at_level(logging.INFO, logger="ram_live.training"):
        say_run(store, "a", old.run)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and abandoned.run in warned[0].getMessage() and "last step 6" in warned[0].getMessage()
    assert store.current_run("a") == abandoned.run and store.latest("a").step == 2  # what the warning says
    caplog.clear()
    store.prune(0, "a", run=abandoned.run)  # the way on it names
    with caplog.at_level(logging.INFO, logger="ram_live.training"):
        say_run(store, "a", old.run)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING] and store.latest("a").step == 6


def test_a_fresh_run_is_current_even_when_an_earlier_run_came_from_a_clock_ahead(tmp_path):
    store = SnapshotStore(tmp_path)
    store.set_base(_base())
    ahead = store.writer("a", _base())
    ahead.run_started += 3600.0  # its machine's clock ran an hour ahead
    ahead.snapshot({"w": torch.ones(16)}, 8)
    fresh = store.writer("a", _base())
    fresh.snapshot({"w": torch.full((16,), 2.0)}, 2)
    assert store.current_run("a") == fresh.run and fresh.run_started > ahead.run_started
    assert store.latest("a").step == 2 and float(store.latest("a").get("w")[0]) == 2.0
    assert [r.run for r in store.runs("a")] == [ahead.run, fresh.run]
