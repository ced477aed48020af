"""``ram.sparsify`` / ``ram.density`` / ``ram.threshold``: the activity rule on LoRA ΔW when verl's merges merge LoRA
snapshots. The merged folder equals :func:`ram_live.peft.ram_merge_adapter_files` with the same rule, bit for bit;
bad values are one-line errors naming the key. Checkpoints are written here in verl's file layout (one rank, plain
tensors, PEFT's names, ``lora_train_meta.json``), so these tests need neither verl nor a process group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live.errors import ConfigError
from ram_live.integrations.verl import RAMVerl, options_from_mapping
from ram_live.peft import RelativeThreshold, TopK, ram_merge_adapter_files
from ram_live.store import SnapshotStore

SHAPES = {"layer.q": (16, 12), "layer.v": (8, 12)}  # the LoRA targets (out, in)
R, ALPHA = 4, 8


def _base(folder: Path) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = {f"{m}.weight": torch.randn(s, generator=g).to(torch.bfloat16) for m, s in SHAPES.items()}
    base["norm.weight"] = torch.ones(12, dtype=torch.bfloat16)
    folder.mkdir()
    save_file(base, str(folder / "model.safetensors"))
    return base


def _checkpoint(root: Path, base: dict[str, torch.Tensor], seed: int) -> Path:
    """A verl LoRA actor checkpoint (fp32 frozen base layers, lora_A/lora_B factors of rank R)."""
    g = torch.Generator().manual_seed(seed)
    state = {"base_model.model.norm.weight": base["norm.weight"].float()}
    for m, (out, inp) in SHAPES.items():
        state[f"base_model.model.{m}.base_layer.weight"] = base[f"{m}.weight"].float()
        state[f"base_model.model.{m}.lora_A.default.weight"] = torch.randn(R, inp, generator=g) * 0.1
        state[f"base_model.model.{m}.lora_B.default.weight"] = torch.randn(out, R, generator=g) * 0.01
    actor = root / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": R, "lora_alpha": ALPHA, "task_type": "CAUSAL_LM"}))
    return actor.parent


def _options(tmp_path: Path, agent: str, **keys: object):
    return options_from_mapping(
        {
            "store": str(tmp_path / "store"),
            "agent": agent,
            "base": str(tmp_path / "base"),
            "importance": None,
            "merged_dir": str(tmp_path / "merged"),
            "durable": False,
            **keys,
        }
    )


def _snapshots(tmp_path: Path) -> dict[str, torch.Tensor]:
    base = _base(tmp_path / "base")
    for seed, agent in enumerate(("coder", "tools"), start=1):
        RAMVerl(_options(tmp_path, agent)).snapshot(_checkpoint(tmp_path / agent, base, seed), step=1)
    return base


def _tau_adapter(folder: Path, tau: dict[str, torch.Tensor]) -> Path:
    """A PEFT adapter folder whose ΔW is exactly ``tau``: B = τ, A = I, r = lora_alpha (scaling 1)."""
    folder.mkdir()
    n = next(iter(tau.values())).shape[1]
    tensors = {}
    for m, t in tau.items():
        tensors[f"base_model.model.{m}.lora_A.weight"] = torch.eye(n)
        tensors[f"base_model.model.{m}.lora_B.weight"] = t.contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": n,
                "lora_alpha": n,
                "target_modules": sorted(m.split(".")[-1] for m in tau),
                "use_rslora": False,
                "fan_in_fan_out": False,
                "bias": "none",
            }
        )
    )
    return folder


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


RULES = {  # the ram.* keys: the API's sparsify=
    "topk": ({"sparsify": "topk", "density": 0.1}, TopK(0.1)),
    "relative": ({"sparsify": "relative", "threshold": 1.0}, RelativeThreshold(1.0)),
    "auto": ({}, TopK(0.5)),
}


@pytest.mark.parametrize("case", sorted(RULES))
def test_lora_merge_with_the_rule_equals_the_peft_merge(tmp_path, case):
    """Two LoRA agents' snapshots merged by the integration with ram.sparsify set equal, bit for bit,
    ram_merge_adapter_files(into_base=True, sparsify=<the same rule>) on adapters of the same ΔW (τ = snapshot −
    base), onto the store's base; the rule is recorded and changes the merge (null: |τ| > eps, a plain mean)."""
    keys, rule = RULES[case]
    base = _snapshots(tmp_path)
    ram = RAMVerl(_options(tmp_path, "coder", **keys))
    metrics = ram.merge(step=1)
    merged = load_file(tmp_path / "merged" / "coder" / "global_step_1" / "model.safetensors")
    record = json.loads((tmp_path / "merged" / "coder" / "global_step_1" / "ram_merge.json").read_text())
    assert record["sparsify"] == str(rule) and record["eps"] == 0.0

    store = SnapshotStore(tmp_path / "store")
    base32 = {k: v.float() for k, v in base.items()}
    adapters = {}
    for agent in ("coder", "tools"):
        snap = store.open(agent, 1)
        tau = {m: snap.get(f"{m}.weight").float() - base32[f"{m}.weight"] for m in SHAPES}
        adapters[agent] = _tau_adapter(tmp_path / f"adapter_{agent}", tau)
    expected = ram_merge_adapter_files(
        adapters, base=base32, into_base=True, sparsify=rule, method="ram_plus", dtype=torch.bfloat16
    )
    assert sorted(merged) == sorted(expected)
    assert not torch.equal(merged["layer.q.weight"], base["layer.q.weight"])
    for k in merged:
        assert merged[k].dtype == expected[k].dtype and torch.equal(_bits(merged[k]), _bits(expected[k])), k

    targeted = sum(torch.Size(s).numel() for s in SHAPES.values())
    kept = rule.density if isinstance(rule, TopK) else None
    if kept is not None:  # the density metric counts what the rule kept (k = int(density·numel) per module)
        assert metrics["ram/coder/density"] == pytest.approx(
            sum(int(kept * torch.Size(s).numel()) for s in SHAPES.values()) / (targeted + 12)
        )
    dense = RAMVerl(_options(tmp_path, "coder", sparsify=None, merged_dir=str(tmp_path / "dense"))).merge(step=1)
    assert dense["ram/coder/density"] == pytest.approx(targeted / (targeted + 12))  # every ΔW entry is active
    plain = load_file(tmp_path / "dense" / "coder" / "global_step_1" / "model.safetensors")
    assert not torch.equal(plain["layer.q.weight"], merged["layer.q.weight"])


