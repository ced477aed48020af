"""The verl integration against genuine verl 0.9 checkpoints (FSDP2, gloo, 2 processes): snapshots equal the
all-gathered master weights and verl's own model merger output, the checkpoint callback built by verl from its own
config snapshots and merges, the offline command, LoRA, the mixin, start-up validation."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

# "verl.trainer", not "verl": with tests/ on sys.path this very folder is a namespace package named verl
verl = pytest.importorskip("verl.trainer", reason="verl is not installed: bash scripts/test_verl.sh builds its venv")
pytestmark = [
    pytest.mark.filterwarnings(r"ignore:.*engine is not available"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from verl_helpers import CALLBACK, compose, run_overrides  # noqa: E402

from ram_live import merge  # noqa: E402
from ram_live.errors import ConfigError, UnsupportedInputError  # noqa: E402
from ram_live.store import (  # noqa: E402
    BaseMismatchError,
    LocalModel,
    LocalTensor,
    SnapshotStore,
    fingerprint,
)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _base(run: SimpleNamespace) -> dict[str, torch.Tensor]:
    return load_file(run.base / "model.safetensors")


def _ref(run: SimpleNamespace, name: str) -> dict[str, torch.Tensor]:
    ref = load_file(run.ref / f"{name}.safetensors")
    ref.pop("lm_head.weight", None)  # tied to model.embed_tokens.weight (the base folder stores it once)
    return ref


# ----------------------------------------------------------------------------------------------- snapshots


def test_callback_during_training_snapshots_before_rotation(verl_run):
    """coder ran with max_actor_ckpt_to_keep=1 and the callback on the driver: every save became a snapshot
    (shard boxes as pieces) before the next save deleted its checkpoint; each equals the all-gathered fp32 weights."""
    store = SnapshotStore(verl_run.store)
    assert store.steps("coder") == [1, 2]
    assert not (verl_run.root / "coder" / "global_step_1" / "actor").exists()  # rotated away by verl
    base = _base(verl_run)
    for step in (1, 2):
        snap = store.open("coder", step)
        ref = _ref(verl_run, f"coder_{step}")
        assert sorted(snap.keys()) == sorted(ref) == sorted(base)
        for key, value in ref.items():
            assert _equal(snap.get(key), value), key
        verl_meta = snap.manifest["extra"]["verl"]
        assert verl_meta["weights"] == "master" and verl_meta["dtype"] == "float32"
        assert verl_meta["world_size"] == 2 and verl_meta["global_step"] == step and not verl_meta["lora"]
        assert snap.manifest["activity"] == {"rule": "changed"}
        pieces = snap.manifest["tensors"]["model.embed_tokens.weight"]["pieces"]
        assert sorted((p["offsets"], p["shape"]) for p in pieces) == [([0, 0], [128, 64]), ([128, 0], [128, 64])]
        assert 0.02 < snap.density < 0.2  # masked AdamW steps: a sparse update
    history = json.loads((verl_run.ref / "coder_callback.json").read_text())
    assert [h["step"] for h in history] == [1.0, 2.0]
    assert history[1]["ram/coder/active"] == pytest.approx(store.open("coder", 2).density)
    # the store's base is the base model upcast to the master weights' dtype (exact)
    sbase = store.base_source()
    for key, value in base.items():
        assert _equal(sbase.get(key), value.float()), key


def test_task_vectors_equal_verl_model_merger_up_to_its_bf16_cast(verl_run, tmp_path):
    """verl's merger (`python -m verl.model_merger merge --backend fsdp`) concatenates the shards and casts them to
    bf16: it equals the bf16 cast of the snapshot bit for bit; its task vector is ours up to that rounding."""
    from ram_live.integrations.verl import RAMVerl, options_from_mapping

    ram = RAMVerl(options_from_mapping({"store": str(tmp_path / "s"), "agent": "tools", "base": str(verl_run.base)}))
    metrics = ram.snapshot(verl_run.root / "tools" / "global_step_2", step=2)
    assert metrics["ram/tools/snapshot_step"] == 2.0
    snap = SnapshotStore(tmp_path / "s").open("tools", 2)
    merger = load_file(verl_run.merged_tools / "model.safetensors")
    base = _base(verl_run)
    assert sorted(merger) == sorted(snap.keys())
    hidden = moved = 0
    for key, ours in ((k, snap.get(k)) for k in merger):
        assert ours.dtype == torch.float32
        assert _equal(ours.bfloat16(), merger[key]), key
        tau_verl = merger[key].float() - base[key].float()
        tau_ours = ours - base[key].float()
        assert torch.equal(tau_verl, (base[key].float() + tau_ours).bfloat16().float() - base[key].float()), key
        moved += int(torch.count_nonzero(tau_ours))
        hidden += int(torch.count_nonzero(tau_ours)) - int(torch.count_nonzero(tau_verl))
    assert moved > 0 and 0 <= hidden < moved  # some updates are below one bf16 step: the cast drops them


def test_offline_command_bf16_weights_equal_verl_merger(verl_run, tmp_path, capsys):
    """`ram-live verl-snapshot --weights bf16`: snapshots of what a released bf16 checkpoint holds — exactly verl's
    merger output, and their task vectors exactly verl's."""
    from ram_live.integrations.verl import main

    store = tmp_path / "bf16"
    args = [
        "--ckpt-root",
        str(verl_run.root / "tools"),
        "--agent",
        "tools",
        "--store",
        str(store),
        "--base",
        str(verl_run.base),
        "--weights",
        "bf16",
    ]
    assert main(args + ["--merge-dir", str(tmp_path / "merged")]) == 0
    snaps = SnapshotStore(store)
    assert snaps.steps("tools") == [1, 2]
    snap = snaps.open("tools", 2)
    assert snap.manifest["extra"]["verl"]["weights"] == "bf16"
    merger = load_file(verl_run.merged_tools / "model.safetensors")
    for key, value in merger.items():
        assert _equal(snap.get(key), value), key
    assert (tmp_path / "merged" / "tools" / "global_step_2" / "tokenizer.json").is_file()
    capsys.readouterr()
    assert main(args) == 0  # nothing new: both steps are in the store
    assert "in the store already" in capsys.readouterr().err
    assert main(args + ["--steps", "7"]) == 2
    assert "no checkpoint of step(s) [7]" in capsys.readouterr().err
    assert main(args + ["-O", "kep=1"]) == 2
    assert "unknown ram option(s) ram.kep" in capsys.readouterr().err
    pruned = [
        "--ckpt-root",
        str(verl_run.root / "tools"),
        "--agent",
        "tools",
        "--store",
        str(tmp_path / "k"),
        "--base",
        str(verl_run.base),
        "-O",
        "keep=1",
        "-O",
        "snapshot_activity=abs",
        "-O",
        "snapshot_eps=1e-4",
    ]
    assert main(pruned) == 0
    kept = SnapshotStore(tmp_path / "k")
    assert kept.steps("tools") == [2]
    assert kept.open("tools", 2).manifest["activity"] == {"rule": "abs", "eps": 1e-4}
    master = ["--ckpt-root", str(verl_run.root / "tools"), "--agent", "tools2", "--store", str(store)]
    assert main(master) == 2  # fp32 master weights into a bf16 store: refused, with the reason
    assert "bfloat16" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- the callback


