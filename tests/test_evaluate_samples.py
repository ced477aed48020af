"""k completions a prompt: ``mean@k`` and ``pass@k`` (Chen et al. 2021's unbiased estimator) against the closed
form and a brute-force enumeration of subsets, seeded sampling independent of a prompt's batch-mates."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from ram_live.errors import ConfigError
from ram_live.evaluate import rewards
from ram_live.evaluate.decoding import prompt_seed
from ram_live.evaluate.samples import pass_at_k

import evaluate_helpers as h
from evaluate_helpers import PROMPTS

# prompt i's k = 4 completions: how many "a" each holds is its reward
SAMPLED = {"p0": ["a", "", "", ""], "p1": ["a", "aa", "", "a"], "p2": ["", "", "", ""], "p3": ["aaa", "a", "a", "a"]}


def fixed(merged, prompts, settings, seeds):
    return [SAMPLED[p][: settings.samples] for p in prompts]


def count_a(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


def brute_force(n: int, c: int, k: int) -> Fraction:
    """pass@k by definition: the share of the k-subsets of n samples (c correct) holding a correct one."""
    correct = set(range(c))
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(1 for s in subsets if correct & set(s)), len(subsets))


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_is_the_closed_form_and_the_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            value = pass_at_k(n, c, k)
            assert value == (1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k))
            assert value == pytest.approx(float(brute_force(n, c, k)), abs=1e-15)
    assert pass_at_k(n, 0, 1) == 0.0 and pass_at_k(n, n, n) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(n, n + 1, 1)


def test_mean_at_k_and_pass_at_k_scores_by_hand():
    prompts = list(SAMPLED)
    mean = rewards(prompts, count_a, generate=fixed, samples=4)
    assert mean(None) == (1 / 4 + 4 / 4 + 0 / 4 + 6 / 4) / 4
    assert mean.per_prompt == [0.25, 1.0, 0.0, 1.5]
    assert mean.completions[1] == SAMPLED["p1"]  # k completions a prompt
    assert mean.metrics["reward/count_a"] == 11 / 16  # over every completion
    # pass@4, a completion passing at reward >= 1: c = 1, 3, 0, 4 of n = 4
    p4 = rewards(prompts, count_a, generate=fixed, samples=4, metric="pass@k")
    assert p4(None) == (1.0 + 1.0 + 0.0 + 1.0) / 4
    p2 = rewards(prompts, count_a, generate=fixed, samples=4, metric="pass@2")
    p2(None)
    assert p2.per_prompt == [pass_at_k(4, 1, 2), pass_at_k(4, 3, 2), 0.0, 1.0] == [0.5, 1.0, 0.0, 1.0]
    strict = rewards(prompts, count_a, generate=fixed, samples=4, metric="pass@1", pass_threshold=2.0)
    strict(None)
    assert strict.per_prompt == [0.0, 0.25, 0.0, 0.25]  # only "aa" and "aaa" pass


def test_one_sample_mean_is_the_plain_score_bit_for_bit(llama, tok):
    assert rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6, metric="mean@k")(llama) == rewards(
        PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6
    )(llama)


def test_k_samples_are_seeded_and_independent_of_the_batch(llama, tok):
    kwargs = dict(tokenizer=tok, max_new_tokens=6, samples=3, temperature=1.5, seed=7)
    a = rewards(PROMPTS, h.count_a, batch_size=16, **kwargs)
    state = torch.get_rng_state()
    score = a(llama)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is left as it was
    assert all(len(set(c)) > 1 for c in a.completions[:3])  # sampling, not three greedy copies
    b = rewards(PROMPTS, h.count_a, batch_size=2, **kwargs)
    assert b(llama) == score and b.completions == a.completions  # another batching, the same samples
    alone = b.prompt_scores(llama, [4])
    assert alone == [a.per_prompt[4]] and b._last[1] == a.completions[4]
    other = rewards(PROMPTS, h.count_a, **{**kwargs, "seed": 8})
    other(llama)
    assert other.completions != a.completions
    assert prompt_seed(7, 4) != prompt_seed(7, 5) and prompt_seed(7, 4, 0) != prompt_seed(7, 4, 1)


def test_sampling_follows_top_k(llama, tok):
    """top_k=1 leaves only the argmax: sampled completions are the greedy ones."""
    greedy = rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6)
    greedy(llama)
    top1 = rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6, samples=2, top_k=1)
    top1(llama)
    assert top1.completions == [[c, c] for c in greedy.completions]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(samples=0), "samples must be an int >= 1"),
        (dict(samples=-2), "samples must be an int >= 1"),
        (dict(samples=True), "samples must be an int >= 1"),
        (dict(samples=2.0), "samples must be an int >= 1"),
        (dict(samples=2, do_sample=False), "greedy completions of a prompt are all the same"),
        (dict(samples=4, metric="pass@5"), r"needs 1 <= K <= samples \(4\)"),
        (dict(samples=4, metric="pass"), "metric must be 'mean@k' or 'pass@k'"),
        (dict(samples=4, metric="mean@2"), "mean@k averages every sample"),
        (dict(samples=4, metric="best@4"), "metric must be"),
        (dict(metric=1), "metric must be"),
        (dict(metric="pass@k", pass_threshold=float("nan")), "pass_threshold must be a finite number"),
    ],
)
def test_bad_sample_options(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        rewards(list(SAMPLED), count_a, generate=fixed, **kwargs)


def test_score_takes_k_completions_a_prompt():
    evaluate = rewards(list(SAMPLED), count_a, samples=4, metric="pass@4")
    flat = [c for p in SAMPLED for c in SAMPLED[p]]
    assert evaluate.score(flat) == 0.75
    with pytest.raises(ConfigError, match=r"4 completions for 4 prompts x 4 samples"):
        evaluate.score(flat[:4])


@pytest.mark.parametrize("temperature", [1e-37, 1e-40, 1e-300, 5e-324])
def test_a_temperature_near_zero_samples_the_greedy_completions(llama, tok, temperature):
    """Dividing the logits by a tiny temperature used to overflow them to NaN (every token the vocabulary's last):
    shifted to their row's largest first, in float64, they sample the most likely token, as the limit does."""
    greedy = rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6)
    greedy(llama)
    cold = rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6, samples=3, temperature=temperature)
    assert cold(llama) == greedy(llama)
    assert cold.completions == [[c, c, c] for c in greedy.completions]
    top_p = rewards(PROMPTS, h.count_a, tokenizer=tok, max_new_tokens=6, samples=2, temperature=temperature, top_p=0.5)
    top_p(llama)
    assert top_p.completions == [[c, c] for c in greedy.completions]


