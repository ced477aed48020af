"""RAMTrainerCallback on LoRA runs: TRL's real GRPOTrainer with a PEFT ``LoraConfig`` on the tiny Qwen2 and character
tokenizer of test_transformers_callback (no downloads). Two agents (different rewards) write their adapters' A/B
factors to one store; the callback's merges are checked bit for bit against ram_live's own adapter merge
(``ram_merge_adapter_files``) of the same adapters saved independently, reloaded with ``PeftModel.from_pretrained``,
evaluated on the generalist swapped into the live PeftModel (restored bit-exactly), folded into the base with
``into_base=True``, and resumed from a Trainer checkpoint (both ways transformers restores callback state) to the
same merge as an uninterrupted run. Mismatched agents are one-line errors naming the agent and the module."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
peft = pytest.importorskip("peft")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import TrainerCallback, TrainerControl, TrainerState  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import ram_live  # noqa: E402
from ram_live.errors import ConfigError, InputMismatchError  # noqa: E402
from ram_live.evaluate import rewards  # noqa: E402
from ram_live.integrations.transformers import RAMTrainerCallback  # noqa: E402
from ram_live.peft import (  # noqa: E402
    RelativeThreshold,
    TopK,
    UnsupportedAdapterError,
    lora_deltas,
    ram_merge_adapter_files,
)
from ram_live.store import BaseMismatchError  # noqa: E402
from test_transformers_callback import _model, _score, _tokenizer, _vowels  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

TARGETS = ["q_proj", "v_proj", "up_proj"]


def _early(completions: list[str], **kwargs: object) -> list[float]:
    """The second agent's reward: letters from the first half of the alphabet."""
    return [float(sum("a" <= ch <= "m" for ch in c)) for c in completions]


def _lora(**kw: Any) -> LoraConfig:
    return LoraConfig(**{"r": 2, "lora_alpha": 4, "target_modules": TARGETS, **kw})


class _SaveAdapter(TrainerCallback):
    """The reference: the adapter saved by PEFT itself at every step, independently of the RAM callback."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def on_step_end(
        self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> None:
        model.save_pretrained(self.folder / f"step-{state.global_step}")


class _StopAt(TrainerCallback):
    """Interrupts training after step ``step`` (its checkpoint is written first)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.global_step == self.step:
            control.should_training_stop = True


def _trainer(
    out: Path, reward: Any, steps: int, callbacks: list[Any], lora: LoraConfig | None = None, **extra: Any
) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=steps,
        save_steps=2,
        logging_steps=1,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        **extra,
    )
    prompts = datasets.Dataset.from_dict({"prompt": ["ab", "cd", "ef", "gh"] * 8})
    return GRPOTrainer(
        model=_model(),
        reward_funcs=reward,
        args=args,
        train_dataset=prompts,
        eval_dataset=prompts.select(range(4)),
        processing_class=_tokenizer(),
        callbacks=callbacks,
        peft_config=lora or _lora(),
    )


def _adapter_tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