def test_checkpoint_callback_built_by_verl_snapshots_merges_and_logs(verl_run, capsys):
    """verl builds the callback from its own composed config (trainer.checkpoint_callback_class + the ram group)
    and calls on_save after each save: snapshot at every save, merge every 2 saves into a loadable HF folder equal
    to RAM+ of the all-gathered weights, ram/* metrics through verl's Tracking logger."""
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo.checkpoint_callback import (
        CheckpointCallback,
        build_checkpoint_callback,
    )
    from verl.utils.tracking import Tracking

    root = verl_run.root / "tools"
    config = compose(
        run_overrides(
            str(verl_run.base),
            str(root),
            str(verl_run.store),
            "tools",
            "+ram.merge_every=2",
            "+ram.keep_merged=1",
            "trainer.logger=[console]",
            "+ram.evaluate=verl_helpers.score",
        )
    )
    callback = build_checkpoint_callback(config)
    assert type(callback).__name__ == "RAMCheckpointCallback" and isinstance(callback, CheckpointCallback)
    trainer = SimpleNamespace(logger=Tracking("p", "e", default_backend=["console"]), total_training_steps=2)
    capsys.readouterr()
    callback.on_save(trainer=trainer, global_step=1, checkpoint_dir=str(root / "global_step_1"), async_save=False)
    # the pre-flight made merged_dir/<agent> (written to and emptied); no generalist before the second save
    assert not any((root / "ram_merged" / "tools").iterdir())
    callback.on_save(trainer=trainer, global_step=2, checkpoint_dir=str(root / "global_step_2"), async_save=False)
    printed = capsys.readouterr().out
    assert "ram/tools/lambda" in printed and "ram/coder/rho" in printed and "ram/tools/active" in printed
    merged = root / "ram_merged" / "tools" / "global_step_2"
    record = json.loads((merged / "ram_merge.json").read_text())
    assert record["agents"] == {"coder": 2, "tools": 2}
    # the same merge from the all-gathered weights, in memory, weighted by the importances the snapshots carry
    # (exp_avg_sq from the optimizer shards: curvature-aware RAM+ is what the callback merges by default)
    base32 = {k: v.float() for k, v in _base(verl_run).items()}
    store = SnapshotStore(verl_run.store)
    importance = {name: store.open(name, 2).importance for name in ("coder", "tools")}
    assert all(v is not None for v in importance.values())
    expected, info = merge(
        {"coder": _ref(verl_run, "coder_2"), "tools": _ref(verl_run, "tools_2")},
        base=base32,
        dtype=torch.bfloat16,
        importance=importance,
        return_info=True,
    )
    got = load_file(merged / "model.safetensors")
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert _equal(got[key], expected[key]), key
    assert record["lambda"] == pytest.approx(info.lambdas)
    assert all(1.0 < lam <= 1.2 for lam in info.lambdas.values())
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as the base
    out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(out).all()
    assert callback.history[-1]["ram/agents"] == 2.0
    assert callback.history[-1]["ram/eval_step"] == 2.0 and callback.history[-1]["ram/loss"] > 0
    assert "ram/loss" in printed


