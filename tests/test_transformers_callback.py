"""RAMTrainerCallback with TRL's real GRPOTrainer on a tiny Qwen2 built from a config and a character tokenizer
built here (no downloads), trained with a rule-based reward: snapshots, merges, saved generalists checked against
``ram_live.ram_merge`` of the store's snapshots, the evaluation on the swapped-in generalist, and resuming from a
Trainer checkpoint (both ways transformers restores callback state)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import ram_live  # noqa: E402
from ram_live.integrations.transformers import RAMTrainerCallback, SingleAgentWarning  # noqa: E402

CHARS = "abcdefghijklmnopqrstuvwxyz "
VOCAB = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    tk = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def _model() -> transformers.Qwen2ForCausalLM:
    cfg = transformers.Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)  # every run starts from the same base
    return transformers.Qwen2ForCausalLM(cfg)


def _vowels(completions: list[str], **kwargs: object) -> list[float]:
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


def _spaces(completions: list[str], **kwargs: object) -> list[float]:
    return [float(c.count(" ")) for c in completions]


def _score(model: torch.nn.Module) -> dict[str, float]:
    """A deterministic held-out number: the mean log-likelihood of a fixed text."""
    ids = torch.tensor([[VOCAB[c] for c in "hello world"]])
    with torch.no_grad():
        return {"loglik": -float(model(input_ids=ids, labels=ids).loss)}


def _trainer(out: Path, reward: object, steps: int, callback: RAMTrainerCallback, **extra: object) -> GRPOTrainer:
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
        callbacks=[callback],
    )


@pytest.fixture(autouse=True)
def _quiet() -> None:
    transformers.logging.set_verbosity_error()


def test_grpo_merges_saves_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    # agent "spaces" first, alone in the store: a snapshot at the checkpoint of step 2 (snapshot_on_save), a
    # merge at step 3, of one agent: it warns; evaluate="trainer" runs trainer.evaluate() (GRPO's rewards on the
    # eval prompts) with that "generalist" swapped in
    cb_b = RAMTrainerCallback(store, "spaces", snapshot_on_save=True, merge_every=3, evaluate="trainer")
    trainer_b = _trainer(tmp_path / "b", _spaces, 3, cb_b)
    cb_b.bind(trainer_b)
    with pytest.warns(SingleAgentWarning, match="one agent only"):
        trainer_b.train()
    assert ram_live.SnapshotStore(store).steps("spaces") == [2, 3]
    assert [h["step"] for h in cb_b.history] == [3.0]
    assert "ram/eval_reward" in cb_b.history[0] and "ram/agents" in cb_b.history[0]
    logged = [h for h in trainer_b.state.log_history if "ram/agents" in h]
    assert len(logged) == 1 and logged[0]["ram/spaces/snapshot_step"] == 3.0

    # agent "vowels": snapshots and merges every 2 steps, each generalist saved
    cb = RAMTrainerCallback(
        store, "vowels", snapshot_every=2, merge_every=2, evaluate=_score, merged_dir=tmp_path / "merged"
    )
    trainer = _trainer(tmp_path / "a", _vowels, 4, cb)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingleAgentWarning)
        trainer.train()
    assert [h["step"] for h in cb.history] == [2.0, 4.0]
    assert cb.saved == [str(tmp_path / "merged" / "vowels" / "step-2"), str(tmp_path / "merged" / "vowels" / "step-4")]
    assert ram_live.SnapshotStore(store).steps("vowels") == [2, 4]
    # the saved generalist is merge of the latest snapshots (vowels@4, spaces@3), bit for bit
    s = ram_live.SnapshotStore(store)
    want = ram_live.merge(
        {"vowels": s.open("vowels", 4), "spaces": s.open("spaces", 3)}, base=s.base_source(), importance="stored"
    )  # Adam: the callback's merges weigh by them
    saved = load_file(str(tmp_path / "merged" / "vowels" / "step-4" / "model.safetensors"))
    assert set(saved) == set(want)
    for key, value in want.items():
        assert torch.equal(saved[key], value), key
    # ...it loads with from_pretrained (with the run's tokenizer), and its score is the one logged
    generalist = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / "vowels" / "step-4")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "merged" / "vowels" / "step-4")("ab").input_ids == [
        3,
        4,
    ]
    assert _score(generalist)["loglik"] == cb.history[1]["ram/loglik"]
    # the trained model got its own weights back after each swap: they equal the last checkpoint's
    final = load_file(str(tmp_path / "a" / "checkpoint-4" / "model.safetensors"))
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(final[key], value), key
    assert not torch.equal(final["model.layers.0.mlp.up_proj.weight"], saved["model.layers.0.mlp.up_proj.weight"])
    state = json.loads((tmp_path / "a" / "checkpoint-4" / "trainer_state.json").read_text())
    saved_state = state["stateful_callbacks"]["RAMTrainerCallback"]["attributes"]["ram_state"]
    assert saved_state["schedule"]["last_merge_step"] == 4 and len(saved_state["history"]) == 2

    # resume from checkpoint-4, the store spelled relative to a new working directory; twice: transformers'
    # default (the callback reads its state itself) and restore_callback_states_from_checkpoint=True (transformers
    # rebuilds the callback from its JSON args; the evaluation function is taken from the live instance)
    shutil.copytree(store, tmp_path / "store_copy")
    monkeypatch.chdir(tmp_path)
    for restore, store_name in ((False, "store"), (True, "store_copy")):
        cb2 = RAMTrainerCallback(
            os.path.join(".", store_name),
            "vowels",
            snapshot_every=2,
            merge_every=2,
            evaluate=_score,
            merged_dir=tmp_path / f"merged_{restore}",
        )
        out = tmp_path / f"resumed_{restore}"
        shutil.copytree(tmp_path / "a" / "checkpoint-4", out / "checkpoint-4")
        if restore:  # the checkpoint's args name the store as first spelled: point them at the copy
            path = out / "checkpoint-4" / "trainer_state.json"
            st = json.loads(path.read_text())
            st["stateful_callbacks"]["RAMTrainerCallback"]["args"]["store"] = str(tmp_path / store_name)
            st["stateful_callbacks"]["RAMTrainerCallback"]["attributes"]["ram_state"]["key"] = cb2.state_key
            path.write_text(json.dumps(st))
        t2 = _trainer(out, _vowels, 6, cb2, restore_callback_states_from_checkpoint=restore)
        t2.train(resume_from_checkpoint=str(out / "checkpoint-4"))
        live = [c for c in t2.callback_handler.callbacks if isinstance(c, RAMTrainerCallback)]
        assert len(live) == 1 and (live[0] is cb2) != restore
        got = live[0]
        assert [h["step"] for h in got.history] == [2.0, 4.0, 6.0]
        assert got.history[:2] == cb.history
        assert got.schedule.merges == 3 and got.schedule.snapshots == 3
        assert got.schedule.base_fingerprint == cb.schedule.base_fingerprint
        assert "ram/loglik" in got.history[2]
        assert got.saved[:2] == cb.saved and got.saved[2].endswith("step-6")
        assert ram_live.SnapshotStore(tmp_path / store_name).steps("vowels") == [2, 4, 6]


def test_grpo_search_setting_saves_its_choice_next_to_the_generalist(tmp_path: Path) -> None:
    pytest.importorskip("ram_live.selection")
    from ram_live.training.search import SearchSetting
    from ram_live.training.search_record import load_choice

    store = tmp_path / "store"
    _trainer(tmp_path / "b", _spaces, 2, RAMTrainerCallback(store, "spaces", snapshot_every=2)).train()
    cb = RAMTrainerCallback(
        store,
        "vowels",
        snapshot_every=2,
        merge_every=2,
        evaluate=_score,
        merged_dir=tmp_path / "merged",
        search=SearchSetting(metric="loglik", mode="max", budget=4),
    )
    _trainer(tmp_path / "a", _vowels, 2, cb).train()
    folder = tmp_path / "merged" / "vowels" / "step-2"
    assert cb.saved == [str(folder)]
    record = cb.last_result.extra["search"]
    assert load_choice(folder / "ram_search.json") == load_choice(record["file"])
    # the saved generalist is the merge the search picked, and its score is the logged best
    generalist = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert _score(generalist)["loglik"] == pytest.approx(cb.history[0]["ram/search/best_score"], rel=1e-6)
    assert cb.history[0]["ram/loglik"] == pytest.approx(cb.history[0]["ram/search/best_score"], rel=1e-6)


def _zero(completions: list[str], **kwargs: object) -> list[float]:
    return [0.0 for _ in completions]


def test_two_agents_sharing_a_merged_dir_and_one_that_never_changed(tmp_path: Path) -> None:
    """Two GRPO runs, one merged_dir: each generalist saved under its agent's name, both kept. Agent "zero" has a
    reward that is always 0, so GRPO never moves its weights: each merge names it once (RAM+, the default, counts
    too, and stays silent: the callback's warning is the merge's one), and it adds nothing to the generalist."""
    store, shared = tmp_path / "store", tmp_path / "merged"
    callbacks = {}
    for agent, reward in (("zero", _zero), ("vowels", _vowels)):
        cb = RAMTrainerCallback(store, agent, snapshot_every=2, merge_every=2, evaluate=_score, merged_dir=shared)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _trainer(tmp_path / agent, reward, 2, cb).train()
        named = [w.message for w in caught if issubclass(w.category, ram_live.errors.UnchangedAgentWarning)]
        assert [w.agents for w in named] == [("zero",)], agent  # one merge, one warning
        assert str(named[0]).startswith(f"RAMTrainerCallback({agent!r}): agent 'zero' changed no entry of the base")
        assert cb.last_result.extra["unchanged"] == ["zero"] and cb.history[0]["ram/zero/density"] == 0.0
        callbacks[agent] = cb
    assert callbacks["vowels"].history[0]["ram/vowels/density"] > 0
    assert callbacks["zero"].saved == [str(shared / "zero" / "step-2")]
    assert callbacks["vowels"].saved == [str(shared / "vowels" / "step-2")]
    s = ram_live.SnapshotStore(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ram_live.errors.UnchangedAgentWarning)
        want = {
            "zero": ram_live.merge({"zero": s.open("zero", 2)}, base=s.base_source(), importance="stored"),
            "vowels": ram_live.merge(
                {"zero": s.open("zero", 2), "vowels": s.open("vowels", 2)}, base=s.base_source(), importance="stored"
            ),
        }
    base = s.base_source()
    for agent, tensors in want.items():
        saved = load_file(str(shared / agent / "step-2" / "model.safetensors"))
        assert set(saved) == set(tensors)
        for key, value in tensors.items():
            assert torch.equal(saved[key], value), (agent, key)
        if agent == "zero":  # its generalist is the base: it never changed
            for key, value in saved.items():
                assert torch.equal(value, base.get(key)), key
    # zero added nothing: the vowels generalist is the merge of vowels alone
    alone = ram_live.merge({"vowels": s.open("vowels", 2)}, base=s.base_source(), importance="stored")
    for key, value in want["vowels"].items():
        assert torch.equal(value, alone[key]), key


def test_grpo_logs_a_rewards_evaluation_in_trls_layout(tmp_path: Path) -> None:
    from ram_live.evaluate import rewards

    prompts = [{"prompt": p, "data_source": s} for p, s in (("ab", "x"), ("cd", "x"), ("ef", "y"))]
    evaluate = rewards(prompts, [_vowels, _spaces], tokenizer=_tokenizer(), max_new_tokens=4, samples=2)
    cb = RAMTrainerCallback(tmp_path / "store", "vowels", snapshot_every=2, merge_every=2, evaluate=evaluate)
    trainer = _trainer(tmp_path / "run", _vowels, 2, cb)
    cb.bind(trainer)
    with pytest.warns(SingleAgentWarning):
        trainer.train()
    logged = [h for h in trainer.state.log_history if "ram/agents" in h]
    assert len(logged) == 1
    got = logged[0]
    assert got["ram/eval_reward/mean@2"] == evaluate.metrics["reward"]  # the objective: the mean over the tasks
    flat = [r for pair in evaluate.sample_rewards for r in pair]  # TRL's eval_reward: over the completions
    assert got["ram/eval_reward"] == pytest.approx(sum(flat) / 6, abs=1e-12)
    assert got["ram/eval_tasks/x/prompts"] == 2.0 and got["ram/eval_tasks/y/prompts"] == 1.0
    assert got["ram/eval_tasks/y/mean@2"] == evaluate.tasks["y"] and got["ram/eval_tasks/y/mean@2/std"] == 0.0
    vowels = evaluate.function_rewards()["_vowels"]
    assert len(vowels) == 6 and got["ram/eval_rewards/_vowels/mean"] == pytest.approx(sum(vowels) / 6)
    assert "ram/eval_rewards/_spaces/std" in got and not any(k.startswith("ram/reward") for k in got)
    # reward_std and frac_reward_zero_std as GRPOTrainer computes them, with TRL's own nanstd
    from trl.trainer.utils import nanstd

    samples = torch.tensor(evaluate.sample_rewards, dtype=torch.float64)  # 3 prompts x 2 weighted rewards
    # (nanstd's Bessel factor count / (count - 1) is a float32 division: equal to about 1e-8)
    assert got["ram/eval_reward_std"] == pytest.approx(nanstd(samples.flatten()).item(), rel=1e-7)
    zero = torch.isclose(nanstd(samples, dim=1), torch.zeros(3, dtype=torch.float64)).double().mean().item()
    assert got["ram/eval_frac_reward_zero_std"] == pytest.approx(zero, abs=1e-12)


def test_a_merged_dir_in_the_store_or_a_file_is_refused_when_built(tmp_path: Path) -> None:
    store = tmp_path / "store"
    for merged_dir, said in ((store, "is the snapshot store"), (store / "generalists", "is the snapshot store")):
        with pytest.raises(ram_live.ConfigError, match=rf"RAMTrainerCallback\('a'\): merged_dir=.* {said}"):
            RAMTrainerCallback(store, "a", merged_dir=merged_dir)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ram_live.ConfigError, match="exists and is not a folder"):
        RAMTrainerCallback(store, "a", merged_dir=tmp_path / "file")
    assert not store.exists()  # refused before anything is written
