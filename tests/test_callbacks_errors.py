"""Issue 44: a merge never ends the run it watches. With the real transformers ``Trainer`` (the tiny Qwen2 and
character tokenizer of test_transformers_callback, no downloads) and the real Lightning ``Trainer``: an evaluation
(a reward function of ``rewards()``) failing at the second merge is a ``MergeFailedWarning`` and ``ram/errors``,
training reaches ``max_steps`` and the next merge succeeds; ``on_error="raise"`` ends training there; what can be
checked before the first step (a broken reward function, an unknown search family, a race with a plain
evaluation, a ``merged_dir`` that cannot be written) raises at step 0, before any snapshot."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ram_live import SnapshotStore  # noqa: E402
from ram_live.errors import ConfigError, EvaluationError, MergeFailedWarning  # noqa: E402
from ram_live.evaluate import rewards  # noqa: E402
from ram_live.integrations.transformers import RAMTrainerCallback  # noqa: E402
from ram_live.training.failures import check_on_error  # noqa: E402
from ram_live.training.search import SearchSetting  # noqa: E402
from test_transformers_callback import VOCAB, _model, _score, _tokenizer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

STEPS = 6


class Flaky(transformers.TrainerCallback):
    """A reward function (the vowels of each completion) that raises while the trainer is at one of the steps
    ``fail_at`` (0: the pre-flight); registered before the RAM callback, it reads the step at each step's end."""

    __name__ = "flaky"

    def __init__(self, *fail_at: int) -> None:
        self.fail_at, self.step, self.calls = set(fail_at), 0, []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step

    def __call__(self, prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        self.calls.append(self.step)
        if self.step in self.fail_at:
            raise ValueError(f"reward service unreachable at step {self.step}")
        return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


def _evaluation(reward: Any) -> Any:
    return rewards(["ab", "cd", "ea", "io"], reward, tokenizer=_tokenizer(), max_new_tokens=2, batch_size=8)


def _trainer(
    out: Path, callback: RAMTrainerCallback, steps: int = STEPS, lr: float = 1e-2, before: Any = None
) -> transformers.Trainer:
    rows = []
    for text in ["hello world", "abc def", "the cat", "a dog ran", "sun and moon", "big red box"]:
        ids = [VOCAB[c] for c in text][:8] + [0] * (8 - len(text[:8]))
        rows.append(
            {"input_ids": ids, "labels": [t if t else -100 for t in ids], "attention_mask": [int(t > 0) for t in ids]}
        )
    args = transformers.TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        max_steps=steps,
        learning_rate=lr,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    callbacks = [callback] if before is None else [before, callback]
    return transformers.Trainer(model=_model(), args=args, train_dataset=rows, callbacks=callbacks)


def _failures(caught: list[warnings.WarningMessage]) -> list[MergeFailedWarning]:
    return [w.message for w in caught if isinstance(w.message, MergeFailedWarning)]


def test_a_reward_function_failing_at_the_second_merge_is_a_warning_and_training_goes_on(tmp_path: Path) -> None:
    transformers.logging.set_verbosity_error()
    reward = Flaky(4)
    cb = RAMTrainerCallback(
        tmp_path / "store",
        "coder",
        snapshot_every=2,
        merge_every=2,
        evaluate=_evaluation(reward),
        merged_dir=tmp_path / "merged",
    )
    trainer = _trainer(tmp_path / "run", cb, before=reward)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert trainer.state.global_step == STEPS
    assert sorted(set(reward.calls)) == [0, 2, 4, 6]  # the pre-flight (the base's prompts), then each merge
    failed = _failures(caught)
    assert len(failed) == 1
    w = failed[0]
    assert (w.step, w.agent, w.what) == (4, "coder", "merge")
    assert w.error.startswith("EvaluationError:") and "reward service unreachable at step 4" in w.error
    assert "step 4" in str(w) and "'coder'" in str(w) and "\n" not in w.error
    # the count is logged at the failed step; the merges before and after it are logged as ever
    logged = {e["step"]: e for e in trainer.state.log_history if any(k.startswith("ram/") for k in e)}
    assert logged[4]["ram/errors"] == 1.0 and not any("reward" in k for k in logged[4])
    assert all(any("reward" in k for k in logged[n]) for n in (2, 6))  # the evaluation's keys, whatever the layout
    assert [h["step"] for h in cb.history] == [2.0, 6.0]
    assert cb.schedule.errors == 1 and cb.schedule.last_error["step"] == 4
    # the failed merge saved nothing; the next one did; the snapshots of every step are there
    assert sorted(p.name for p in (tmp_path / "merged" / "coder").iterdir()) == ["step-2", "step-6"]
    assert SnapshotStore(tmp_path / "store").steps("coder") == [2, 4, 6]
    # the model trained on its own weights: the generalist was swapped out after the failed evaluation
    assert cb.state()["attributes"]["ram_state"]["schedule"]["errors"] == 1


def test_on_error_raise_ends_training_at_the_failing_merge(tmp_path: Path) -> None:
    transformers.logging.set_verbosity_error()
    cb = RAMTrainerCallback(
        tmp_path / "store",
        "coder",
        snapshot_every=2,
        merge_every=2,
        evaluate=_evaluation(reward := Flaky(4)),
        on_error="raise",
    )
    trainer = _trainer(tmp_path / "run", cb, before=reward)
    with pytest.raises(EvaluationError, match="reward service unreachable"):
        trainer.train()
    assert trainer.state.global_step == 4 and [h["step"] for h in cb.history] == [2.0]


def test_on_error_is_one_option_checked_when_built(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="on_error must be 'warn'"):
        RAMTrainerCallback(tmp_path / "store", "coder", on_error="ignore")
    with pytest.raises(ConfigError, match="ram.on_error"):
        check_on_error(None, "ram.on_error")
    assert check_on_error("raise") == "raise"


def _refused_at_step_zero(tmp_path: Path, cb: RAMTrainerCallback, error: type, match: str) -> None:
    trainer = _trainer(tmp_path / "run", cb)
    with pytest.raises(error, match=match) as info:
        trainer.train()
    assert "pre-flight" in str(info.value) and "RAMTrainerCallback('coder')" in str(info.value)
    assert trainer.state.global_step == 0
    assert SnapshotStore(tmp_path / "store").steps("coder") == []  # nothing written but the base


def test_preflight_scores_the_base_on_a_few_prompts_a_broken_reward_function_fails_at_step_0(tmp_path: Path) -> None:
    reward = Flaky(0, 2)
    cb = RAMTrainerCallback(tmp_path / "store", "coder", snapshot_every=2, merge_every=2, evaluate=_evaluation(reward))
    _refused_at_step_zero(tmp_path, cb, EvaluationError, "reward service unreachable")
    assert set(reward.calls) == {0}


def test_preflight_refuses_an_unknown_search_family(tmp_path: Path) -> None:
    search = SearchSetting(evaluate=_score, metric="loglik", space=["bogus_family"])
    cb = RAMTrainerCallback(tmp_path / "store", "coder", merge_every=2, search=search)  # accepted when built
    _refused_at_step_zero(tmp_path, cb, ConfigError, "unknown family 'bogus_family'")


def test_preflight_refuses_a_race_with_a_plain_evaluation(tmp_path: Path) -> None:
    search = SearchSetting(evaluate=_score, metric="loglik", fidelity="halving", budget="20x")
    cb = RAMTrainerCallback(tmp_path / "store", "coder", merge_every=2, search=search)
    _refused_at_step_zero(tmp_path, cb, ConfigError, "halving")


def test_preflight_refuses_a_merged_dir_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("not a folder")
    cb = RAMTrainerCallback(tmp_path / "store", "coder", merge_every=2, merged_dir=tmp_path / "a_file" / "merged")
    _refused_at_step_zero(tmp_path, cb, ConfigError, "merged_dir=.*cannot be saved")


def test_preflight_refuses_evaluate_trainer_without_the_trainer(tmp_path: Path) -> None:
    cb = RAMTrainerCallback(tmp_path / "store", "coder", merge_every=2, evaluate="trainer")
    _refused_at_step_zero(tmp_path, cb, ConfigError, r"callback.bind\(trainer\)")


def test_keyboard_interrupt_is_never_swallowed(tmp_path: Path) -> None:
    def interrupted(model: Any) -> dict[str, float]:
        raise KeyboardInterrupt

    cb = RAMTrainerCallback(tmp_path / "store", "coder", merge_every=2, evaluate=interrupted)
    trainer = _trainer(tmp_path / "run", cb)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.state.global_step == 2 and cb.schedule.errors == 0


def test_a_failed_evaluation_restores_the_agent_weights(tmp_path: Path) -> None:
    seen: list[dict[str, torch.Tensor]] = []

    def breaks(model: Any) -> dict[str, float]:
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        raise RuntimeError("boom")

    class Before(transformers.TrainerCallback):  # the weights just before the RAM callback's merge at step 2
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if state.global_step == 2:
                self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    other = RAMTrainerCallback(tmp_path / "store", "other", snapshot_every=2)  # a second agent: a generalist
    _trainer(tmp_path / "other", other, steps=2, lr=5e-2).train()  # that differs from this run's weights
    before = Before()
    cb = RAMTrainerCallback(tmp_path / "store", "coder", merge_every=2, evaluate=breaks)
    trainer = _trainer(tmp_path / "run", cb, steps=2)
    trainer.add_callback(before)
    trainer.callback_handler.callbacks.sort(key=lambda c: c is cb)  # Before runs first
    with pytest.warns(MergeFailedWarning, match="RuntimeError: boom"):
        trainer.train()
    after = trainer.model.state_dict()
    assert len(seen) == 1 and all(torch.equal(before.weights[k], after[k]) for k in after)
    assert any(not torch.equal(seen[0][k], after[k]) for k in after)  # the evaluation saw the generalist
