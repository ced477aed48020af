"""Runs in the snapshot store (ram_live/store/runs.py): a fresh run under a used agent name never replaces or
removes another run's snapshot, merges take an agent's current run only, a resumed writer continues its own run,
a store written before runs still reads, and ``ram-live stores`` lists the runs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ram_live.cli import main
from ram_live.errors import ConfigError
from ram_live.store import CorruptSnapshotError, SnapshotNotFoundError, SnapshotStore


def _base():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(24, 16, generator=g), "e": torch.randn(8, 16, generator=g).bfloat16()}


def _moved(base, seed, density=0.3):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in base.items():
        mask = torch.rand(v.shape, generator=g) < density
        out[k] = torch.where(mask, (v.double() + 1.0 + seed).to(v.dtype), v)
    return out


def _same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k].view(-1), b[k].view(-1)) for k in a)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_fresh_run_under_a_used_name_keeps_the_first_run_whole(tmp_path):
    store, base = SnapshotStore(tmp_path / "s", durable=False), _base()
    first = store.writer("tools", base)
    a2, a4 = _moved(base, 2), _moved(base, 4)
    first.snapshot(a2, 2)
    first.snapshot(a4, 4)
    before = _files(tmp_path / "s" / "tools")
    second = store.writer("tools", base)  # new seed, new learning rate: a fresh run under the same name
    assert second.run != first.run
    b2 = _moved(base, 20)
    second.snapshot(b2, 2)
    after = _files(tmp_path / "s" / "tools")
    assert {n: after[n] for n in before} == before  # nothing of the first run changed, byte for byte
    assert len(after) == len(before) + 2  # the second run's manifest and data file
    runs = store.runs("tools")
    assert [(r.run, r.steps) for r in runs] == [(first.run, (2, 4)), (second.run, (2,))]
    assert runs[0].started < runs[1].started and store.current_run("tools") == second.run
    # "the latest snapshot of tools" is the second run's step 2, never the first run's higher step 4
    latest = store.latest("tools")
    assert (latest.run, latest.step) == (second.run, 2) and _same(latest.to_state_dict(), b2)
    assert store.latest_all()["tools"].run == second.run and store.steps("tools") == [2]
    with pytest.raises(
        SnapshotNotFoundError, match=f"step 4 in its current run '{second.run}'; run\\(s\\) {first.run} hold"
    ):
        store.open("tools", 4)  # not in the current run: says which run holds it
    # the first run stays readable by its id
    assert store.steps("tools", run=first.run) == [2, 4]
    assert _same(store.open("tools", 2, run=first.run).to_state_dict(), a2)
    assert _same(store.latest("tools", run=first.run).to_state_dict(), a4)
    assert [(i.run, i.step) for i in store.list("tools")] == [(first.run, 2), (first.run, 4), (second.run, 2)]
    assert store.verify().ok and len(store.verify().entries) == 4  # the base and three snapshots


def test_a_resumed_writer_continues_its_own_run_and_prune_stays_in_it(tmp_path):
    store, base = SnapshotStore(tmp_path / "s", durable=False), _base()
    first = store.writer("tools", base)
    first.snapshot(_moved(base, 2), 2)
    first.snapshot(_moved(base, 4), 4)
    started = store.runs("tools")[0].started
    second = store.writer("tools", base)
    second.snapshot(_moved(base, 20), 2)
    kept = {n: b for n, b in _files(tmp_path / "s" / "tools").items() if n in _names(store, second.run)}
    assert len(kept) == 2
    resumed = store.writer("tools", base, run=first.run)  # the first trainer resumed from its checkpoint
    assert (resumed.run, resumed.run_started) == (first.run, started)
    again = _moved(base, 40)
    resumed.snapshot(again, 4)  # a resumed run re-takes its own step: only its own snapshot is replaced
    resumed.snapshot(_moved(base, 6), 6)
    assert store.steps("tools", run=first.run) == [2, 4, 6] and store.steps("tools", run=second.run) == [2]
    assert _same(store.open("tools", 4, run=first.run).to_state_dict(), again)
    assert store.open("tools", 6, run=first.run).manifest["run_started"] == started
    assert store.current_run("tools") == second.run  # the latest-started run stays the current one
    now = _files(tmp_path / "s" / "tools")
    assert {n: now[n] for n in kept} == kept  # the second run's snapshot, byte for byte
    # a run prunes its own snapshots only; prune without a run keeps each run's newest
    removed = store.prune(1, "tools", run=first.run)
    assert [(i.run, i.step) for i in removed] == [(first.run, 2), (first.run, 4)]
    assert store.steps("tools", run=second.run) == [2]
    assert store.prune(1) == [] and store.gc(grace_s=0) == []  # gc keeps every file a manifest of any run names
    assert [(r.run, r.steps) for r in store.runs("tools")] == [(first.run, (6,)), (second.run, (2,))]


def _names(store, run):
    """The manifests and data files of ``run``'s snapshots of tools."""
    names = set()
    for info in store.list("tools", run=run):
        names.add(info.path.name)
        names |= {f["name"] for f in info.manifest["files"]}
    return names


def test_store_snapshot_keeps_one_run_per_store_object(tmp_path):
    base = _base()
    store = SnapshotStore(tmp_path / "s", durable=False)
    store.writer("b", base)  # sets the base
    one = store.snapshot("a", _moved(base, 1), 1)
    two = store.snapshot("a", _moved(base, 2), 2)
    assert one.run == two.run
    other = SnapshotStore(tmp_path / "s").snapshot("a", _moved(base, 3), 1)  # another process: another run
    assert other.run != one.run and store.current_run("a") == other.run
    assert store.steps("a", run=one.run) == [1, 2] and store.steps("a") == [1]


