"""ColocatedVLLMGenerate on an engine that is already running, as TRL's colocate mode holds one
(``trainer.vllm_generation.llm``): the real vLLM engine of the session, held by a stand-in for the trainer (TRL's
colocate mode itself cannot run on vLLM's CPU build, and TRL is not in this environment). The completions equal the
Hugging Face path's; a sleeping engine is woken for the evaluation, put back to sleep after it and its weights marked
as gone (TRL then pushes the policy's again); a trainer without a colocated engine is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ram_live.errors import ConfigError
from ram_live.evaluate import rewards
from ram_live.integrations.trl_vllm import ColocatedVLLMGenerate
from vllm_helpers import PROMPTS, agents, base_state, count_a


class _Recording:
    """The running engine, recording the sleep calls made on it (sleeping itself is a GPU feature of vLLM)."""

    def __init__(self, llm):
        self.llm, self.calls = llm, []

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def wake_up(self, *args, **kwargs):
        self.calls.append("wake_up")

    def sleep(self, level=1):
        self.calls.append(f"sleep({level})")


def _trainer(llm, mode="colocate", sleep=False):
    generation = SimpleNamespace(mode=mode, llm=llm, enable_sleep_mode=sleep, _llm_weights_sleeping=False)
    return SimpleNamespace(use_vllm=True, vllm_generation=generation)


def test_the_generalist_is_evaluated_on_the_trainer_s_engine(base_dir, engine):
    common = dict(tokenizer=str(base_dir), model=str(base_dir), dtype="float32", max_new_tokens=12)
    colocated = ColocatedVLLMGenerate(base_dir)
    vl = rewards(PROMPTS, count_a, generate=colocated, **common)
    with pytest.raises(ConfigError, match="bind\\(trainer\\) first"):
        vl(str(base_dir))
    recording = _Recording(engine.llm)
    trainer = _trainer(recording, sleep=True)
    colocated.bind(trainer)
    hf = rewards(PROMPTS, count_a, **common)
    candidate = agents(base_state(base_dir))["coder"]
    assert vl(candidate) == hf(candidate) and vl.completions == hf.completions
    assert recording.calls == ["wake_up", "sleep(2)"]
    assert trainer.vllm_generation._llm_weights_sleeping is True


def test_a_trainer_without_a_colocated_engine_is_refused(base_dir, engine):
    colocated = ColocatedVLLMGenerate(base_dir)
    with pytest.raises(ConfigError, match="does not generate with vLLM"):
        colocated.bind(SimpleNamespace(use_vllm=False))
    with pytest.raises(ConfigError, match="runs in 'server' mode, not 'colocate'"):
        colocated.bind(_trainer(None, mode="server"))