@pytest.mark.parametrize(
    "keys, named",
    [
        ({"sparsify": "topq"}, "ram.sparsify"),
        ({"sparsify": "topk", "density": 1.5}, "ram.density"),
        ({"sparsify": "topk", "density": 0}, "ram.density"),
        ({"sparsify": "topk", "density": True}, "ram.density"),
        ({"sparsify": "topk", "density": "a lot"}, "ram.density"),
        ({"density": 0.1}, "ram.density"),  # TopK's parameter without ram.sparsify=topk
        ({"sparsify": "relative", "threshold": -1.0}, "ram.threshold"),
        ({"sparsify": "topk", "threshold": 1.0}, "ram.threshold"),
    ],
)
def test_bad_rule_keys_are_one_line_errors_naming_the_key(tmp_path, keys, named):
    with pytest.raises(ConfigError) as err:
        _options(tmp_path, "coder", **keys)
    message = str(err.value)
    assert named in message and "\n" not in message


def test_rule_keys_are_ram_keys():
    from ram_live.integrations.verl import RAMVerlOptions

    assert {"sparsify", "density", "threshold"} <= set(RAMVerlOptions.keys())
    opts = options_from_mapping({"store": "s", "agent": "a", "sparsify": "topk", "density": 0.3})
    assert opts.lora_rule() == TopK(0.3)
    assert options_from_mapping({"store": "s", "agent": "a", "sparsify": None}).lora_rule() is None


def test_mixed_store_with_a_rule_is_refused(tmp_path):
    """ram.sparsify applies to LoRA snapshots; a store that mixes LoRA and full-weight agents is refused, naming
    the key (ram.agents picks one kind)."""
    from ram_live.integrations.verl import VerlIntegrationError

    base = _snapshots(tmp_path)
    full = {k: v.float() + 0.01 for k, v in base.items()}
    actor = tmp_path / "full" / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    torch.save(full, actor / "model_world_size_1_rank_0.pt")
    RAMVerl(_options(tmp_path, "full")).snapshot(actor.parent, step=1)
    with pytest.raises(VerlIntegrationError, match="ram.sparsify"):
        RAMVerl(_options(tmp_path, "coder", sparsify="topk")).merge(step=1)
    RAMVerl(_options(tmp_path, "coder", sparsify="topk", agents=["coder", "tools"])).merge(step=1)