def test_startup_validation_names_the_setting(verl_run, tmp_path):
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    def build(*extra: str, agent: str = "x", drop_ram: bool = False):
        overrides = run_overrides(str(verl_run.base), str(tmp_path / "ck"), str(tmp_path / "s"), agent, *extra)
        if drop_ram:
            overrides = [o for o in overrides if not o.startswith("+ram.")]
        return build_checkpoint_callback(compose(overrides))

    cases = [
        ((), {"drop_ram": True}, "no `ram` group"),
        (("+ram.agnet=y",), {}, "unknown ram option(s) ram.agnet"),
        (("+ram.weights=int8",), {}, "ram.weights"),
        (("+ram.merge_every=0",), {}, "ram.merge_every"),
        (("trainer.save_freq=-1",), {}, "trainer.save_freq"),
        (("actor_rollout_ref.actor.strategy=megatron",), {}, "strategy"),
        (("actor_rollout_ref.actor.checkpoint.async_save=true",), {}, "async_save"),
        (("+ram.base=/nonexistent/model",), {}, "ram.base"),
        (("+ram.evaluate=no_such_module.fn",), {}, "ram.evaluate"),
        (("+ram.sparsify=topq",), {}, "ram.sparsify"),  # LoRA's activity rule (test_verl_lora.py)
        (("+ram.sparsify=topk", "+ram.density=2.0"), {}, "ram.density"),
        (("+ram.density=0.1",), {}, "ram.density"),
        (("+ram.eval_timeout=0",), {}, "ram.eval_timeout"),  # where the evaluation runs in Ray (test_verl_remote.py)
        (("+ram.eval_resources.num_gpu=1",), {}, "ram.eval_resources option(s) num_gpu"),
        ((), {"agent": "bad/name"}, "ram.agent"),
    ]
    for extra, kwargs, message in cases:
        with pytest.raises(ConfigError) as err:
            build(*extra, **kwargs)
        assert message in str(err.value), (extra, str(err.value))
    # a store whose base is another model: refused at start-up, not at the first save
    other = {k: v.float() for k, v in _base(verl_run).items()}
    other["model.norm.weight"] = other["model.norm.weight"] + 1
    SnapshotStore(tmp_path / "s2").set_base(other)
    with pytest.raises(BaseMismatchError):
        build_checkpoint_callback(
            compose(run_overrides(str(verl_run.base), str(tmp_path / "ck"), str(tmp_path / "s2"), "x"))
        )


def test_mixin_for_trainers_without_callback_class(verl_run, tmp_path):
    from ram_live.integrations.verl import RAMTrainerMixin
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class RAMRayPPOTrainer(RAMTrainerMixin, RayPPOTrainer):
        pass

    assert RAMRayPPOTrainer._save_checkpoint is RAMTrainerMixin._save_checkpoint

    class SavingTrainer:  # what the mixin needs of RayPPOTrainer: config, global_steps, _save_checkpoint()
        def __init__(self, config):
            self.config = config
            self.global_steps = 0
            self.saved: list[int] = []

        def _save_checkpoint(self):
            self.saved.append(self.global_steps)  # the checkpoint of this step is already on disk

    class Trainer(RAMTrainerMixin, SavingTrainer):
        pass

    config = compose(
        run_overrides(
            str(verl_run.base),
            str(verl_run.root / "tools"),
            str(tmp_path / "s"),
            "tools",
            "trainer.checkpoint_callback_class=null",
            "+ram.merge_every=1",
            f"+ram.merged_dir={tmp_path / 'merged'}",
        )
    )
    trainer = Trainer(config)
    trainer.global_steps = 2
    trainer._save_checkpoint()
    assert trainer.saved == [2]
    assert SnapshotStore(tmp_path / "s").steps("tools") == [2]
    assert (tmp_path / "merged" / "tools" / "global_step_2" / "model.safetensors").is_file()
    assert trainer.ram_history[-1]["ram/tools/lambda"] == 1.0  # one agent: nothing shared, nothing unique-scaled


