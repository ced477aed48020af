"""``generate=`` (the user's engine), TRL's reward-function convention in full (async functions, ``trainer_state``
and the logging hooks), stop strings, ``eos_token_id``, and ``device=``/``dtype=``."""

from __future__ import annotations

import asyncio
import functools

import pytest
import torch

from ram_live.errors import ConfigError, EvaluationError
from ram_live.evaluate import GenerationSettings, rewards
from ram_live.evaluate.decoding import cut_text, prompt_seed

import evaluate_helpers as h
from evaluate_helpers import ANSWERS, PROMPTS, VOCAB

ROWS = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS)]


def count_a(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


# ---------------------------------------------------------------------------------------------- generate=


def test_a_fake_generator_is_scored_by_hand():
    seen = {}

    def engine(merged, prompts, settings, seeds):
        seen.update(merged=merged, prompts=list(prompts), settings=settings, seeds=list(seeds))
        return [f"{p} aa" for p in prompts]  # k = 1: a string per prompt

    evaluate = rewards(ROWS, count_a, generate=engine, max_new_tokens=9, seed=3, stop="z")
    marker = object()
    expected = [float(f"{p} aa".split("z")[0].count("a")) for p in PROMPTS]  # cut before the first stop string
    assert evaluate(marker) == sum(expected) / len(PROMPTS)
    assert evaluate.per_prompt == expected
    assert seen["merged"] is marker and seen["prompts"] == PROMPTS  # handed as it was handed
    assert isinstance(seen["settings"], GenerationSettings) and seen["settings"].max_new_tokens == 9
    assert seen["settings"].stop == ("z",) and seen["settings"].samples == 1 and not seen["settings"].do_sample
    assert seen["seeds"] == [prompt_seed(3, i) for i in range(len(PROMPTS))]
    evaluate.prompt_scores(marker, [4, 2])
    assert seen["prompts"] == [PROMPTS[2], PROMPTS[4]] and seen["seeds"] == [prompt_seed(3, 2), prompt_seed(3, 4)]


def test_a_generator_gets_completion_ids_from_the_tokenizer(tok):
    got = []

    def ids_len(completions, completion_ids, **kwargs):
        got.extend(completion_ids)
        return [float(len(i)) for i in completion_ids]

    evaluate = rewards(PROMPTS[:2], ids_len, tokenizer=tok, generate=lambda m, p, s, seeds: ["ab", "abc"])
    assert evaluate(None) == 2.5 and got == [[VOCAB["a"], VOCAB["b"]], [VOCAB["a"], VOCAB["b"], VOCAB["c"]]]
    none_ids = rewards(
        PROMPTS[:2],
        lambda completions, completion_ids: [float(completion_ids is None)] * 2,
        generate=lambda m, p, s, seeds: ["x", "y"],
    )
    assert none_ids(None) == 1.0


def test_conversational_prompts_reach_the_generator_as_messages():
    chats = [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[:3]]
    seen = []

    def engine(merged, prompts, settings, seeds):
        seen.extend(prompts)
        return [["a"] for _ in prompts]

    def first(completions, **kwargs):
        return [float(c[0]["content"] == "a") for c in completions]

    assert rewards(chats, first, generate=engine)(None) == 1.0 and seen == [c["prompt"] for c in chats]


@pytest.mark.parametrize(
    "returned, message",
    [
        (None, r"returned None for 7 prompts"),
        ("abc", r"returned 'abc' for 7 prompts"),
        ([["a"]] * 6, "returned 6 items for 7 prompts"),
        ([["a", "b"]] * 7, r"returned \['a', 'b'\] for prompt 0"),
        ([[1]] * 7, r"returned \[1\] for prompt 0"),
    ],
)
def test_a_generator_returning_the_wrong_shape(returned, message):
    with pytest.raises(EvaluationError, match=message):
        rewards(PROMPTS, count_a, generate=lambda m, p, s, seeds: returned)(None)


def test_a_generator_that_raises_and_a_generator_that_is_not_callable():
    def broken(merged, prompts, settings, seeds):
        raise RuntimeError("server down")

    with pytest.raises(EvaluationError, match="generate=broken raised RuntimeError: server down") as info:
        rewards(PROMPTS, count_a, generate=broken)(None)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ConfigError, match="generate must be a callable .* or 'vllm', got 'sglang'"):
        rewards(PROMPTS, count_a, generate="sglang")
    with pytest.raises(ConfigError, match="generate='vllm' starts vLLM from the base model's Hugging Face folder"):
        rewards(PROMPTS, count_a, generate="vllm")  # no model= folder to start it from


