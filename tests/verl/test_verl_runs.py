"""Runs of the verl integration: checkpoints written here in verl's file layout (one rank, plain tensors), so these
tests need neither verl nor a process group. A fresh verl run under a used agent name (a new
``trainer.default_local_dir``) keeps the earlier run's snapshots and merges its own; a run resumed from its
checkpoints, and the offline ``ram-live verl-snapshot``, continue the run those checkpoints recorded."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from ram_live.integrations.verl import RAMVerl, options_from_mapping
from ram_live.integrations.verl.cli import main as verl_snapshot
from ram_live.store import SnapshotStore
from ram_live.store.runs import RUN_MARKER


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(6, 8, generator=g), "v": torch.randn(8, generator=g)}


def _moved(seed: int) -> dict[str, torch.Tensor]:
    base = _weights(0)
    g = torch.Generator().manual_seed(seed)
    return {k: torch.where(torch.rand(v.shape, generator=g) < 0.5, v + seed, v) for k, v in base.items()}


def _checkpoint(root: Path, step: int, state: dict[str, torch.Tensor]) -> Path:
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    return actor.parent


def _ram(tmp_path: Path, agent: str) -> RAMVerl:
    folder = tmp_path / "base"
    if not folder.exists():
        folder.mkdir()
        save_file(_weights(0), str(folder / "model.safetensors"))
    opts = {
        "store": str(tmp_path / "store"),
        "agent": agent,
        "base": str(folder),
        "durable": False,
        "max_part_bytes": 64,
    }
    return RAMVerl(options_from_mapping({**opts, "merged_dir": str(tmp_path / "merged"), "importance": None}))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_fresh_resumed_and_offline_verl_runs_under_one_name(tmp_path, caplog):
    _ram(tmp_path, "coder").snapshot(_checkpoint(tmp_path / "coder_ckpts", 2, _moved(9)), step=2)
    first = _ram(tmp_path, "tools")
    a = tmp_path / "tools_v1"
    for step in (2, 4):
        first.snapshot(_checkpoint(a, step, _moved(step)), step=step)
    assert (a / "global_step_4" / "actor" / RUN_MARKER).exists()
    before = _files(tmp_path / "store" / "tools")
    second = _ram(tmp_path, "tools")  # a new experiment folder: a fresh run
    with caplog.at_level("INFO", logger="ram_live.training"):
        second.snapshot(_checkpoint(tmp_path / "tools_v2", 2, _moved(20)), step=2)
    assert f"(the latest: {first.run}, last step 4); this run writes a new run, {second.run}, kept apart" in caplog.text
    metrics = second.merge(step=2)
    after = _files(tmp_path / "store" / "tools")
    assert {n: after[n] for n in before} == before
    s = SnapshotStore(tmp_path / "store")
    assert second.run != first.run and [(r.run, r.steps) for r in s.runs("tools")] == [
        (first.run, (2, 4)),
        (second.run, (2,)),
    ]
    assert metrics["ram/tools/snapshot_step"] == 2.0  # its own step 2, not the first run's step 4
    assert len(s.latest("tools").manifest["files"]) > 1  # written in several parts (max_part_bytes), all in one run
    # verl resumed the first run from global_step_4: the next save continues that run
    resumed = _ram(tmp_path, "tools")
    resumed.snapshot(_checkpoint(a, 6, _moved(6)), step=6)
    assert resumed.run == first.run and s.steps("tools", run=first.run) == [2, 4, 6]
    assert resumed.merge(step=6)["ram/tools/snapshot_step"] == 6.0  # its own run, though not the latest-started
    assert s.current_run("tools") == second.run
    # the offline command over the first run's checkpoints: the run they recorded, every step already in it
    _checkpoint(a, 8, _moved(8))
    argv = ["--ckpt-root", str(a), "--agent", "tools", "--store", str(tmp_path / "store"), "--weights", "fp32"]
    assert verl_snapshot(argv) == 0
    assert s.steps("tools", run=first.run) == [2, 4, 6, 8] and s.steps("tools", run=second.run) == [2]
    # trainer.resume_mode=disable: a fresh run in the old run's folder never continues that run
    fresh = _ram(tmp_path, "tools")
    fresh.resumes = False
    fresh.snapshot(_checkpoint(a, 10, _moved(10)), step=10)
    assert fresh.run not in (first.run, second.run) and s.steps("tools", run=first.run) == [2, 4, 6, 8]
