"""``ram/eval_reward`` means what TRL's ``eval_reward`` means: the mean over the completions of the weighted sum of
the reward functions, whatever the evaluation's metric (the objective keeps its own key, ``ram/eval_reward/<metric>``).
Checked by hand and against a real ``GRPOTrainer.evaluate()`` on the same completions (tiny Qwen2 built from a
config, a character tokenizer built here: no downloads)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from ram_live.evaluate import rewards  # noqa: E402
from ram_live.integrations.metrics import evaluation_metrics  # noqa: E402
from test_transformers_callback import _model, _tokenizer  # noqa: E402

PROMPTS = ["ab", "cd", "ef", "gh"]
WEIGHTS = [1.0, 0.5, -0.25]


def vowels(completions: list[str], **kwargs: object) -> list[float]:
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


def letters(completions: list[str], **kwargs: object) -> list[float]:
    return [float(len(c.replace(" ", ""))) for c in completions]


def spaces_or_none(completions: list[str], **kwargs: object) -> list[float | None]:
    """None (not scored, TRL's NaN) for a completion without a space."""
    return [float(c.count(" ")) if " " in c else None for c in completions]


FUNCS = [vowels, letters, spaces_or_none]


def _by_hand(completions: list[str]) -> list[float]:
    """Each completion's weighted reward as TRL sums it (``nansum``: a None reward counts as nothing)."""
    out = []
    for c in completions:
        given = [(w, f([c])[0]) for w, f in zip(WEIGHTS, FUNCS)]
        out.append(sum(w * r for w, r in given if r is not None))
    return out


def test_eval_reward_is_the_mean_weighted_reward_not_the_objective():
    completions = ["a a", "bb", "eee", "", "x y", "ou", "zz", "i"]  # prompt-major: 4 prompts x 2 samples
    evaluate = rewards(
        PROMPTS, FUNCS, tokenizer=_tokenizer(), reward_weights=WEIGHTS, samples=2, metric="pass@2", pass_threshold=2.0
    )
    objective = evaluate.score(completions)
    weighted = _by_hand(completions)
    passed = [max(weighted[2 * p : 2 * p + 2]) >= 2.0 for p in range(4)]
    assert objective == pytest.approx(sum(passed) / 4, abs=1e-12)
    trl = evaluation_metrics(evaluate, "trl")
    assert trl["ram/eval_reward/pass@2"] == objective
    assert trl["ram/eval_reward"] == pytest.approx(sum(weighted) / 8, abs=1e-12)
    assert not math.isclose(trl["ram/eval_reward"], objective)  # the two keys mean different things here
    mean = sum(weighted) / 8
    assert trl["ram/eval_reward_std"] == pytest.approx(math.sqrt(sum((w - mean) ** 2 for w in weighted) / 7), abs=1e-12)


def test_eval_reward_equals_grpo_trainers_own_on_the_same_completions(tmp_path: Path):
    """GRPOTrainer.evaluate() generates and scores the eval set; the same completions scored by ``rewards()`` give
    ``ram/eval_reward``, ``ram/eval_reward_std`` and ``ram/eval_rewards/<fn>/mean`` equal to TRL's keys."""
    transformers.logging.set_verbosity_error()
    seen: list[tuple[str, str]] = []

    def recording(completions: list[str], prompts: list[str], **kwargs: object) -> list[float]:
        seen.extend(zip(prompts, completions))
        return vowels(completions)

    recording.__name__ = "vowels"
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=2,
        max_completion_length=6,
        reward_weights=WEIGHTS,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    data = datasets.Dataset.from_dict({"prompt": PROMPTS})
    trainer = GRPOTrainer(
        model=_model(),
        reward_funcs=[recording, letters, spaces_or_none],
        args=args,
        train_dataset=data,
        eval_dataset=data,
        processing_class=_tokenizer(),
    )
    theirs = trainer.evaluate()
    assert len(seen) == 8  # one eval batch: 4 prompts x 2 generations
    by_prompt: dict[str, list[str]] = {}
    for prompt, completion in seen:
        by_prompt.setdefault(prompt, []).append(completion)
    completions = [c for p in PROMPTS for c in by_prompt[p]]
    evaluate = rewards(
        PROMPTS, FUNCS, tokenizer=_tokenizer(), reward_weights=WEIGHTS, samples=2, metric="pass@2", pass_threshold=2.0
    )
    evaluate.score(completions)
    ours = evaluation_metrics(evaluate, "trl")
    # TRL computes in float32: equal to about 1e-6
    assert ours["ram/eval_reward"] == pytest.approx(theirs["eval_reward"], rel=1e-6, abs=1e-6)
    assert ours["ram/eval_reward_std"] == pytest.approx(theirs["eval_reward_std"], rel=1e-6, abs=1e-6)
    assert ours["ram/eval_frac_reward_zero_std"] == pytest.approx(theirs["eval_frac_reward_zero_std"], abs=1e-12)
    for name in ("vowels", "letters"):
        for stat in ("mean", "std"):
            key = f"eval_rewards/{name}/{stat}"
            assert ours[f"ram/{key}"] == pytest.approx(theirs[key], rel=1e-6, abs=1e-6), key
    key = "eval_rewards/spaces_or_none/mean"  # scored only where a completion holds a space (NaN where none does)
    assert ours[f"ram/{key}"] == pytest.approx(theirs[key], rel=1e-6, abs=1e-6, nan_ok=True)
    assert ours["ram/eval_reward"] == pytest.approx(sum(_by_hand(completions)) / 8, abs=1e-12)
