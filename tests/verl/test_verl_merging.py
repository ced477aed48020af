"""The verl integration's merged folders (``integrations/verl/merging.py``): several agents' runs share one
``merged_dir`` (each writes ``<agent>/global_step_<N>``), a merged folder is never replaced, ``keep_merged`` prunes
the run's own folders only, and an agent that changed nothing is named once per merge. Checkpoints are written here
in verl's file layout (one rank, plain tensors): no verl, no process group."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live import merge
from ram_live.errors import UnchangedAgentWarning
from ram_live.integrations.verl import RAMVerl, options_from_mapping
from ram_live.store import SnapshotStore

BASE = {"w": torch.linspace(-1.0, 1.0, 24).reshape(4, 6), "b": torch.zeros(6)}


def _agent(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + (torch.rand(v.shape, generator=g) < 0.5) * torch.randn(v.shape, generator=g) for k, v in BASE.items()
    }


def _run(tmp_path: Path, agent: str, weights: dict[str, torch.Tensor], **keys: object) -> RAMVerl:
    """Agent ``agent``'s run with one checkpoint (step 1) snapshotted into the shared store."""
    folder = tmp_path / "base"
    if not folder.exists():
        folder.mkdir(parents=True)
        save_file(BASE, str(folder / "model.safetensors"))
    ram = RAMVerl(
        options_from_mapping(
            {
                "store": str(tmp_path / "store"),
                "agent": agent,
                "base": str(folder),
                "weights": "fp32",
                "importance": None,
                "merged_dir": str(tmp_path / "merged"),
                "durable": False,
                **keys,
            }
        )
    )
    actor = tmp_path / agent / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    torch.save(weights, actor / "model_world_size_1_rank_0.pt")
    ram.snapshot(actor.parent, step=1)
    return ram


def _merged(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_runs_sharing_a_merged_dir_keep_every_merged_folder(tmp_path):
    a = _run(tmp_path, "a", _agent(1))
    a.merge(step=1)  # the store holds a alone
    b = _run(tmp_path, "b", _agent(2))
    b.merge(step=1)  # a and b
    shared = tmp_path / "merged"
    assert a.last_merged == shared / "a" / "global_step_1" and b.last_merged == shared / "b" / "global_step_1"
    store = SnapshotStore(tmp_path / "store")
    want = {
        "a": merge({"a": store.open("a", 1)}, base=store.base_source()),
        "b": merge({"a": store.open("a", 1), "b": store.open("b", 1)}, base=store.base_source()),
    }
    for agent, tensors in want.items():
        got = _merged(shared / agent / "global_step_1")
        assert set(got) == set(tensors)
        for k, v in tensors.items():
            assert torch.equal(got[k], v), (agent, k)
    assert not torch.equal(want["a"]["w"], want["b"]["w"])
    # a merges step 1 again (a resumed run): beside the first folder, which keeps its bytes
    first = (shared / "a" / "global_step_1" / "model.safetensors").read_bytes()
    a.merge(step=1)
    assert a.last_merged == shared / "a" / "global_step_1-v1"
    assert (shared / "a" / "global_step_1" / "model.safetensors").read_bytes() == first
    got = _merged(a.last_merged)
    assert all(torch.equal(got[k], v) for k, v in want["b"].items())  # b is in the store now
    assert json.loads((a.last_merged / "ram_merge.json").read_text())["agents"] == {"a": 1, "b": 1}
    assert sorted(p.name for p in (shared / "a").iterdir()) == ["global_step_1", "global_step_1-v1"]


def test_keep_merged_prunes_the_runs_own_folders_only(tmp_path):
    b = _run(tmp_path, "b", _agent(2))
    b.merge(step=1)
    a = _run(tmp_path, "a", _agent(1), keep_merged=2)
    for step in (1, 1, 2):
        a.merge(step=step)
    shared = tmp_path / "merged"
    assert sorted(p.name for p in (shared / "a").iterdir()) == ["global_step_1-v1", "global_step_2"]
    assert sorted(p.name for p in (shared / "b").iterdir()) == ["global_step_1"]  # another run's: kept


@pytest.mark.parametrize("variant", ["ram", "ram_plus"])
def test_an_agent_that_changed_nothing_is_named_once_per_merge(tmp_path, variant):
    _run(tmp_path, "idle", {k: v.clone() for k, v in BASE.items()}, variant=variant)
    ram = _run(tmp_path, "a", _agent(1), variant=variant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = ram.merge(step=1)
    named = [w for w in caught if issubclass(w.category, UnchangedAgentWarning)]
    assert len(named) == 1 and named[0].message.agents == ("idle",)
    assert str(named[0].message).startswith("RAMVerl('a'), merge of step 1: agent 'idle' changed no entry")
    assert metrics["ram/idle/density"] == 0.0 and metrics["ram/a/density"] > 0
    record = json.loads((ram.last_merged / "ram_merge.json").read_text())
    assert record["unchanged"] == ["idle"] and record["rho"]["idle"] is None  # ρ = +∞
    store = SnapshotStore(tmp_path / "store")
    alone = merge({"a": store.open("a", 1)}, base=store.base_source(), method=variant)
    got = _merged(ram.last_merged)
    for k, v in alone.items():
        assert torch.equal(got[k], v), k
    # a merge without such an agent records none and says nothing
    other = _run(tmp_path / "other", "a", _agent(1), variant=variant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.merge(step=1)
    assert not [w for w in caught if issubclass(w.category, UnchangedAgentWarning)]
    assert json.loads((other.last_merged / "ram_merge.json").read_text())["unchanged"] == []