# ----------------------------------------------------------------------------------------------- LoRA


def test_lora_checkpoint_gives_delta_w_task_vectors(verl_run, tmp_path):
    """A LoRA run's checkpoint (PEFT factors as DTensor shards, lora_train_meta.json): the snapshot is base + ΔW,
    ΔW = (alpha/r)·B·A of the all-gathered factors; it agrees with the adapter verl's merger extracts (bf16)."""
    from ram_live.integrations.verl import RAMVerl, options_from_mapping

    from ram_live.peft import lora_deltas

    ram = RAMVerl(options_from_mapping({"store": str(tmp_path / "s"), "agent": "lora", "base": str(verl_run.base)}))
    ram.snapshot(verl_run.root / "lora" / "global_step_1", step=1)
    snap = SnapshotStore(tmp_path / "s").open("lora", 1)
    meta = snap.manifest["extra"]["verl"]
    assert meta["lora"] and meta["lora_rank"] == 4 and meta["lora_alpha"] == 8 and meta["lora_modules"] == 4
    ref = load_file(verl_run.ref / "lora_1.safetensors")
    base = _base(verl_run)
    targeted = set()
    for key in ref:
        if ".lora_A." not in key:
            continue
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        a, b = ref[key], ref[key.replace(".lora_A.", ".lora_B.")]
        w = f"{module}.weight"
        targeted.add(w)
        expected = base[w].float() + (8 / 4) * (b @ a)
        torch.testing.assert_close(snap.get(w), expected, rtol=0, atol=1e-6)
        assert not torch.equal(snap.get(w), base[w].float())
    assert len(targeted) == 4
    for key in base:
        if key not in targeted:
            assert _equal(snap.get(key), base[key].float()), key
    verl_deltas = lora_deltas(verl_run.merged_lora / "lora_adapter")
    assert {f"{m}.weight" for m in verl_deltas} == targeted
    for module, delta in verl_deltas.items():
        ours = snap.get(f"{module}.weight") - base[f"{module}.weight"].float()
        torch.testing.assert_close(ours, delta, rtol=2e-2, atol=2e-4)  # verl's adapter factors are bf16


# ----------------------------------------------------------------------------------------------- pieces


def test_streamed_fingerprint_equals_the_stores(verl_run):
    from ram_live.integrations.verl.pieces import stream_fingerprint

    base = {k: v.float() for k, v in _base(verl_run).items()}
    specs = {k: (tuple(v.shape), v.dtype) for k, v in base.items()}
    whole = fingerprint(LocalModel.from_obj(base))
    groups = []
    keys = sorted(base)
    for i in range(0, len(keys), 5):  # groups of tensors, the first rows and the rest of each one separately
        rows = {k: LocalTensor(base[k][:1], tuple(base[k].shape), (0,) * base[k].dim(), True) for k in keys[i : i + 5]}
        rest = {
            k: LocalTensor(base[k][1:], tuple(base[k].shape), (1,) + (0,) * (base[k].dim() - 1), True)
            for k in keys[i : i + 5]
            if base[k].shape[0] > 1
        }
        groups += [rows, rest]
    assert stream_fingerprint(specs, groups) == whole