def test_run_ids_and_manifests_that_disagree_are_refused(tmp_path):
    store, base = SnapshotStore(tmp_path / "s", durable=False), _base()
    w = store.writer("a", base)
    w.snapshot(_moved(base, 1), 3)
    for bad in ("", "a/b", "..", "x" * 65, "-x", 7, "a.b"):
        with pytest.raises(ConfigError, match="run id"):
            store.writer("a", base, run=bad)
    with pytest.raises(SnapshotNotFoundError):
        store.open("a", 3, run="nosuchrun")
    with pytest.raises(SnapshotNotFoundError, match="in run 'nosuchrun'"):
        store.latest("a", run="nosuchrun")
    folder = tmp_path / "s" / "a"
    shutil.copy(folder / f"000000000003.{w.run}.json", folder / "000000000003.other.json")
    with pytest.raises(CorruptSnapshotError, match="says run"):
        store.open("a", 3, run="other")
    shutil.copy(folder / f"000000000003.{w.run}.json", folder / "000000000003.json")  # a named run's as legacy
    with pytest.raises(CorruptSnapshotError, match="says run"):
        store.open("a", 3, run="legacy")
    assert not store.verify().ok and len(store.verify().problems) == 2


def _as_old_store(root, agent, run):
    """Rename ``run``'s manifests to the names of a store written before runs (and take out the run fields)."""
    for path in sorted((root / agent).glob(f"*.{run}.json")):
        m = json.loads(path.read_text())
        del m["run"], m["run_started"]
        path.unlink()
        (root / agent / f"{m['step']:012d}.json").write_text(json.dumps(m))
    (root / "store.json").write_text(json.dumps({"format": "ram_live.store", "version": 1}))


def test_a_store_written_before_runs_reads_as_one_legacy_run(tmp_path, capsys):
    root, base = tmp_path / "s", _base()
    store = SnapshotStore(root, durable=False)
    w = store.writer("tools", base)
    old2, old4 = _moved(base, 2), _moved(base, 4)
    w.snapshot(old2, 2)
    w.snapshot(old4, 4)
    _as_old_store(root, "tools", w.run)
    store = SnapshotStore(root, create=False)
    assert [(r.run, r.started, r.steps) for r in store.runs("tools")] == [("legacy", None, (2, 4))]
    assert store.latest("tools").run == "legacy" and _same(store.latest("tools").to_state_dict(), old4)
    assert store.verify().ok
    legacy = _files(root / "tools")
    fresh = store.writer("tools", base)  # a new run into the old store
    new2 = _moved(base, 22)
    fresh.snapshot(new2, 2)
    assert json.loads((root / "store.json").read_text())["version"] == 2  # older ram_live now refuses the store
    now = _files(root / "tools")
    assert {n: now[n] for n in legacy} == legacy
    assert [r.run for r in store.runs("tools")] == ["legacy", fresh.run]
    assert _same(store.latest("tools").to_state_dict(), new2)
    assert _same(store.open("tools", 2, run="legacy").to_state_dict(), old2)
    # a trainer of the old run resumed (its checkpoint names no run) continues the legacy run, under its names
    store.writer("tools", base, run="legacy").snapshot(_moved(base, 6), 6)
    assert (root / "tools" / "000000000006.json").exists() and store.steps("tools", run="legacy") == [2, 4, 6]
    assert main(["stores", str(root)]) == 0
    out = capsys.readouterr().out
    assert "run tools/legacy: 3 snapshot(s), steps 2-6, began before runs" in out
    assert f"run tools/{fresh.run}: 1 snapshot(s), steps 2-2" in out and "(current: merges take this run)" in out
    assert main(["stores", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["run"], r["steps"], r["current"]) for r in doc["runs"]["tools"]] == [
        ("legacy", [2, 4, 6], False),
        (fresh.run, [2], True),
    ]
    assert [(r["run"], r["step"]) for r in doc["snapshots"]] == [
        ("legacy", 2),
        ("legacy", 4),
        ("legacy", 6),
        (fresh.run, 2),
    ]
    assert main(["stores", str(root), "--verify"]) == 0
    assert f"tools step 2 ({fresh.run})" in capsys.readouterr().out


def test_a_run_whose_manifests_cannot_be_read_keeps_its_place(tmp_path):
    store, base = SnapshotStore(tmp_path / "s", durable=False), _base()
    first = store.writer("a", base, run="20261201-100000-aaaaaa")  # ids as new_run_id makes them
    first.snapshot(_moved(base, 1), 1)
    second = store.writer("a", base, run="20261202-100000-bbbbbb")
    second.snapshot(_moved(base, 2), 1)
    assert store.current_run("a") == second.run
    (tmp_path / "s" / "a" / f"000000000001.{second.run}.json").write_text("{")  # damaged: its start unreadable
    fresh = SnapshotStore(tmp_path / "s")
    assert [r.run for r in fresh.runs("a")] == [first.run, second.run]  # the start its id carries
    assert fresh.runs("a")[1].started == 1796205600.0  # 2026-12-02 10:00:00 UTC
    with pytest.raises(CorruptSnapshotError):
        fresh.latest("a")  # the current run's snapshot is damaged: an error, never the older run's instead
