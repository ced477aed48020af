"""A manifest copied by hand under another run's name (a user "renaming" or forking a run) names the same data
files as the original: pruning or re-taking one of them never deletes the files the other still names."""

from __future__ import annotations

import json

import torch

from ram_live.store import SnapshotStore


def _base():
    return {"w": torch.zeros(32)}


def _copy_as(root, agent, step, run, new_run):
    src = root / agent / f"{step:012d}.{run}.json"
    m = json.loads(src.read_text())
    m["run"] = new_run
    (root / agent / f"{step:012d}.{new_run}.json").write_text(json.dumps(m))


def test_pruning_a_copied_run_keeps_the_original_runs_data(tmp_path):
    store = SnapshotStore(tmp_path)
    store.set_base(_base())
    w = store.writer("a", _base())
    w.snapshot({"w": torch.arange(32.0)}, 2)
    _copy_as(tmp_path, "a", 2, w.run, "mine")
    assert torch.equal(store.open("a", 2, run="mine").get("w"), torch.arange(32.0))
    store.prune(0, "a", run="mine")
    assert store.steps("a", run="mine") == []
    assert torch.equal(store.open("a", 2, run=w.run).get("w"), torch.arange(32.0))
    assert store.verify().ok


def test_retaking_a_step_keeps_files_a_copy_under_another_run_names(tmp_path):
    store = SnapshotStore(tmp_path)
    store.set_base(_base())
    w = store.writer("a", _base())
    w.snapshot({"w": torch.arange(32.0)}, 2)
    _copy_as(tmp_path, "a", 2, w.run, "mine")
    w.snapshot({"w": torch.ones(32)}, 2)  # the same run takes step 2 again: its old files go unless named
    assert torch.equal(store.open("a", 2, run="mine").get("w"), torch.arange(32.0))
    assert torch.equal(store.open("a", 2, run=w.run).get("w"), torch.ones(32))
    store.prune(0, "a", run=w.run)
    store.prune(0, "a", run="mine")
    assert not list((tmp_path / "a").glob("*.safetensors"))  # once nothing names them, they go
