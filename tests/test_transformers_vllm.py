"""RAMTrainerCallback with TRL's GRPOTrainer generating through vLLM: a merge's evaluation pushes the generalist to
vLLM at the merge's step; the next rollout, at that same step, must sample the agent's weights again (TRL pushes
weights only when ``state.global_step != _last_loaded_step``).

Real: TRL's GRPOTrainer (its training loop, ``_generate`` / ``_generate_single_turn`` with the ``_last_loaded_step``
check, ``evaluate()``), TRL's ``VLLMGeneration`` (``sync_weights``, ``generate``: the server and colocate code paths,
``_iter_named_params``), the tiny Qwen2 and character tokenizer of test_transformers_callback, the callback and the
store. Faked: vLLM itself, which is not installed: the trainer is built with ``use_vllm=False``, then given what
TRL's ``__init__`` sets with ``use_vllm=True`` (``use_vllm``, ``vllm_mode``, ``vllm_generation`` — a real
``VLLMGeneration`` whose ``_init_vllm``, which would start vLLM, is skipped — and ``_last_loaded_step = -1``); the
server mode's ``vllm_client`` and the colocate mode's ``llm`` (and ``SamplingParams``) are recording fakes that keep
the tensors pushed to them and answer each generate with seeded random tokens (logprobs -1, so the importance
sampling correction is off), recording a digest of the weights they hold and one of the model's weights then."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
vllm_generation = pytest.importorskip("trl.generation.vllm_generation")
from transformers import TrainerControl, TrainerState  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from ram_live import RAMSchedule  # noqa: E402
from ram_live.errors import ConfigError  # noqa: E402
from ram_live.integrations._trl_weights import sharding_refusal  # noqa: E402
from ram_live.integrations.transformers import RAMTrainerCallback  # noqa: E402
from test_transformers_callback import VOCAB, _model, _tokenizer, _vowels  # noqa: E402


def _digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class _Engine:
    """The fake vLLM's weights; each generation records (step, train/eval, digest held, digest of the model now)."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer, self.weights, self.rollouts = trainer, {}, []
        self.rng = random.Random(0)

    def load(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, t in named:
            self.weights[name] = t.detach().clone()

    def completions(self, count: int, length: int) -> list[list[int]]:
        t = self.trainer
        now = _digest(t.vllm_generation._iter_named_params())  # what a push would send now: the model's weights
        kind = "train" if t.model.training else "eval"
        self.rollouts.append((t.state.global_step, kind, _digest(self.weights.items()), now))
        return [[self.rng.randrange(3, len(VOCAB)) for _ in range(length)] for _ in range(count)]


class _Client:
    """TRL's VLLMClient as server mode calls it."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    def update_named_params(self, metadata: Any, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.load(named)

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, prompts: list[list[int]], n: int = 1, max_tokens: int = 4, **kwargs: Any) -> dict[str, Any]:
        comps = self.engine.completions(len(prompts) * n, max_tokens)
        return {"prompt_ids": prompts, "completion_ids": comps, "logprobs": [[[-1.0] for _ in c] for c in comps]}


class _LLM:
    """vllm.LLM as colocate mode calls it."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=engine.load))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)),
            model_config=SimpleNamespace(max_model_len=64),
        )

    def reset_prefix_cache(self) -> None:
        pass

    def generate(
        self, prompts: list[dict[str, Any]], sampling_params: dict[str, Any], use_tqdm: bool = False
    ) -> list[Any]:
        comps = self.engine.completions(len(prompts), sampling_params["max_tokens"])
        return [
            SimpleNamespace(
                prompt_token_ids=p["prompt_token_ids"],
                outputs=[
                    SimpleNamespace(token_ids=c, logprobs=[{t: SimpleNamespace(rank=1, logprob=-1.0)} for t in c])
                ],
            )
            for p, c in zip(prompts, comps)
        ]


