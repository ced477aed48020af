"""VLLMGenerate against the Hugging Face path, with the real vLLM (CPU build) on a tiny float32 Llama: greedy
completions and scores equal token for token on the base, on merges made with ram_live (handed in as a module, a
state dict, a folder and a cached id), and on the base again after them; sampled runs repeat; a prompt subset
scores as in the full set."""

from __future__ import annotations

import pickle

import pytest
import torch

from ram_live import merge
from ram_live.errors import ConfigError
from ram_live.evaluate import VLLMGenerate, rewards
from vllm_helpers import PROMPTS, agents, base_state, count_a, module_with

MAX_NEW = 16


def _pair(base_dir, engine, **kw):
    """The same evaluation twice: Hugging Face generate (the base folder loaded in float32) and the engine."""
    common = dict(tokenizer=str(base_dir), model=str(base_dir), dtype="float32", max_new_tokens=MAX_NEW, **kw)
    return rewards(PROMPTS, count_a, **common), rewards(PROMPTS, count_a, generate=engine, **common)


def _same(hf, vl, merged_hf, merged_vl=None):
    score_hf, score_vl = hf(merged_hf), vl(merged_hf if merged_vl is None else merged_vl)
    assert vl.completions == hf.completions
    assert vl.per_prompt == hf.per_prompt
    assert score_vl == score_hf
    return list(hf.completions)


@pytest.fixture(scope="module")
def candidates(base_dir, tmp_path_factory):
    base = base_state(base_dir)
    found = agents(base)
    out = {
        "ram_plus": merge(found, base=base, method="ram_plus"),
        "ties": merge(found, base=base, method="ties", density=0.5),
    }
    folder = tmp_path_factory.mktemp("merged") / "ram"
    merge(found, base=str(base_dir), method="ram", out=folder)
    return base, out, folder


def test_greedy_completions_equal_the_hugging_face_path_on_the_base(base_dir, engine):
    hf, vl = _pair(base_dir, engine)
    texts = _same(hf, vl, str(base_dir))
    assert len(set(texts)) > 3 and any(len(t) < MAX_NEW for t in texts)  # different texts, some ended by EOS


def test_merged_candidates_in_every_form_then_the_base_again(base_dir, engine, candidates, tmp_path, monkeypatch):
    base, merged, folder = candidates
    hf, vl = _pair(base_dir, engine)
    on_base = _same(hf, vl, str(base_dir))
    seen = []
    for name, state in merged.items():
        seen.append(_same(hf, vl, state))  # a state dict
        assert _same(hf, vl, module_with(state)) == seen[-1]  # a module
    seen.append(_same(hf, vl, str(folder)))  # a folder written by merge(out=)
    from test_hub import add_to_cache

    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    add_to_cache(tmp_path / "hub", "org/merged", files)
    assert _same(hf, vl, str(folder), "org/merged") == seen[-1]  # a cached id
    assert all(s != on_base for s in seen)  # each candidate generates something else: the swap happened
    assert seen[0] != seen[1]
    assert _same(hf, vl, base) == on_base  # the base again, as a state dict
    assert _same(hf, vl, str(base_dir)) == on_base


def test_stop_strings_end_tokens_and_chat_prompts_as_the_hugging_face_path(base_dir, engine, candidates):
    _, merged, _ = candidates
    for kw in ({"stop": ["a", "e"]}, {"stop": "e", "include_stop": True}, {"eos_token_id": [VOCAB_Z]}):
        hf, vl = _pair(base_dir, engine, **kw)
        texts = _same(hf, vl, merged["ram_plus"])
        if "stop" in kw and not kw.get("include_stop"):
            assert all("a" not in t and "e" not in t for t in texts)
    chats = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS]
    common = dict(tokenizer=str(base_dir), model=str(base_dir), dtype="float32", max_new_tokens=MAX_NEW)
    hf = rewards(chats, count_a, **common)
    vl = rewards(chats, count_a, generate=engine, **common)
    assert vl(merged["ties"]) == hf(merged["ties"])
    assert vl.completions == hf.completions


VOCAB_Z = 28  # the token id of "z" in evaluate_helpers.VOCAB: an end token of the user's choice


def test_sampled_runs_repeat_and_a_prompt_subset_scores_as_in_the_full_set(base_dir, engine, candidates):
    _, merged, _ = candidates
    common = dict(tokenizer=str(base_dir), model=str(base_dir), dtype="float32", max_new_tokens=MAX_NEW)
    vl = rewards(PROMPTS, count_a, generate=engine, samples=4, top_p=0.9, top_k=20, stop=["="], seed=7, **common)
    first = vl(merged["ram_plus"])
    completions, per_prompt = vl.completions, vl.per_prompt
    assert all(len(set(c)) > 1 for c in completions[:4])  # sampled: a prompt's 4 completions differ
    vl(merged["ties"])  # another candidate in between
    assert vl(merged["ram_plus"]) == first and vl.completions == completions
    subset = [9, 2, 5]
    assert vl.prompt_scores(merged["ram_plus"], subset) == [per_prompt[i] for i in subset]
    other = rewards(PROMPTS, count_a, generate=engine, samples=4, top_p=0.9, top_k=20, stop=["="], seed=8, **common)
    other(merged["ram_plus"])
    assert other.completions != completions  # the seed is used


def test_generate_vllm_builds_the_engine_of_the_evaluation_s_folder_and_dtype_or_takes_one_running(base_dir, engine):
    ev = rewards(PROMPTS, count_a, tokenizer=str(base_dir), model=str(base_dir), dtype="bfloat16", generate="vllm")
    built = ev.engine.generate
    assert isinstance(built, VLLMGenerate)
    assert built.folder == base_dir and built.dtype == torch.bfloat16 and built._llm is None  # not started yet
    ev = rewards(PROMPTS, count_a, model=str(base_dir), generate="vllm", max_new_tokens=MAX_NEW)
    assert ev.engine.generate.dtype == torch.float32  # the folder's config.json dtype, as transformers loads it
    # an engine already running (TRL's colocated one, here the session's): candidates go into it
    shared = VLLMGenerate(base_dir, llm=engine.llm, tokenizer=str(base_dir))
    hf, vl = _pair(base_dir, shared)
    assert _same(hf, vl, str(base_dir)) == _same(hf, vl, str(base_dir))
    with pytest.raises(ConfigError, match="llm= is an engine already running"):
        VLLMGenerate(base_dir, llm=engine.llm, max_model_len=64)
    with pytest.raises(ConfigError, match="llm= must be a vllm.LLM"):
        VLLMGenerate(base_dir, llm=object())
    with pytest.raises(TypeError, match="cannot go to another process"):
        pickle.dumps(shared)
    assert pickle.loads(pickle.dumps(ev.engine.generate)).folder == base_dir  # without its engine