def _live_lora(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


@pytest.fixture(autouse=True)
def _quiet() -> None:
    transformers.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def early_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding agent "early" (2 GRPO steps, snapshot at step 2), and its adapter saved by PEFT."""
    root = tmp_path_factory.mktemp("early")
    trainer = _trainer(
        root / "run",
        _early,
        2,
        [RAMTrainerCallback(root / "store", "early", snapshot_every=2), _SaveAdapter(root / "ref")],
    )
    trainer.train()
    return root


def _with_early(early_store: Path, tmp_path: Path) -> Path:
    shutil.copytree(early_store / "store", tmp_path / "store")
    return tmp_path / "store"


def test_two_grpo_lora_agents_merge_into_an_adapter_that_reloads(early_store: Path, tmp_path: Path) -> None:
    store = _with_early(early_store, tmp_path)
    held_out = rewards(["ab", "cd", "ef"], [_vowels], tokenizer=_tokenizer(), max_new_tokens=4)

    def evaluate(model: Any) -> dict[str, float]:  # a callable and rewards(...) on the swapped-in generalist
        return {**_score(model), "reward": held_out(model)}

    cb = RAMTrainerCallback(
        store,
        "vowels",
        snapshot_every=2,
        merge_every=2,
        evaluate=evaluate,
        merged_dir=tmp_path / "merged",
        sparsify=TopK(0.5),
    )
    trainer = _trainer(tmp_path / "run", _vowels, 4, [cb, _SaveAdapter(tmp_path / "ref")])
    trainer.train()

    # snapshots: the adapter's A/B factors (adapter-sized), with the scalings and the base model's fingerprint
    s = ram_live.SnapshotStore(store)
    assert s.agents() == ["early", "vowels"] and s.steps("vowels") == [2, 4]
    snap = s.open("vowels", 4)
    factors = _live_lora(trainer.model)
    assert sorted(snap.keys()) == sorted(
        k.removeprefix("base_model.model.").replace(".default.weight", "") for k in factors
    )
    assert snap.dense_bytes == sum(4 * v.numel() for v in factors.values())
    meta = snap.manifest["extra"]["peft"]
    assert meta["kind"] == "lora" and meta["adapter"] == "default"
    assert {m["scaling"] for m in meta["modules"].values()} == {2.0}
    assert meta["base_fingerprint"] == s.open("early", 2).manifest["extra"]["peft"]["base_fingerprint"]

    # each merge: ram_merge_adapter_files of the adapters PEFT saved at those steps, bit for bit
    assert [h["step"] for h in cb.history] == [2.0, 4.0]
    assert cb.saved == [str(tmp_path / "merged" / "vowels" / f"step-{n}") for n in (2, 4)]
    for n in (2, 4):
        inputs = {"early": early_store / "ref" / "step-2", "vowels": tmp_path / "ref" / f"step-{n}"}
        ref = ram_merge_adapter_files(inputs, out=tmp_path / f"want-{n}", sparsify=TopK(0.5))
        got, want = _adapter_tensors(tmp_path / "merged" / "vowels" / f"step-{n}"), _adapter_tensors(ref)
        assert sorted(got) == sorted(want)
        for key in want:
            assert torch.equal(got[key], want[key]), key
        cfg, ref_cfg = (json.loads((f / "adapter_config.json").read_text()) for f in (Path(cb.saved[n // 2 - 1]), ref))
        for field in ("r", "lora_alpha", "target_modules", "rank_pattern", "alpha_pattern", "use_rslora"):
            assert cfg[field] == ref_cfg[field], field
    logged = cb.history[1]
    assert logged["ram/agents"] == 2.0 and logged["ram/early/snapshot_step"] == 2.0
    assert logged["ram/vowels/density"] == pytest.approx(0.5, abs=0.01)  # TopK(0.5) of each module's ΔW
    assert 0.0 <= logged["ram/refactor_error"] < 1.0 and logged["ram/early/lambda"] >= 1.0

    # the saved adapter reloads with PeftModel.from_pretrained: its ΔW is the merged one, and it scores as logged
    folder = tmp_path / "merged" / "vowels" / "step-4"
    reloaded = PeftModel.from_pretrained(_model(), folder).eval()
    merged = lora_deltas(folder)
    for module, delta in lora_deltas(reloaded).items():
        assert torch.equal(delta, merged[module]), module
    result = cb.last_result
    for module, f in result.factors.items():
        assert torch.equal(merged[module], (f.B @ f.A).mul_(1.0)), module
    assert _score(reloaded)["loglik"] == logged["ram/loglik"]
    assert held_out(reloaded) == logged["ram/reward"]
    assert transformers.AutoTokenizer.from_pretrained(folder)("ab").input_ids == [3, 4]

    # the live PeftModel got its own adapter and scalings back after each swap: they equal the checkpoint's
    saved = _adapter_tensors(tmp_path / "run" / "checkpoint-4")
    live = {k.replace(".default.", "."): v for k, v in _live_lora(trainer.model).items()}
    assert sorted(saved) == sorted(live)
    for key, value in saved.items():
        assert torch.equal(live[key], value), key
    root = trainer.model.base_model.model
    assert {root.get_submodule(m).scaling["default"] for m in merged} == {2.0}


def test_into_base_saves_a_model_folder_evaluated_with_the_trainer(early_store: Path, tmp_path: Path) -> None:
    store = _with_early(early_store, tmp_path)
    cb = RAMTrainerCallback(
        store,
        "vowels",
        snapshot_every=2,
        merge_every=2,
        evaluate="trainer",
        merged_dir=tmp_path / "merged",
        into_base=True,
        sparsify=RelativeThreshold(0.5),
    )
    trainer = _trainer(tmp_path / "run", _vowels, 2, [cb, _SaveAdapter(tmp_path / "ref")])
    cb.bind(trainer)
    base_before = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    trainer.train()

    assert "ram/eval_reward" in cb.history[0]  # trainer.evaluate() on the generalist, logged under ram/
    want = ram_merge_adapter_files(
        {"early": early_store / "ref" / "step-2", "vowels": tmp_path / "ref" / "step-2"},
        base=_model(),
        into_base=True,
        sparsify=RelativeThreshold(0.5),
    ).state_dict()
    folder = Path(cb.saved[0])
    got = load_file(str(folder / "model.safetensors"))
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert not torch.equal(got["model.layers.0.mlp.up_proj.weight"], _model().model.layers[0].mlp.up_proj.weight)
    generalist = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert all(torch.equal(generalist.state_dict()[k], v) for k, v in want.items())
    assert transformers.AutoTokenizer.from_pretrained(folder)("ab").input_ids == [3, 4]
    # the live model's base weights and adapter are its own again
    for key, value in trainer.model.state_dict().items():
        if "lora_" not in key:
            assert torch.equal(base_before[key], value), key
    live = {k.replace(".default.", "."): v for k, v in _live_lora(trainer.model).items()}
    for key, value in _adapter_tensors(tmp_path / "run" / "checkpoint-2").items():
        assert torch.equal(live[key], value), key


def _timeless(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k != "ram/merge_seconds"}


@pytest.mark.parametrize("restore", [False, True])
def test_resume_from_a_checkpoint_merges_as_an_uninterrupted_run(
    early_store: Path, tmp_path: Path, restore: bool
) -> None:
    def callback(store: Path) -> RAMTrainerCallback:
        return RAMTrainerCallback(
            store,
            "vowels",
            snapshot_every=2,
            merge_every=2,
            evaluate=_score,
            sparsify=("topk", 0.3),
            svd_options={"svd": "exact"},
        )

    whole = callback(_with_early(early_store, tmp_path / "whole"))
    _trainer(tmp_path / "whole" / "run", _vowels, 4, [whole]).train()

    store = _with_early(early_store, tmp_path / "cut")
    first = callback(store)
    _trainer(tmp_path / "cut" / "run", _vowels, 4, [first, _StopAt(2)]).train()
    checkpoint = tmp_path / "cut" / "run" / "checkpoint-2"
    state = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]["RAMTrainerCallback"]
    assert state["args"]["sparsify"] == ["topk", 0.3] and state["args"]["svd_options"]["svd"] == "exact"
    saved = state["attributes"]["ram_state"]
    assert saved["schedule"]["last_merge_step"] == 2 and saved["schedule"]["lora"]["adapter"] == "default"
    assert saved["schedule"]["lora"]["base_fingerprint"] == whole.schedule.model_fingerprint

    second = callback(store)
    resumed = _trainer(tmp_path / "cut" / "run", _vowels, 4, [second], restore_callback_states_from_checkpoint=restore)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    got = [c for c in resumed.callback_handler.callbacks if isinstance(c, RAMTrainerCallback)]
    assert len(got) == 1 and (got[0] is second) != restore
    cb = got[0]
    assert cb.history[0] == first.history[0]
    assert _timeless(cb.history[0]) == _timeless(whole.history[0])
    assert [h["step"] for h in cb.history] == [2.0, 4.0] and cb.schedule.merges == 2
    assert cb.schedule.model_fingerprint == whole.schedule.model_fingerprint
    # the merge after the resume is the uninterrupted run's, bit for bit
    assert sorted(cb.last_result.tensors) == sorted(whole.last_result.tensors)
    for key, value in whole.last_result.tensors.items():
        assert torch.equal(cb.last_result.tensors[key], value), key
    assert _timeless(cb.history[1]) == _timeless(whole.history[1])


# ----------------------------------------------------------------------------------------------- bad input


def _begin(cb: RAMTrainerCallback, model: Any) -> None:
    cb.on_train_begin(
        transformers.TrainingArguments("unused", report_to="none", use_cpu=True),
        TrainerState(),
        TrainerControl(),
        model=model,
    )


def _agent(store: Path, name: str, model: Any, **options: Any) -> RAMTrainerCallback:
    cb = RAMTrainerCallback(store, name, **options)
    _begin(cb, model)
    cb.schedule.snapshot(model, 1)
    return cb


def _one_line(exc: pytest.ExceptionInfo[Exception], *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text, text
    for word in words:
        assert word in text, (word, text)


def test_agents_that_do_not_fit_one_store_are_refused_naming_agent_and_module(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _agent(store, "a", get_peft_model(_model(), _lora()))
    assert ram_live.SnapshotStore(store).agents() == ["a"]

    with pytest.raises(InputMismatchError) as exc:  # another set of target modules
        _begin(RAMTrainerCallback(store, "b"), get_peft_model(_model(), _lora(target_modules=["q_proj", "v_proj"])))
    _one_line(exc, "agent 'b'", "does not target module 'model.layers.0.mlp.up_proj'", "agents 'a'")
    assert exc.value.agent == "b" and exc.value.key == "model.layers.0.mlp.up_proj"
    with pytest.raises(InputMismatchError) as exc:  # another rank
        _begin(RAMTrainerCallback(store, "b"), get_peft_model(_model(), _lora(r=4)))
    _one_line(exc, "agent 'b'", "module 'model.layers.0.mlp.up_proj' has rank 4", "rank 2")
    other = _model()
    with torch.no_grad():
        other.lm_head.weight.add_(1.0)
    with pytest.raises(BaseMismatchError) as exc:  # another base model
        _begin(RAMTrainerCallback(store, "b"), get_peft_model(other, _lora()))
    _one_line(exc, "agent 'b'", "another base model", "agent 'a'")
    with pytest.raises(UnsupportedAdapterError) as exc:  # an adapter ram_live cannot merge exactly
        _begin(RAMTrainerCallback(store, "b"), get_peft_model(_model(), _lora(use_dora=True)))
    _one_line(exc, "agent 'b'", "DoRA")
    with pytest.raises(ConfigError) as exc:  # one merged rank could not be swapped into a smaller module
        _begin(RAMTrainerCallback(tmp_path / "s2", "c"), get_peft_model(_model(), _lora(rank_pattern={"q_proj": 1})))
    _one_line(exc, "rank 2", "rank 1", "q_proj", "into_base=True")
    with pytest.raises(ConfigError) as exc:  # a full-model store
        full = tmp_path / "full"
        RAMTrainerCallback(full, "x").schedule.attach(_model())
        _begin(RAMTrainerCallback(full, "b"), get_peft_model(_model(), _lora()))
    _one_line(exc, "agent 'b'", "full-model snapshots")
    assert ram_live.SnapshotStore(store).agents() == ["a"]  # nothing was written for the refused agents


def test_lora_options_are_checked_and_apply_to_peft_models_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sparsify must be"):
        RAMTrainerCallback(tmp_path / "s", "a", sparsify="top")
    with pytest.raises(ConfigError, match="TopK.density"):
        RAMTrainerCallback(tmp_path / "s", "a", sparsify=("topk", 2.0))
    with pytest.raises(ConfigError, match="unknown SVD option"):
        RAMTrainerCallback(tmp_path / "s", "a", svd_options={"rnak": 2})
    with pytest.raises(ConfigError, match="into_base must be a bool"):
        RAMTrainerCallback(tmp_path / "s", "a", into_base="yes")
    with pytest.raises(ConfigError, match="LoRA runs"):
        _begin(RAMTrainerCallback(tmp_path / "s", "a", into_base=True), _model())
    with pytest.raises(ConfigError, match=r"entry 'rank' searches rank=.*into_base=True"):
        from ram_live.training.search import SearchSetting

        searched = SearchSetting(metric="x", budget=2, space={"ram_plus": None, "rank": [2, 4]})
        _begin(
            RAMTrainerCallback(tmp_path / "s", "a", into_base=True, search=searched), get_peft_model(_model(), _lora())
        )
    with pytest.raises(ConfigError, match="snapshot_activity='abs'"):
        _begin(
            RAMTrainerCallback(tmp_path / "s", "a", snapshot_activity="abs", snapshot_eps=1e-3),
            get_peft_model(_model(), _lora()),
        )
    with pytest.raises(ConfigError, match="base= is for full-model runs"):
        _begin(RAMTrainerCallback(tmp_path / "s", "a", base=_model()), get_peft_model(_model(), _lora()))
    with warnings.catch_warnings():  # a plain model with the default LoRA options: the full-model callback
        warnings.simplefilter("error")
        _begin(RAMTrainerCallback(tmp_path / "s", "a", importance=None), _model())


# ----------------------------------------------------------------------------------------------- vLLM


def test_vllm_rollout_after_a_lora_merge_samples_the_agent(
    early_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As test_transformers_vllm (TRL's real VLLMGeneration, vLLM faked), with LoRA: TRL pushes base + ΔW of the
    active adapter (``merge_adapter``, then ``unmerge_adapter``, which moves base weights by rounding, hence the
    tolerance); the merge's evaluation pushes the generalist, and the next rollout must push the agent again."""
    vllm_test = pytest.importorskip("test_transformers_vllm")
    vllm_generation = vllm_test.vllm_generation

    class Engine(vllm_test._Engine):
        def completions(self, count: int, length: int) -> list[list[int]]:
            t = self.trainer
            now = {n: p.detach().clone() for n, p in t.vllm_generation._iter_named_params()}
            held = set(now) == set(self.weights) and all(
                torch.allclose(self.weights[n], v, rtol=0, atol=1e-6) for n, v in now.items()
            )
            self.rollouts.append((t.state.global_step, "train" if t.model.training else "eval", held, now))
            return [[self.rng.randrange(3, 29) for _ in range(length)] for _ in range(count)]

    cb = RAMTrainerCallback(
        _with_early(early_store, tmp_path), "vowels", snapshot_every=2, merge_every=2, evaluate="trainer"
    )
    trainer = _trainer(
        tmp_path / "run", _vowels, 3, [cb], save_strategy="no", vllm_importance_sampling_correction=False
    )
    monkeypatch.setattr(vllm_generation.VLLMGeneration, "_init_vllm", lambda self: None)
    monkeypatch.setattr(vllm_generation, "SamplingParams", lambda **kw: kw, raising=False)
    engine = Engine(trainer)
    gen = vllm_generation.VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=trainer.processing_class,
        mode="server",
        max_completion_length=4,
        logprobs=0,
    )
    gen.vllm_client = vllm_test._Client(engine)
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation, trainer._last_loaded_step = True, "server", gen, -1
    cb.bind(trainer)
    trainer.train()

    assert [h["step"] for h in cb.history] == [2.0]
    evals = [r for r in engine.rollouts if r[1] == "eval"]
    after = [r for r in engine.rollouts if r[1] == "train" and r[0] == 2]
    assert evals and {r[0] for r in evals} == {2} and after
    assert any(not torch.allclose(after[0][3][n], v, rtol=0, atol=1e-4) for n, v in evals[0][3].items())
    for step, kind, held, _ in engine.rollouts:  # every rollout sampled what the model computed then
        assert held, (step, kind)