class Completions(dict):
    """A mapping that is not a dict."""


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: {q: "aa" for q in p}, r"returned a dict \(a mapping: return \[completions\[p\] for p in prompts\]"),
        (lambda p: Completions({q: "aa" for q in p}), r"returned a Completions \(a mapping"),
        (lambda p: {f"{q} aa" for q in p}, r"returned a set, which has no order \(\{'.*\) for 7 prompts"),
        (
            lambda p: frozenset(f"{q} aa" for q in p),
            r"returned a frozenset, which has no order \(frozenset\(\{.*\) for 7 prompts",
        ),
        (
            lambda p: {q: "aa" for q in p}.keys(),
            r"returned a dict_keys, which has no order \(dict_keys\(\[.*\) for 7 prompts",
        ),
        (lambda p: b"aa", r"returned b'aa' for 7 prompts"),
        (lambda p: 7, r"returned 7 for 7 prompts"),
    ],
)
def test_a_mapping_or_a_set_from_the_generator_is_refused_not_scored(make, message):
    """A mapping's keys are the prompts, a set has no order: neither may be paired with the prompts."""
    seen = []

    def spy(completions, **kwargs):
        seen.append(completions)
        return [1.0] * len(completions)

    with pytest.raises(EvaluationError, match=rf"generate=<lambda> {message}"):
        rewards(PROMPTS, spy, generate=lambda m, p, s, seeds: make(p))(None)
    assert seen == []  # nothing was scored


def test_an_ordered_iterable_from_the_generator_is_scored_in_order():
    def lazily(merged, prompts, settings, seeds):
        for p in prompts:
            yield f"{p} aa"

    expected = [float(f"{p} aa".count("a")) for p in PROMPTS]
    for engine in (
        lazily,
        lambda m, p, s, seeds: tuple(f"{q} aa" for q in p),
        lambda m, p, s, seeds: iter([f"{q} aa" for q in p]),
    ):
        evaluate = rewards(PROMPTS, count_a, generate=engine)
        assert evaluate(None) == sum(expected) / len(PROMPTS) and evaluate.per_prompt == expected
        assert evaluate.completions == [f"{p} aa" for p in PROMPTS]


def test_a_generator_that_fails_midway_is_an_evaluation_error_with_its_cause():
    def flaky(merged, prompts, settings, seeds):
        for i, p in enumerate(prompts):
            if i == 3:
                raise ConnectionError("server went away")
            yield p

    with pytest.raises(
        EvaluationError,
        match=r"generate=flaky returned an iterable that raised ConnectionError after 3 of 7 prompts: "
        "server went away",
    ) as info:
        rewards(PROMPTS, count_a, generate=flaky)(None)
    assert isinstance(info.value.__cause__, ConnectionError)

    def endless(merged, prompts, settings, seeds):
        while True:
            yield "a"

    with pytest.raises(EvaluationError, match=r"generate=endless returned more than 7 items for 7 prompts"):
        rewards(PROMPTS, count_a, generate=endless)(None)

    def cancelled(merged, prompts, settings, seeds):
        raise asyncio.CancelledError()

    with pytest.raises(EvaluationError, match=r"^generate=cancelled raised CancelledError$") as info:
        rewards(PROMPTS, count_a, generate=cancelled)(None)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)


# ---------------------------------------------------------------------------------------------- TRL's convention


def fixed(merged, prompts, settings, seeds):
    return [[p[:2]] * settings.samples for p in prompts]


