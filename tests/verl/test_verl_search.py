"""``ram.search`` of the verl integration through its verl-free core (:class:`RAMVerl`), in the main environment:
snapshots put into the store directly (the checkpoint reading is tested with genuine verl checkpoints in
test_verl_integration.py, which needs verl's own venv)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live import merge
from ram_live.errors import ConfigError
from ram_live.integrations.verl import RAMVerl, options_from_mapping
from ram_live.training.search import SearchSetting
from ram_live.training.search_record import load_choice
from ram_live.store import SnapshotStore

pytest.importorskip("ram_live.selection")


def _base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.layer.weight": torch.randn(8, 6, generator=g),
        "model.layer.bias": torch.randn(8, generator=g),
        "lm_head.weight": torch.randn(5, 8, generator=g),
    }


def _agent(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        k: v + torch.randn(v.shape, generator=g) * 0.1 * (torch.rand(v.shape, generator=g) < 0.5)
        for k, v in base.items()
    }


def test_search_merge_writes_the_winner_and_its_record(tmp_path):
    base = _base()
    folder = tmp_path / "base_model"
    folder.mkdir()
    save_file(base, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "toy"}')
    agents = {"a": _agent(base, 1), "b": _agent(base, 2)}
    target = {k: v + 0.6 * (agents["a"][k] - v) + 1.5 * (agents["b"][k] - v) for k, v in base.items()}
    seen = []

    def held_out(merged_dir: str, step: int) -> dict[str, float]:
        seen.append((merged_dir, step))
        sd = load_file(f"{merged_dir}/model.safetensors")
        assert json.loads(open(f"{merged_dir}/config.json").read()) == {"model_type": "toy"}
        return {"dist": float(sum(((sd[k].double() - t.double()) ** 2).sum() for k, t in target.items()))}

    setting = SearchSetting(evaluate=held_out, metric="dist", mode="min", budget=10)
    opts = options_from_mapping(
        {
            "store": str(tmp_path / "store"),
            "agent": "a",
            "base": str(folder),
            "weights": "fp32",
            "merge_every": 1,
            "merged_dir": str(tmp_path / "merged"),
            "search": setting,
        }
    )
    ram = RAMVerl(opts)  # sets the store's base from the folder (fp32)
    store = SnapshotStore(tmp_path / "store", durable=False)
    for name, sd in agents.items():
        store.writer(name, base=base).snapshot(sd, 3)
    metrics = ram.merge(step=3)
    assert 1 <= len(seen) <= 10 and all(step == 3 for _, step in seen)
    final = tmp_path / "merged" / "a" / "global_step_3"
    record = json.loads((final / "ram_merge.json").read_text())
    assert record["search"]["best"]["method"] == record["variant"]
    # the merged folder is merge(**best) of the snapshots, bit for bit; the candidate folder is gone
    again = merge(store.latest_all(), base=base, **load_choice(final / "ram_search.json"))
    saved = load_file(str(final / "model.safetensors"))
    for k, v in again.items():
        assert torch.equal(saved[k].view(torch.int32), v.contiguous().view(torch.int32)), k
    assert sorted(p.name for p in (tmp_path / "merged" / "a").iterdir()) == ["global_step_3"]
    dist = float(sum(((saved[k].double() - t.double()) ** 2).sum() for k, t in target.items()))
    assert metrics["ram/search/best_score"] == pytest.approx(dist, rel=1e-12)
    assert metrics[f"ram/search/method/{record['variant']}"] == 1.0
    plain = merge(store.latest_all(), base=base, method="ram_plus")
    assert dist <= float(sum(((plain[k].double() - t.double()) ** 2).sum() for k, t in target.items()))


def test_search_options_are_validated_with_the_ram_group(tmp_path):
    common = {
        "store": str(tmp_path / "s"),
        "agent": "a",
        "base": str(tmp_path),
        "merge_every": 1,
        "merged_dir": str(tmp_path / "m"),
    }
    opts = options_from_mapping({**common, "search": {"budget": 4, "metric": "acc", "evaluate": "math:sqrt"}})
    assert opts.search == SearchSetting(budget=4, metric="acc", evaluate="math:sqrt")
    with pytest.raises(ConfigError, match="ram.search: unknown search option"):
        options_from_mapping({**common, "search": {"budjet": 4}})
    with pytest.raises(ConfigError, match="ram.search needs an evaluation"):
        options_from_mapping({**common, "search": {"budget": 4}})
    with pytest.raises(ConfigError, match="merge_every"):
        options_from_mapping({**common, "merge_every": None, "search": {"evaluate": "math:sqrt"}})


def test_the_merges_importance_follows_what_the_snapshots_carry():
    """``ram.importance=adam``: "stored" where the snapshots carry importances (a mix is then refused by the merge,
    naming the agents without); plain RAM where none does (checkpoints saved without the optimizer's state) and
    for LoRA snapshots; ``null``: always plain."""
    from types import SimpleNamespace

    from ram_live.integrations.verl.config import RAMVerlOptions
    from ram_live.integrations.verl.merging import stored_importance

    def snap(importance, lora=False):
        return SimpleNamespace(importance=importance, manifest={"extra": {"verl": {"lora": lora}}})

    adam, off = RAMVerlOptions(agent="a"), RAMVerlOptions(agent="a", importance=None)
    assert adam.importance == "adam"
    assert stored_importance({"a": snap(object()), "b": snap(object())}, adam) == "stored"
    assert stored_importance({"a": snap(object()), "b": snap(None)}, adam) == "stored"  # the merge names "b"
    assert stored_importance({"a": snap(None), "b": snap(None)}, adam) is None
    assert stored_importance({"a": snap(None, lora=True), "b": snap(None, lora=True)}, adam) is None
    assert stored_importance({"a": snap(object()), "b": snap(object())}, off) is None


def test_the_sampler_and_storage_keys_reach_the_search(tmp_path):
    optuna = pytest.importorskip("optuna")
    base = _base()
    folder = tmp_path / "base_model"
    folder.mkdir()
    save_file(base, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "toy"}')
    agents = {"a": _agent(base, 1), "b": _agent(base, 2)}
    calls = []

    def held_out(merged_dir: str, step: int) -> float:
        calls.append(step)
        sd = load_file(f"{merged_dir}/model.safetensors")
        return -float(sum(((sd[k] - 0.5 * agents["a"][k] - 0.5 * agents["b"][k]) ** 2).sum() for k in sd))

    url = f"sqlite:///{tmp_path / 'search.db'}"
    # as verl's +ram.search.sampler=tpe +ram.search.storage=... +ram.search.study=grpo give them
    search = {"evaluate": held_out, "budget": 6, "sampler": "tpe", "storage": url, "study": "grpo"}
    opts = options_from_mapping(
        {
            "store": str(tmp_path / "store"),
            "agent": "a",
            "base": str(folder),
            "weights": "fp32",
            "merge_every": 1,
            "merged_dir": str(tmp_path / "merged"),
            "search": search,
        }
    )
    assert opts.search.sampler == "tpe" and opts.search.storage == url
    ram = RAMVerl(opts)
    store = SnapshotStore(tmp_path / "store", durable=False)
    for name, sd in agents.items():
        store.writer(name, base=base).snapshot(sd, 3)
    ram.merge(step=3)
    names = optuna.get_all_study_names(url)
    # the merge's study, then its inputs' digest (snapshots published later are another search)
    assert len(names) == 1 and names[0].rsplit(":", 1)[0] == opts.search.study_name("a", 3, ram.run)
    assert names[0].startswith("grpo:a:") and len(names[0].rsplit(":", 1)[1]) == 16
    trials = optuna.load_study(study_name=names[0], storage=url).trials
    assert len([t for t in trials if t.state.name == "COMPLETE"]) == len(calls) >= 1
    with pytest.raises(ConfigError, match="sampler must be"):
        options_from_mapping(
            {
                "store": str(tmp_path / "s2"),
                "agent": "a",
                "merge_every": 1,
                "search": {"evaluate": "math:sqrt", "sampler": "nope"},
            }
        )
