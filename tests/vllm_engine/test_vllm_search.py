"""A raced search (``budget="6x"``, ``fidelity="halving"``) over merges of three agents, evaluated once through
Hugging Face generate and once through VLLMGenerate: the same candidates, scores, races and winner."""

from __future__ import annotations

from ram_live import search
from ram_live.evaluate import rewards
from vllm_helpers import PROMPTS, agents, base_state, count_a


def test_a_raced_search_chooses_the_same_winner_through_both_engines(base_dir, engine):
    base = base_state(base_dir)
    found = agents(base)
    common = dict(tokenizer=str(base_dir), model=str(base_dir), dtype="float32", max_new_tokens=12)
    results = [
        search(found, base=base, evaluate=rewards(PROMPTS, count_a, **common, **extra), budget="6x", fidelity="halving")
        for extra in ({}, {"generate": engine})
    ]
    hf, vl = ([(t.candidate, t.score, t.fidelity, t.stop) for t in r.history] for r in results)
    assert vl == hf
    assert len({score for _, score, _, _ in hf}) > 2  # the candidates score differently: the winner is chosen
    assert results[1].best_trial.candidate == results[0].best_trial.candidate
    assert results[1].best_score == results[0].best_score
