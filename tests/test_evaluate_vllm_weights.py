"""ram_live.evaluate.vllm_weights: a candidate's tensors as VLLMGenerate writes them into vLLM (no vLLM needed),
checked against the engine model's checkpoint first, each refusal naming the candidate."""

from __future__ import annotations

import pytest
import torch

from ram_live.errors import ConfigError, EvaluationError
from ram_live.evaluate.vllm_weights import Layout, candidate_weights

transformers = pytest.importorskip("transformers")


def _folder(tmp_path, tied: bool):
    cfg = transformers.LlamaConfig(
        vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path / ("tied" if tied else "untied")
    model.save_pretrained(folder)
    return folder, model


def _pairs(merged, layout):
    return {k: v for k, v in candidate_weights(merged, layout)}


def test_every_form_gives_the_checkpoint_s_tensors_in_its_names(tmp_path):
    folder, model = _folder(tmp_path, tied=False)
    layout = Layout(folder)
    sd = model.state_dict()
    for merged in (model, sd, str(folder), folder):
        got = _pairs(merged, layout)
        assert sorted(got) == sorted(layout.shapes) == sorted(sd)
        assert all(torch.equal(got[k], sd[k]) for k in got)
    wrapper = torch.nn.Module()
    wrapper.policy = model  # a module holding the generate-capable model
    assert sorted(_pairs(wrapper, layout)) == sorted(sd)


def test_tied_output_layers_pass_and_are_not_sent(tmp_path):
    folder, model = _folder(tmp_path, tied=True)
    layout = Layout(folder)
    assert "lm_head.weight" not in layout.shapes and layout.tied == {"lm_head.weight"}
    cloned = {k: v.clone() for k, v in model.state_dict().items()}  # no longer tied by storage: by the config
    for merged in (model, model.state_dict(), cloned):
        assert sorted(_pairs(merged, layout)) == sorted(layout.shapes)
    untied = Layout(_folder(tmp_path, tied=False)[0])
    extra = {
        **{k: v for k, v in cloned.items() if k in untied.shapes},
        "model.extra.weight": cloned["lm_head.weight"] + 1,
    }
    with pytest.raises(EvaluationError, match=r"the candidate state dict has keys the engine's model .* lacks"):
        candidate_weights(extra, untied)


def test_candidates_that_do_not_fit_are_refused_naming_them_before_a_tensor_is_read(tmp_path):
    folder, model = _folder(tmp_path, tied=False)
    layout = Layout(folder)
    sd = dict(model.state_dict())
    key = "model.layers.0.mlp.up_proj.weight"
    with pytest.raises(EvaluationError, match=rf"the candidate state dict lacks the engine model's keys \['{key}'\]"):
        candidate_weights({k: v for k, v in sd.items() if k != key}, layout)
    with pytest.raises(EvaluationError, match=rf"holds '{key}' of shape \[128, 32\]; .* has \[128, 64\]"):
        candidate_weights({**sd, key: sd[key][:, :32]}, layout)
    with pytest.raises(EvaluationError, match=f"holds '{key}' on the meta device"):
        candidate_weights({**sd, key: torch.empty(128, 64, device="meta")}, layout)
    other = tmp_path / "other"
    other.mkdir()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items() if k != key}, other / "model.safetensors")
    with pytest.raises(EvaluationError, match=f"the candidate folder {other} lacks the engine model's keys"):
        candidate_weights(str(other), layout)
    with pytest.raises(EvaluationError, match="cannot read the candidate folder"):
        candidate_weights(str(tmp_path / "missing"), layout)
    with pytest.raises(EvaluationError, match="cannot evaluate a list"):
        candidate_weights([1], layout)
    with pytest.raises(ConfigError, match="is not a Hugging Face model folder"):
        Layout(other)
