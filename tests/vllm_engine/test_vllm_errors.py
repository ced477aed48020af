"""What VLLMGenerate refuses, with the library's errors: settings vLLM cannot honour (when the evaluation is
built), candidates whose keys or shapes do not fit the engine's model (naming the candidate, before a tensor is
written: the engine still generates as the last candidate it took), folders it cannot start from."""

from __future__ import annotations

import json

import pytest
import torch

from ram_live.errors import ConfigError, EvaluationError
from ram_live.evaluate import VLLMGenerate, rewards
from vllm_helpers import PROMPTS, base_state, count_a


def _ev(base_dir, engine, **kw):
    kw.setdefault("max_new_tokens", 8)
    return rewards(PROMPTS, count_a, tokenizer=str(base_dir), generate=engine, **kw)


@pytest.mark.parametrize("temperature", [2.5, 0.005])
def test_a_temperature_vllm_cannot_sample_at_is_refused_when_the_evaluation_is_built(base_dir, engine, temperature):
    with pytest.raises(ConfigError, match=rf"temperature={temperature} with generate=VLLMGenerate.*\[0.01, 2.0\]"):
        _ev(base_dir, engine, samples=2, temperature=temperature)
    _ev(base_dir, engine, temperature=temperature)  # greedy: the temperature is not used


def test_settings_vllm_s_sampling_params_refuse_are_a_config_error(base_dir, engine):
    import vllm.envs

    limit = vllm.envs.VLLM_MAX_N_SEQUENCES  # read once the engine runs: what it holds to
    with pytest.raises(ConfigError, match=f"vLLM refuses these generation settings: n must be at most {limit}"):
        _ev(base_dir, engine, samples=limit + 1)
    _ev(base_dir, engine, samples=limit)


def test_candidates_that_do_not_fit_the_engine_s_model_name_the_candidate(base_dir, engine, tmp_path):
    base = base_state(base_dir)
    ev = _ev(base_dir, engine)
    before = ev(base), list(ev.completions)
    key = "model.layers.0.mlp.up_proj.weight"
    bad = {
        "lacks the engine model's keys \\['model.layers.0.mlp.up_proj.weight'\\]": {
            k: v for k, v in base.items() if k != key
        },
        "has keys the engine's model .* lacks: \\['model.extra.weight'\\]": {**base, "model.extra.weight": base[key]},
        f"holds '{key}' of shape \\[256, 64\\]; the engine's model .* has \\[256, 128\\]": {
            **base,
            key: base[key][:, :64],
        },
    }
    for message, state in bad.items():
        scaled = {k: v * 1.5 if v.is_floating_point() else v for k, v in state.items()}  # else another model
        with pytest.raises(EvaluationError, match="VLLMGenerate: the candidate state dict " + message):
            ev(scaled)
        assert (ev(base), ev.completions) == before  # nothing was written
    from safetensors.torch import save_file

    folder = tmp_path / "cand"
    folder.mkdir()
    save_file({k: v for k, v in base.items() if k != key}, folder / "model.safetensors")
    with pytest.raises(EvaluationError, match=f"the candidate folder {folder} lacks the engine model's keys"):
        ev(str(folder))
    with pytest.raises(EvaluationError, match="cannot evaluate a int"):
        ev(3)


def test_a_module_with_tied_weights_passes_its_tied_key(base_dir, engine):
    from vllm_helpers import module_with

    m = module_with(base_state(base_dir))
    sd = m.state_dict()
    sd["model.tied_copy.weight"] = sd["lm_head.weight"]  # the same tensor under another key: tied, not sent
    ev = _ev(base_dir, engine)
    assert ev(sd) == ev(m)


def test_folders_and_options_it_cannot_start_from(base_dir, tmp_path):
    with pytest.raises(ConfigError, match="is not a Hugging Face model folder"):
        VLLMGenerate(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match="cannot read the weights of"):
        VLLMGenerate(tmp_path)
    with pytest.raises(ConfigError, match="kv_cache_bytes must be an int >= 1"):
        VLLMGenerate(base_dir, kv_cache_bytes=0)
    with pytest.raises(ConfigError, match="dtype must be a floating torch dtype"):
        VLLMGenerate(base_dir, dtype="int8")
    with pytest.raises(ConfigError, match="generate='vllm' starts vLLM from the base model's Hugging Face folder"):
        rewards(PROMPTS, count_a, tokenizer=str(base_dir), generate="vllm")
    with pytest.raises(ConfigError, match="must be a callable fn\\(merged, prompts, settings, seeds\\) or 'vllm'"):
        rewards(PROMPTS, count_a, tokenizer=str(base_dir), generate="sglang")
    assert VLLMGenerate(base_dir, dtype=torch.float16).dtype == torch.float16