def test_search_on_a_grpo_lora_run_saves_the_winning_adapter_with_its_record(early_store: Path, tmp_path: Path) -> None:
    """``search=`` on a LoRA run: each candidate evaluated in the live PeftModel, the rank move tries the agents' rank
    (2, the candidates' own) and twice it; the winner saved as a PEFT folder equal to ``ram_merge_adapter_files`` of
    the same adapters with the record's options, the record (listing the rank) beside it."""
    from ram_live.selection import from_json
    from ram_live.training.search import SearchSetting

    store = _with_early(early_store, tmp_path)
    seen: list[float] = []

    def evaluate(model: Any) -> dict[str, float]:
        seen.append(_score(model)["loglik"])
        return _score(model)

    setting = SearchSetting(metric="loglik", budget=4, space={"ram_plus": [{"r": 0.1, "alpha": 2.0}], "rank": None})
    cb = RAMTrainerCallback(
        store,
        "vowels",
        snapshot_every=2,
        merge_every=2,
        evaluate=evaluate,
        merged_dir=tmp_path / "merged",
        search=setting,
    )
    trainer = _trainer(tmp_path / "run", _vowels, 2, [cb, _SaveAdapter(tmp_path / "ref")])
    before = _live_lora(trainer.model)
    trainer.train()

    folder = tmp_path / "merged" / "vowels" / "step-2"
    assert cb.saved == [str(folder)]
    record = json.loads((store / "_search" / "vowels" / "step_2.json").read_text())  # with the trials
    assert json.loads((folder / "ram_search.json").read_text()) == {k: v for k, v in record.items() if k != "history"}
    trials = record["history"]["history"]
    assert [t["family"] for t in trials] == ["ram_plus", "rank"]
    assert "rank" not in trials[0]["options"] and trials[1]["options"]["rank"] == 4  # 2: the run's own rank
    assert record["best"]["rank"] in (2, 4) and record["svd_options"]["rank"] == record["best"]["rank"]
    assert len(seen) == 3  # two candidates and the generalist's own evaluation
    assert max(seen[:2]) == record["best_score"] == seen[2]
    assert cb.history[0]["ram/search/option/rank"] == float(record["best"]["rank"])

    # the saved adapter loads with PEFT and is ram_merge_adapter_files' merge with the chosen options, bit for bit
    options = {**from_json(record["history"]["best"]), "rank": record["best"]["rank"]}
    inputs = {"early": early_store / "ref" / "step-2", "vowels": tmp_path / "ref" / "step-2"}
    want = _adapter_tensors(ram_merge_adapter_files(inputs, out=tmp_path / "want", **options))
    got = _adapter_tensors(folder)
    assert sorted(got) == sorted(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    reloaded = PeftModel.from_pretrained(_model(), folder).eval()
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == record["best"]["rank"]
    assert _score(reloaded)["loglik"] == pytest.approx(record["best_score"], abs=1e-5)
    # the live adapter is the agent's own after the search's swaps: the PEFT checkpoint's
    live = {k.replace(".default.", "."): v for k, v in _live_lora(trainer.model).items()}
    saved = _adapter_tensors(tmp_path / "ref" / "step-2")
    assert sorted(saved) == sorted(live) and sorted(before) == sorted(_live_lora(trainer.model))
    for key, value in saved.items():
        assert torch.equal(live[key], value), key
