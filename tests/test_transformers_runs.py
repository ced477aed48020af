"""Runs with TRL's real GRPOTrainer (the tiny Qwen2 of test_transformers_callback.py): a second, fresh run under a
used agent name keeps the first run's snapshots byte for byte and merges its own snapshot, never the first run's
higher step; a trainer resumed with ``resume_from_checkpoint`` continues its own run after a newer one began."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

import ram_live  # noqa: E402
from ram_live.integrations.transformers import RAMTrainerCallback  # noqa: E402
from test_transformers_callback import _spaces, _trainer, _vowels  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet() -> None:
    transformers.logging.set_verbosity_error()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _callback(store: Path, agent: str) -> RAMTrainerCallback:
    return RAMTrainerCallback(store, agent, snapshot_every=2, merge_every=2, evaluate=None)


def _bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)) for k in b)


def _run_files(store: ram_live.SnapshotStore, agent: str, run: str) -> set[str]:
    names = set()
    for info in store.list(agent, run=run):
        names |= {info.path.name} | {f["name"] for f in info.manifest["files"]}
    return names


def test_fresh_and_resumed_grpo_runs_under_one_name(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _trainer(tmp_path / "s", _spaces, 2, _callback(store, "spaces")).train()
    first = _callback(store, "vowels")
    _trainer(tmp_path / "a", _vowels, 4, first).train()  # checkpoints at steps 2 and 4
    before = _files(store / "vowels")
    second = _callback(store, "vowels")  # a fresh run: another sampling temperature and data order
    _trainer(tmp_path / "b", _vowels, 2, second, temperature=0.5, data_seed=3).train()
    after = _files(store / "vowels")
    assert {n: after[n] for n in before} == before  # nothing of the first run changed, byte for byte
    s = ram_live.SnapshotStore(store)
    run1, run2 = first.schedule.run, second.schedule.run
    assert run1 != run2 and [(r.run, r.steps) for r in s.runs("vowels")] == [(run1, (2, 4)), (run2, (2,))]
    # its step-2 merge took its own step-2 snapshot (the issue logged the first run's step 4 here)
    assert second.history[-1]["ram/vowels/snapshot_step"] == 2.0
    result = second.schedule.last_result
    assert result.agents == {"spaces": 2, "vowels": 2} and result.extra["runs"]["vowels"] == run2
    own = {"spaces": s.latest("spaces"), "vowels": s.open("vowels", 2, run=run2)}
    merged = ram_live.ram_merge(own, base=s.base_source())
    mixed = ram_live.ram_merge({**own, "vowels": s.latest("vowels", run=run1)}, base=s.base_source())
    assert _bits(result.tensors, merged) and not _bits(mixed, merged)

    kept = {n: b for n, b in _files(store / "vowels").items() if n in _run_files(s, "vowels", run2)}
    assert len(kept) == 2
    resumed = _callback(store, "vowels")
    _trainer(tmp_path / "a", _vowels, 6, resumed).train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-4"))
    assert resumed.schedule.run == run1 and s.steps("vowels", run=run1) == [2, 4, 6]
    assert s.current_run("vowels") == run2 and s.steps("vowels") == [2]
    now = _files(store / "vowels")
    assert {n: now[n] for n in kept} == kept  # the newer run's snapshot, byte for byte
    assert resumed.history[-1]["ram/vowels/snapshot_step"] == 6.0
    assert resumed.schedule.last_result.extra["runs"] == {"spaces": s.current_run("spaces"), "vowels": run1}