def test_incomplete_checkpoint_is_refused(verl_run, tmp_path):
    from ram_live.integrations.verl import (
        ActorCheckpoint,
        RAMVerl,
        options_from_mapping,
    )

    actor = tmp_path / "global_step_2" / "actor"
    shutil.copytree(verl_run.root / "tools" / "global_step_2" / "actor", actor)
    (actor / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(UnsupportedInputError, match=r"rank\(s\) \[1\]"):
        ActorCheckpoint(actor)
    ram = RAMVerl(options_from_mapping({"store": str(tmp_path / "s"), "agent": "tools", "base": str(verl_run.base)}))
    with pytest.raises(UnsupportedInputError):
        ram.snapshot(actor.parent, step=2)
    assert SnapshotStore(tmp_path / "s").steps("tools") == []
    assert not list((tmp_path / "s").glob("tools/*.safetensors"))


def test_import_is_lazy():
    code = (
        "import sys, ram_live.integrations.verl as v\n"
        "assert 'verl' not in sys.modules, 'verl imported eagerly'\n"
        "cls = v.RAMCheckpointCallback\n"
        "from verl.trainer.ppo.checkpoint_callback import CheckpointCallback\n"
        "assert issubclass(cls, CheckpointCallback) and cls is v.RAMCheckpointCallback\n"
        "from verl.utils.import_utils import load_class_from_fqn\n"
        f"assert load_class_from_fqn({CALLBACK!r}, 'CheckpointCallback') is cls\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shard_boxes_of_fsdp_and_hsdp_meshes():
    """The box of each rank's shard: torch.chunk of dim 0 over the fsdp mesh dim; HSDP replicas owned once."""
    from ram_live.integrations.verl.checkpoint import shard_box
    from torch.distributed.tensor import Replicate, Shard

    hsdp = torch.arange(4).view(2, 2)  # ("ddp", "fsdp"): 2 replicas of 2 shards
    got = {r: shard_box("w", (5, 3), hsdp, (Replicate(), Shard(0)), r, (3 if r % 2 == 0 else 2, 3)) for r in range(4)}
    assert got == {0: ((0, 0), True), 1: ((3, 0), True), 2: ((0, 0), False), 3: ((3, 0), False)}
    fsdp = torch.arange(3)
    assert [shard_box("b", (2, 4), fsdp, (Shard(0),), r, (n, 4)) for r, n in enumerate((1, 1, 0))] == [
        ((0, 0), True),
        ((1, 0), True),
        ((2, 0), True),
    ]
    with pytest.raises(UnsupportedInputError, match="give"):
        shard_box("w", (5, 3), hsdp, (Replicate(), Shard(0)), 1, (3, 3))
    with pytest.raises(UnsupportedInputError, match="not in its device mesh"):
        shard_box("w", (5, 3), hsdp, (Replicate(), Shard(0)), 7, (3, 3))


def test_readme_command_line_composes(verl_run, tmp_path):
    """docs/verl.md's verl command line is a valid verl 0.9 config whose ram group validates (paths swapped)."""
    import re
    import shlex

    from ram_live.integrations.verl import options_from_verl

    section = (Path(__file__).resolve().parents[2] / "docs" / "verl.md").read_text()
    command = re.search(r"```bash\n(python3 -m verl\.trainer\.main_ppo.*?)```", section, re.S).group(1)
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    swap = {"actor_rollout_ref.model.path": str(verl_run.base), "+ram.store": str(tmp_path / "store")}
    overrides = [f"{w.split('=')[0]}={swap[w.split('=')[0]]}" if w.split("=")[0] in swap else w for w in words[3:]]
    config = compose(overrides)
    assert config.trainer.checkpoint_callback_class == CALLBACK
    opts = options_from_verl(config)
    assert (opts.agent, opts.merge_every, opts.keep_merged, opts.save_freq) == ("coder", 5, 2, 20)


def test_snapshots_carry_exp_avg_sq_from_the_optimizer_shards(verl_run):
    """The callback's snapshots (coder, FSDP2 on 2 ranks) store each rank's exp_avg_sq box read from
    optim_world_size_2_rank_R.pt (never gathered); read back, they are the all-gathered moments at the changed
    entries, in the store's codes; a merge of coder and tools snapshots uses them."""
    from ram_live.store.importance_codes import dequantize, quantize

    store = SnapshotStore(verl_run.store)
    snap = store.open("coder", 2)
    assert snap.manifest["version"] == 3 and snap.importance is not None
    moments = load_file(str(verl_run.ref / "coder_2_exp_avg_sq.safetensors"))
    sbase = store.base_source()
    checked = 0
    for key, v in moments.items():
        got = snap.importance.get(key)
        for p in snap.manifest["tensors"][key]["pieces"]:  # each rank's box was coded against its own maximum
            (o0, *_), (n0, *_) = p["offsets"], p["shape"]
            if p["encoding"] == "none":
                continue
            box = (slice(o0, o0 + n0),)
            active = snap.get(key)[box] != sbase.get(key)[box]
            want = torch.zeros(v[box].shape)
            codes, m = quantize(v[box][active])
            want[active] = dequantize(codes, m)
            assert torch.equal(got[box], want), key
            checked += 1
    assert checked >= 4
    _, info = merge({"coder": snap, "coder_again": store.open("coder", 2)}, return_info=True, importance="stored")
    assert info.extra["importance"] == "stored"