def test_a_temperature_near_zero_draws_evenly_among_tied_tokens():
    """RowSampler on hand-made logits: tokens 1 and 3 tie for the largest; at temperature 5e-324 only they are
    drawn, about half each; token 0 and the vocabulary's last never are."""
    from ram_live.evaluate.decoding import RowSampler
    from ram_live.evaluate.generation import GenerationSettings

    settings = GenerationSettings(do_sample=True, temperature=5e-324, samples=2)
    seeds = list(range(400))
    scores = torch.tensor([[0.5, 7.25, -3.0, 7.25, 7.0]] * len(seeds))
    out = RowSampler(seeds, settings)(torch.zeros((len(seeds), 1), dtype=torch.long), scores)
    assert torch.isfinite(out).sum(dim=1).tolist() == [1] * len(seeds)  # one token left possible a row
    drawn = out.argmax(dim=1).tolist()
    assert set(drawn) == {1, 3} and 150 < drawn.count(1) < 250
    warm = RowSampler(seeds, GenerationSettings(do_sample=True, temperature=1.0, samples=2))(
        torch.zeros((len(seeds), 1), dtype=torch.long), scores
    )
    assert set(warm.argmax(dim=1).tolist()) == {1, 3, 4}  # at temperature 1, token 4 (0.25 behind) is drawn too