def test_async_reward_functions_are_awaited_concurrently():
    started, order = [], []

    async def slow(completions, **kwargs):
        started.append("slow")
        await asyncio.sleep(0.05)
        order.append("slow")
        return [1.0] * len(completions)

    async def fast(completions, **kwargs):
        started.append("fast")
        order.append("fast")
        return [float(c.count("a")) for c in completions]

    class Judge:  # a callable class whose __call__ is async (TRL's rule)
        async def __call__(self, completions, **kwargs):
            return [0.5] * len(completions)

    evaluate = rewards(PROMPTS, [slow, count_a, fast, Judge(), functools.partial(fast)], generate=fixed)
    expected = [1.0 + 3 * float(p[:2].count("a")) + 0.5 for p in PROMPTS]
    assert evaluate(None) == sum(expected) / len(PROMPTS)
    assert order[:2] == ["fast", "fast"] and started[0] == "slow"  # slow started first, finished last: gathered
    assert set(evaluate.metrics) == {
        "reward",
        "reward/slow",
        "reward/count_a",
        "reward/fast",
        "reward/Judge",
        "reward/fast_2",
    }


def test_async_reward_functions_inside_a_running_event_loop():
    async def half(completions, **kwargs):
        await asyncio.sleep(0)
        return [0.5] * len(completions)

    evaluate = rewards(PROMPTS, half, generate=fixed)

    async def main():
        return evaluate(None)  # e.g. a notebook: the loop is busy, the rewards run on one of their own

    assert asyncio.run(main()) == 0.5


def test_an_async_reward_that_raises_names_the_prompt():
    async def picky(completions, **kwargs):
        if "ab" in completions:  # PROMPTS[2] == "abc abc"
            raise ValueError("cannot judge")
        return [1.0] * len(completions)

    with pytest.raises(EvaluationError, match=r"'picky' raised ValueError on prompt 2: cannot judge") as info:
        rewards(PROMPTS, picky, generate=fixed)(None)
    assert info.value.index == 2


def test_a_reward_raising_cancelled_error_is_an_evaluation_error_naming_it():
    """asyncio.CancelledError is a BaseException: it must not escape as itself, async or not."""

    async def judge(completions, **kwargs):
        if "ab" in completions:  # PROMPTS[2] == "abc abc"
            raise asyncio.CancelledError()
        return [1.0] * len(completions)

    def sync_judge(completions, **kwargs):
        raise asyncio.CancelledError("the client's request was cancelled")

    with pytest.raises(EvaluationError, match=r"^reward function 'judge' raised CancelledError on prompt 2$") as info:
        rewards(PROMPTS, [count_a, judge], generate=fixed)(None)
    assert info.value.function == "judge" and info.value.index == 2
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    with pytest.raises(
        EvaluationError, match=r"'sync_judge' raised CancelledError on prompt 0: the client's request was cancelled"
    ) as info:
        rewards(PROMPTS, sync_judge, generate=fixed)(None)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)

    async def main():  # inside a running event loop too (the rewards run on a loop of their own)
        return rewards(PROMPTS, judge, generate=fixed)(None)

    with pytest.raises(EvaluationError, match=r"'judge' raised CancelledError on prompt 2"):
        asyncio.run(main())


def test_trainer_state_and_the_logging_hooks_are_passed_as_trl_passes_them():
    seen = {}

    def shaped(completions, trainer_state, log_metric, log_extra, answer):
        seen["state"] = trainer_state
        log_metric("judge/calls", 1.0)  # accepted and dropped
        log_extra("judge_reason", ["ok"] * len(completions))
        return [1.0 if c[:1] == a[:1] else 0.0 for c, a in zip(completions, answer)]

    evaluate = rewards(ROWS, shaped, generate=fixed)
    evaluate(None)
    assert seen["state"] is None
    evaluate.trainer_state = state = object()  # e.g. trainer.state from a TRL callback
    evaluate(None)
    assert seen["state"] is state
    with pytest.raises(ConfigError, match=r"\['trainer_state'\] would replace"):
        rewards([{"prompt": "a", "trainer_state": 1}], count_a)


# ---------------------------------------------------------------------------------------------- stop, eos


def test_cut_text():
    assert cut_text("ab=cd=e", ["="]) == ("ab", True)
    assert cut_text("ab=cd=e", ["=", "cd"], include_stop=True) == ("ab=", True)
    assert cut_text("abcd", ["cd", "bcd"], include_stop=True) == ("abcd", True)  # the earliest, then the longest
    assert cut_text("abc", ["x"]) == ("abc", False)