def _vllm_trainer(
    out: Path, mode: str, callback: RAMTrainerCallback, monkeypatch: pytest.MonkeyPatch
) -> tuple[GRPOTrainer, _Engine]:
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=3,
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        vllm_importance_sampling_correction=False,
    )
    prompts = datasets.Dataset.from_dict({"prompt": ["ab", "cd", "ef", "gh"] * 8})
    trainer = GRPOTrainer(
        model=_model(),
        reward_funcs=_vowels,
        args=args,
        train_dataset=prompts,
        eval_dataset=prompts.select(range(4)),
        processing_class=_tokenizer(),
        callbacks=[callback],
    )
    monkeypatch.setattr(vllm_generation.VLLMGeneration, "_init_vllm", lambda self: None)
    monkeypatch.setattr(vllm_generation, "SamplingParams", lambda **kw: kw, raising=False)
    engine = _Engine(trainer)
    gen = vllm_generation.VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=trainer.processing_class,
        mode=mode,
        max_completion_length=4,
        logprobs=0,
    )
    if mode == "server":
        gen.vllm_client = _Client(engine)
    else:
        gen.llm = _LLM(engine)
    # what GRPOTrainer.__init__ sets with use_vllm=True (the trainer reads them at every generation)
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation, trainer._last_loaded_step = True, mode, gen, -1
    return trainer, engine


@pytest.fixture(autouse=True)
def _quiet() -> None:
    transformers.logging.set_verbosity_error()


@pytest.mark.parametrize("mode, how", [("server", "trainer"), ("colocate", "callable")])
def test_rollout_after_the_merge_samples_the_agent_not_the_generalist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, how: str
) -> None:
    store = tmp_path / "store"
    other = _model()  # a second agent: its snapshot at step 1 moves the generalist away from this run's agent
    schedule = RAMSchedule(store, "spaces")
    schedule.attach(other)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn_like(p))
    schedule.snapshot(other, 1)
    schedule.flush()

    holder: dict[str, GRPOTrainer] = {}

    def through_trainer(model: torch.nn.Module) -> dict[str, float]:  # an evaluate= that generates via vLLM
        return {"reward": holder["t"].evaluate(metric_key_prefix="mine")["eval_reward"]}  # TRL logs eval_*

    cb = RAMTrainerCallback(
        store,
        "vowels",
        snapshot_every=2,
        merge_every=2,
        importance=None,
        evaluate="trainer" if how == "trainer" else through_trainer,
    )
    trainer, engine = _vllm_trainer(tmp_path / "run", mode, cb, monkeypatch)
    holder["t"] = cb.bind(trainer).trainer
    trainer.train()

    assert [h["step"] for h in cb.history] == [2.0]
    evals = [r for r in engine.rollouts if r[1] == "eval"]
    after = [r for r in engine.rollouts if r[1] == "train" and r[0] == 2]
    assert evals and {r[0] for r in evals} == {2}  # the merge's evaluation generated through vLLM at step 2 ...
    assert evals[0][2] == evals[0][3]  # ... with the generalist pushed
    assert after, engine.rollouts  # the rollout right after the swap-back, at the merge's step
    assert after[0][3] != evals[0][3]  # the agent's weights are not the generalist's: the test tells them apart
    assert after[0][2] == after[0][3], "the rollout after the merge sampled the generalist, not the agent"
    for step, kind, held, now in engine.rollouts:  # every rollout sampled the weights the model held then
        assert held == now, (step, kind)


def _begin(cb: RAMTrainerCallback, args: Any, model: torch.nn.Module | None = None) -> None:
    cb.on_train_begin(args, TrainerState(), TrainerControl(), model=model if model is not None else _model())


def test_vllm_trainers_must_be_bound_and_keep_the_sync_marker(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"bind it \(callback.bind\(trainer\)\)"):
        _begin(RAMTrainerCallback(tmp_path / "s", "a", merge_every=2), SimpleNamespace(use_vllm=True))
    cb = RAMTrainerCallback(tmp_path / "s", "b", merge_every=2, trainer=SimpleNamespace(use_vllm=True))
    with pytest.raises(ConfigError, match="no '_last_loaded_step'"):
        _begin(cb, SimpleNamespace(use_vllm=False))
    cb.trainer._last_loaded_step = 3  # the marker is there: accepted, and a merge resets it
    _begin(cb, SimpleNamespace())
    cb._force_vllm_resync()
    assert cb.trainer._last_loaded_step == -1


def test_zero3_and_fsdp1_models_are_refused(tmp_path: Path) -> None:
    model = _model()
    assert sharding_refusal(model) is None
    model.lm_head.weight.ds_id = 0  # DeepSpeed ZeRO-3's mark of a partitioned parameter
    with pytest.raises(ConfigError, match="ZeRO-3"):
        _begin(RAMTrainerCallback(tmp_path / "s", "a"), SimpleNamespace(), model)
    wrapped = torch.nn.Sequential(type("FullyShardedDataParallel", (torch.nn.Module,), {})())
    assert "FSDP1" in (sharding_refusal(wrapped) or "")
