"""Prompts as verl keeps them: a parquet file (``data.val_files``) with a chat-list ``prompt``, ``data_source``,
``reward_model: {"ground_truth": ...}`` and ``extra_info``, scored with a verl-style ``compute_score``."""

from __future__ import annotations

import sys

import pytest

from ram_live.errors import ConfigError
from ram_live.evaluate import compute_score, load_prompts, rewards

import evaluate_helpers as h
from evaluate_helpers import ANSWERS, PROMPTS

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SOURCES = ["openai/gsm8k", "openai/gsm8k", "math", "openai/gsm8k", "math", "math", "openai/gsm8k"]


def verl_rows():
    return [
        {
            "data_source": s,
            "prompt": [{"role": "user", "content": p}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"split": "test", "index": i},
        }
        for i, (p, a, s) in enumerate(zip(PROMPTS, ANSWERS, SOURCES))
    ]


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_parquet_is_read_with_its_columns(tmp_path):
    p = load_prompts(write(tmp_path / "val.parquet", verl_rows()))
    assert p.conversational and p.prompts[0] == [{"role": "user", "content": "a"}]
    assert sorted(p.columns) == ["ability", "data_source", "extra_info", "reward_model"]
    assert p.columns["reward_model"][1] == {"style": "rule", "ground_truth": "4"}
    assert p.columns["extra_info"][2] == {"split": "test", "index": 2}
    assert p.where(3).endswith("val.parquet, row 3")


def test_scored_with_a_verl_compute_score_per_data_source(tmp_path, llama, tok):
    calls = []

    def my_score(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, ground_truth, extra_info["index"]))
        return {"score": 1.0 if solution_str[:1] in ground_truth else 0.0, "acc": 0.0}

    path = write(tmp_path / "val.parquet", verl_rows())
    evaluate = rewards(str(path), compute_score(my_score), tokenizer=tok, max_new_tokens=6)
    score = evaluate(llama)
    # by hand: each conversation through the chat template, greedily, one prompt at a time
    texts = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in PROMPTS
    ]
    outs = [
        tok.decode(h.greedy(llama, tok, tok(t, add_special_tokens=False)["input_ids"], 6), skip_special_tokens=True)
        for t in texts
    ]
    per = [1.0 if o[:1] in a else 0.0 for o, a in zip(outs, ANSWERS)]
    tasks = {s: [r for r, s2 in zip(per, SOURCES) if s2 == s] for s in ["openai/gsm8k", "math"]}
    table = {s: sum(v) / len(v) for s, v in tasks.items()}
    assert evaluate.tasks == table and score == sum(table.values()) / 2
    assert evaluate.completions == [[{"role": "assistant", "content": o}] for o in outs]
    assert calls[0] == ("openai/gsm8k", "b", 0) and len(calls) == 7
    assert set(evaluate.metrics) == {"reward", "reward/openai/gsm8k", "reward/math", "reward/my_score"}


def test_bad_parquet_files(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="does not exist"):
        load_prompts(tmp_path / "missing.parquet")
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(ConfigError, match=r"junk.parquet: not a readable parquet file"):
        load_prompts(junk)
    empty = write(tmp_path / "empty.parquet", [])
    with pytest.raises(ConfigError, match="empty.parquet is empty"):
        load_prompts(empty)
    no_prompt = write(tmp_path / "np.parquet", [{"question": "a"}])
    with pytest.raises(ConfigError, match=r"np.parquet, row 0: no 'prompt' key"):
        load_prompts(no_prompt)
    good = write(tmp_path / "ok.parquet", verl_rows())
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # pyarrow not installed
    with pytest.raises(ConfigError, match=r"reading parquet needs pyarrow .*pip install pyarrow"):
        load_prompts(good)