def test_stop_strings_on_a_real_model(llama, tok):
    plain = rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=8)
    plain(llama)
    stopped = rewards(PROMPTS, h.length, tokenizer=tok, max_new_tokens=8, stop=["s", "w"])
    kept = rewards(PROMPTS, h.length, tokenizer=tok, max_new_tokens=8, stop=["s", "w"], include_stop=True)
    stopped(llama)
    kept(llama)
    assert any("s" in c or "w" in c for c in plain.completions)  # not vacuous
    for full, cut, with_stop in zip(plain.completions, stopped.completions, kept.completions):
        expected = cut_text(full, ["s", "w"])[0]
        assert cut == expected and with_stop == cut_text(full, ["s", "w"], include_stop=True)[0]
    # completion_ids end with the token that wrote the stop string (character tokens: the text's length + 1)
    for c, full, reward in zip(kept.completions, plain.completions, kept.per_prompt):
        if c != full:
            assert reward == len(c)


def test_eos_token_id_ends_completions_where_asked(llama, tok):
    plain = rewards(PROMPTS, h.length, tokenizer=tok, max_new_tokens=8)
    plain(llama)
    w = VOCAB["w"]
    evaluate = rewards(PROMPTS, h.length, tokenizer=tok, max_new_tokens=8, eos_token_id=[w])
    evaluate(llama)
    for full, c in zip(plain.completions, evaluate.completions):
        if "w" in full:
            assert c == full[: full.index("w") + 1]  # w ends it (a plain token: decoded, kept)
    assert any("w" in c for c in plain.completions)
    seen = {}
    rewards(PROMPTS, count_a, generate=lambda m, p, s, seeds: seen.update(s=s) or ["a"] * len(p), eos_token_id=5)(None)
    assert seen["s"].eos_token_id == (5,)
    with pytest.raises(ConfigError, match="eos_token_id must be a token id"):
        rewards(PROMPTS, count_a, eos_token_id=[-1])
    with pytest.raises(ConfigError, match="stop must be a non-empty string"):
        rewards(PROMPTS, count_a, stop=[""])


# ---------------------------------------------------------------------------------------------- device, dtype


def test_a_module_elsewhere_is_refused_not_copied(llama, tok):
    with pytest.raises(ConfigError, match=r"rewards: device='meta' holds no data"):
        rewards(PROMPTS, count_a, tokenizer=tok, device="meta")  # when built
    with pytest.raises(ConfigError, match=r"is in torch.float32, and dtype=torch.bfloat16 was asked"):
        rewards(PROMPTS, count_a, tokenizer=tok, dtype="bfloat16")(llama)
    with pytest.raises(ConfigError, match=r"model= \(LlamaForCausalLM\) is in torch.float32"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=h.model(1), dtype=torch.float16)
    with pytest.raises(ConfigError, match="dtype must be a floating torch dtype"):
        rewards(PROMPTS, count_a, dtype="int8")
    with pytest.raises(ConfigError, match="device=.* is not a device"):
        rewards(PROMPTS, count_a, device="gpu:0")
    assert rewards(PROMPTS[:2], count_a, tokenizer=tok, max_new_tokens=2, device="cpu", dtype="float32")(llama) >= 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to be elsewhere")
def test_a_module_on_the_cpu_is_refused_when_cuda_is_asked(llama, tok):
    evaluate = rewards(PROMPTS, count_a, tokenizer=tok, device="cuda")
    with pytest.raises(ConfigError, match=r"the evaluated LlamaForCausalLM is on cpu, and device='cuda' was asked"):
        evaluate(llama)
    assert next(llama.parameters()).device.type == "cpu"  # not moved


def test_a_folder_is_loaded_in_the_dtype_asked(tmp_path, llama, tok):
    """model= as a folder is loaded once, in dtype= on device=; a state dict is copied into it (its tokenizer too)."""
    llama.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    evaluate = rewards(
        PROMPTS[:2], count_a, max_new_tokens=2, dtype=torch.bfloat16, device="cpu", model=str(tmp_path / "m")
    )
    evaluate(llama.state_dict())
    assert {p.dtype for p in evaluate.resolver._model.parameters()} == {torch.bfloat16}
