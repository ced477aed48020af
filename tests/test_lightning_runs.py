"""Runs with the real Lightning Trainer (CPU): a second, fresh run under a used agent name keeps the first run's
snapshots byte for byte and merges its own snapshots, never the first run's; a run resumed from its checkpoint
(``ckpt_path``) continues its own run, even after a newer run of the agent began."""

from __future__ import annotations

import warnings

import pytest
import torch

L = pytest.importorskip("lightning")

from ram_live import RamConfig, ram_merge  # noqa: E402
from ram_live.integrations.lightning import RAMCallback  # noqa: E402
from ram_live.store import SnapshotStore  # noqa: E402
from ram_live.training.schedule import RAMSchedule  # noqa: E402
from test_lightning import Net, _copy, _data, _loader, _trainer  # noqa: E402

warnings.filterwarnings("ignore", ".*does not have many workers.*")


class FastNet(Net):
    """The same base as :class:`Net` (seed 0), trained with another learning rate: a fresh run's new config."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.3)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _callback(store, agent, **kw):
    return RAMCallback(store, agent, snapshot_every=2, merge_every=2, evaluate=False, durable=False, **kw)


def _bits(a, b):
    return all(torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)) for k in a)


def test_a_fresh_lightning_run_under_a_used_name_neither_overwrites_nor_mixes(tmp_path, caplog):
    store = tmp_path / "store"
    _trainer([_callback(store, "coder")], 2).fit(Net(), _loader(_data("c")))
    first = _callback(store, "tools")
    _trainer([first], 4).fit(Net(), _loader(_data("t")))
    before = _files(store / "tools")
    second = _callback(store, "tools")  # new learning rate, new data order: a fresh run, not a resume
    model = FastNet()
    with caplog.at_level("INFO", logger="ram_live.training"):
        _trainer([second], 2).fit(model, _loader(_data("t", seed=5)))
    after = _files(store / "tools")
    assert {n: after[n] for n in before} == before  # nothing of the first run changed, byte for byte
    s = SnapshotStore(store)
    run1, run2 = first.schedule.run, second.schedule.run
    assert run1 != run2 and [(r.run, r.steps) for r in s.runs("tools")] == [(run1, (2, 4)), (run2, (2,))]
    said = [r.getMessage() for r in caplog.records if r.name == "ram_live.training"]
    assert (
        len(said) == 1 and f"the latest: {run1}, last step 4); this run writes a new run, {run2}, kept apart" in said[0]
    )
    # the second run's step-2 merge took its own step-2 snapshot, not the first run's step 4
    assert second.history[-1]["ram/tools/snapshot_step"] == 2.0
    snap = s.open("tools", 2, run=run2)
    assert _bits(snap.to_state_dict(), _copy(model))
    merged = ram_merge({"coder": s.latest("coder"), "tools": snap}, base=s.base_source(), config=RamConfig())
    mixed = ram_merge({"coder": s.latest("coder"), "tools": s.latest("tools", run=run1)}, base=s.base_source())
    assert not _bits(merged, mixed)  # the two runs' snapshots merge differently: the check below can fail
    # the generalist the callback merged is, bit for bit, the merge of run 2's snapshot with coder's
    result = second.last_result
    assert result.agents == {"coder": 2, "tools": 2} and result.extra["runs"]["tools"] == run2
    assert _bits({k: result.tensors[k] for k in merged}, merged)


def test_a_resumed_lightning_run_continues_its_own_run(tmp_path, caplog):
    store = tmp_path / "store"
    _trainer([_callback(store, "coder")], 2).fit(Net(), _loader(_data("c")))
    first = _callback(store, "tools")
    trainer = _trainer([first], 4)
    trainer.fit(Net(), _loader(_data("t")))
    ckpt = tmp_path / "tools.ckpt"
    trainer.save_checkpoint(ckpt)
    second = _callback(store, "tools")
    _trainer([second], 2).fit(FastNet(), _loader(_data("t", seed=5)))  # a newer run of tools begins
    run1, run2 = first.schedule.run, second.schedule.run
    info = SnapshotStore(store).list("tools", run=run2)[0]
    names = {info.path.name} | {f["name"] for f in info.manifest["files"]}
    kept = {n: b for n, b in _files(store / "tools").items() if n in names}
    assert len(kept) == 2
    resumed = _callback(store, "tools")
    model = Net(seed=7)  # its weights come from the checkpoint
    with caplog.at_level("INFO", logger="ram_live.training"):
        _trainer([resumed], 8).fit(model, _loader(_data("t")), ckpt_path=ckpt)
    assert f"'tools' continues its run {first.schedule.run}" in caplog.text and "last step 4" in caplog.text
    s = SnapshotStore(store)
    assert resumed.schedule.run == run1 and s.steps("tools", run=run1) == [2, 4, 6, 8]
    assert s.steps("tools", run=run2) == [2] and s.current_run("tools") == run2
    now = _files(store / "tools")
    assert {n: now[n] for n in kept} == kept  # the newer run's snapshot, byte for byte
    assert [h["ram/tools/snapshot_step"] for h in resumed.history] == [2.0, 4.0, 6.0, 8.0]
    assert _bits(s.open("tools", 8, run=run1).to_state_dict(), _copy(model))
    # its own snapshots from its own run; coder's from coder's current run
    assert resumed.schedule.picked_runs == {"coder": s.current_run("coder"), "tools": run1}


def test_a_checkpoint_of_a_ram_live_before_runs_continues_the_legacy_run(tmp_path):
    state = RAMSchedule(tmp_path / "s", "a").state_dict()
    assert state["run"] is None  # not attached yet: attach opens a new run
    old = {k: v for k, v in state.items() if k != "run"} | {"base_fingerprint": "rlfp1-" + "0" * 40}
    sched = RAMSchedule(tmp_path / "s", "a")
    sched.load_state_dict(old)
    assert sched.run == "legacy"
    sched.load_state_dict(state | {"run": "20261206-101010-abcdef"})
    assert sched.run == "20261206-101010-abcdef"
