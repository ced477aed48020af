"""Bad input to ``ram_live.evaluate``: library errors naming the function, the prompt index or the file."""

from __future__ import annotations

import itertools
import math
from collections import deque
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from ram_live import search
from ram_live.errors import ConfigError, EvaluationError, SearchError
from ram_live.evaluate import load_prompts, rewards

import evaluate_helpers as h
from evaluate_helpers import PROMPTS, count_a, length


def test_a_raising_reward_names_the_function_and_the_prompt(llama, tok):
    def picky(completions, **kwargs):
        out = []
        for c in completions:
            if c == "esesnz":  # the completion of PROMPTS[5]
                raise ValueError("cannot parse")
            out.append(1.0)
        return out

    evaluate = rewards(PROMPTS, [count_a, picky], tokenizer=tok, max_new_tokens=6)
    with pytest.raises(
        EvaluationError, match=r"reward function 'picky' raised ValueError on prompt 5: cannot parse"
    ) as info:
        evaluate(llama)
    assert info.value.function == "picky" and info.value.index == 5
    assert isinstance(info.value.__cause__, ValueError)


def test_wrong_length(llama, tok):
    def short(completions, **kwargs):
        return [1.0] * (len(completions) - 1)

    with pytest.raises(EvaluationError, match=r"'short' returned 6 rewards for 7 prompts") as info:
        rewards(PROMPTS, short, tokenizer=tok, max_new_tokens=2)(llama)
    assert info.value.function == "short"


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", True])
def test_nan_or_non_number_names_the_prompt(llama, tok, bad):
    def nan_at_2(completions, **kwargs):
        return [bad if j == 2 else 0.0 for j in range(len(completions))]

    with pytest.raises(EvaluationError, match=r"'nan_at_2' returned .* for prompt 2") as info:
        rewards(PROMPTS, nan_at_2, tokenizer=tok, max_new_tokens=2)(llama)
    assert info.value.index == 2


def test_none_is_not_applicable_as_in_trl(tok):
    evaluate = rewards(PROMPTS[:3], [count_a], tokenizer=tok)
    evaluate.funcs = [lambda completions, **k: [1.0, None, 3.0]]
    assert evaluate.score(["x", "y", "z"]) == (1.0 + 3.0) / 2  # the unscored prompt is left out (nanmean)
    assert evaluate.metrics["reward/count_a"] == 2.0


def test_search_wraps_it_in_a_search_error(tok):
    base = h.model(0)
    agents = {"a": h.model(1).state_dict(), "b": h.model(2).state_dict()}

    def boom(completions, **kwargs):
        raise RuntimeError("no")

    with pytest.raises(SearchError) as info:
        search(
            agents,
            base=base,
            evaluate=rewards(PROMPTS[:2], boom, tokenizer=tok, max_new_tokens=2),
            budget=1,
            space=["task_arithmetic"],
        )
    assert isinstance(info.value.__cause__, EvaluationError) and info.value.__cause__.index == 0


def test_empty_and_malformed_prompt_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match=r"prompts file .*empty.jsonl is empty"):
        load_prompts(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    with pytest.raises(ConfigError, match=r"prompts file .*bad.jsonl, line 2: not JSON"):
        load_prompts(str(bad))
    no_prompt = tmp_path / "np.jsonl"
    no_prompt.write_text('{"prompt": "a", "answer": 1}\n{"question": "b"}\n')
    with pytest.raises(ConfigError, match=r"np.jsonl, line 2: no 'prompt' key"):
        load_prompts(no_prompt)
    ragged = tmp_path / "ragged.jsonl"
    ragged.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b"}\n')
    with pytest.raises(ConfigError, match=r"ragged.jsonl, line 2: its keys"):
        load_prompts(ragged)
    with pytest.raises(ConfigError, match=r"prompts file .*missing.jsonl does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match=r"the prompts list is empty"):
        load_prompts([])
    with pytest.raises(ConfigError, match=r"row 0: 'prompt' must be a string"):
        load_prompts([{"prompt": 3}])


def test_jsonl_and_dataset_rows(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "answer": "x"}\n\n{"prompt": "b", "answer": "y"}\n')
    p = load_prompts(f)
    assert p.prompts == ["a", "b"] and p.columns == {"answer": ["x", "y"]} and not p.conversational
    datasets = pytest.importorskip("datasets")
    d = load_prompts(datasets.Dataset.from_list([{"prompt": "a", "answer": "x"}]))
    assert d.prompts == ["a"] and d.columns == {"answer": ["x"]}


def test_bad_options(tok):
    with pytest.raises(ConfigError, match="max_new_tokens must be an int >= 1"):
        rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=0)
    with pytest.raises(ConfigError, match="reward_weights must be 1 finite numbers"):
        rewards(PROMPTS, count_a, tokenizer=tok, reward_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="reward_funcs is empty"):
        rewards(PROMPTS, [], tokenizer=tok)
    with pytest.raises(ConfigError, match="a reward function must be callable"):
        rewards(PROMPTS, ["nope"], tokenizer=tok)


def test_a_state_dict_without_model_is_a_config_error(llama, tok):
    with pytest.raises(ConfigError, match=r"handed a state dict .* model="):
        rewards(PROMPTS, count_a, tokenizer=tok)(llama.state_dict())


def test_a_state_dict_of_another_structure(llama, tok):
    sd = dict(llama.state_dict())
    sd["extra.weight"] = sd.pop("lm_head.weight")
    with pytest.raises(EvaluationError, match=r"keys the model lacks: \['extra.weight'\]"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=h.model(1))(sd)


def test_conversational_prompts_need_a_chat_template(llama):
    tok = h.tokenizer()
    tok.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        rewards([{"prompt": [{"role": "user", "content": "a"}]}], count_a, tokenizer=tok)(llama)


def test_a_column_named_as_an_argument_of_the_reward_functions_is_refused():
    with pytest.raises(ConfigError, match=r"column\(s\) \['completions'\] would replace"):
        load_prompts([{"prompt": "a", "completions": "x"}])


# ------------------------------------------------------------------- hostile returns of a reward function


def returning(value):
    def shaped(completions, **kwargs):
        return value

    return shaped


def score_of(tok, fn, weights=None) -> float:
    """``fn``'s score on seven fixed completions (no generation)."""
    return rewards(PROMPTS, fn, tokenizer=tok, reward_weights=weights).score(["x"] * len(PROMPTS))


@pytest.mark.parametrize(
    "value, what",
    [
        ({j: 1.0 for j in range(7)}, "a dict"),
        (np.ones((7, 2)), "a 2-D ndarray of shape"),
        (torch.ones(7, 2), "a 2-D Tensor of shape"),
        (np.ones((7, 1)), "a 2-D ndarray"),
        (np.float64(2.0), "a 0-D"),
        (torch.tensor(1.0), "a 0-D Tensor"),
        ("1111111", "a str"),
        (b"\x01" * 7, "a bytes"),
        ({0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, "a set"),
        (frozenset(range(7)), "a frozenset"),
        (1.0, "a float"),
        (None, "a NoneType"),
    ],
)
def test_a_return_that_is_not_a_sequence_of_numbers_names_the_function(tok, value, what):
    with pytest.raises(
        EvaluationError,
        match=rf"reward function 'shaped' returned {what}.*not a sequence of "
        "rewards",
    ) as info:
        score_of(tok, returning(value))
    assert info.value.function == "shaped" and info.value.index is None


@pytest.mark.parametrize(
    "bad, reason",
    [
        ([[1.0, 2.0]], "not a number"),
        (np.array([1.0]), "not a number"),
        (torch.tensor([1.0]), "not a number"),
        (10**400, "too large for a float"),
        (Fraction(10**400), "too large for a float"),
        (Decimal("1e400"), "too large for a float"),
        (Decimal("NaN"), "not finite"),
        (Decimal("sNaN"), "not a number"),
        (np.float32("inf"), "not finite"),
        (np.bool_(True), "not a number"),
        (1 + 0j, "not a number"),
        (torch.tensor(True), "not a number"),
        (torch.empty((), device="meta"), "not a number"),
    ],
)
def test_a_value_that_is_not_a_finite_number_names_the_function_and_the_prompt(tok, bad, reason):
    values = [0.0] * 7
    values[4] = bad
    with pytest.raises(EvaluationError, match=rf"'shaped' returned .* for prompt 4: {reason}") as info:
        score_of(tok, returning(values))
    assert info.value.function == "shaped" and info.value.index == 4


@pytest.mark.parametrize(
    "kind",
    [
        "list",
        "tuple",
        "generator",
        "deque",
        "object ndarray",
        "ndarray",
        "float32 ndarray",
        "tensor",
        "float16 tensor",
        "0-d items",
    ],
)
def test_sequences_of_numbers_still_score_exactly(tok, kind):
    with_none = [0.5, 1.0, 2.0, None, 4.0, 0.25, 3.0]  # None: not applicable, left out of the mean
    nums = [0.5, 1.0, 2.0, 0.0, 4.0, 0.25, 3.0]
    given = {
        "list": with_none,
        "tuple": tuple(with_none),
        "generator": (v for v in with_none),
        "deque": deque(with_none),
        "object ndarray": np.array(with_none, dtype=object),
        "ndarray": np.array(nums),
        "float32 ndarray": np.array(nums, dtype=np.float32),
        "tensor": torch.tensor(nums),
        "float16 tensor": torch.tensor(nums, dtype=torch.float16),
        "0-d items": [np.array(v) if j % 2 else torch.tensor(v) for j, v in enumerate(nums)],
    }[kind]
    expected = 10.75 / 6 if kind in ("list", "tuple", "generator", "deque", "object ndarray") else 10.75 / 7
    assert score_of(tok, returning(given)) == expected


def test_numbers_of_every_kind_are_their_float(tok):
    values = [Fraction(1, 4), Decimal("0.5"), np.int64(3), np.float32(0.25), np.uint8(2), 10**300, True and 1]
    expected = [0.25, 0.5, 3.0, 0.25, 2.0, 1e300, 1.0]
    evaluate = rewards(PROMPTS, returning(values), tokenizer=tok)
    assert evaluate.score(["x"] * 7) == sum(expected) / 7
    assert evaluate.per_prompt == expected


def test_an_iterable_that_raises_while_read_names_the_function(tok):
    def lazy(completions, **kwargs):
        for j, _ in enumerate(completions):
            if j == 3:
                raise KeyError("missing answer")
            yield 1.0

    with pytest.raises(
        EvaluationError,
        match=r"'lazy' returned an iterable that raised KeyError while its rewards "
        r"were read at prompt 3: 'missing answer'",
    ) as info:
        score_of(tok, lazy)
    assert info.value.function == "lazy" and info.value.index == 3 and isinstance(info.value.__cause__, KeyError)

    class Broken:
        def __iter__(self):
            raise OSError("disk\ngone")

    with pytest.raises(
        EvaluationError,
        match=r"'shaped' returned an iterable that raised OSError while its rewards "
        r"were read at prompt 0: disk gone$",
    ) as info:
        score_of(tok, returning(Broken()))
    assert isinstance(info.value.__cause__, OSError)


def test_an_endless_iterable_is_read_no_further_than_one_past_the_prompts(tok):
    with pytest.raises(EvaluationError, match=r"'shaped' returned more than 7 rewards for 7 prompts") as info:
        score_of(tok, returning(itertools.count()))
    assert info.value.function == "shaped"
    with pytest.raises(EvaluationError, match=r"'shaped' returned 8 rewards for 7 prompts"):
        score_of(tok, returning(np.zeros(8)))


def test_finite_rewards_whose_weighted_sum_overflows(tok):
    big = returning([1e308] * 7)
    with pytest.raises(EvaluationError, match=r"the rewards overflow: prompt 0's weighted sum is inf") as info:
        rewards(PROMPTS, [big, big], tokenizer=tok).score(["x"] * 7)
    assert info.value.index == 0
    # each prompt's sum is finite: their mean is too (computed without overflowing, ram_live.evaluate.moments)
    assert score_of(tok, big) == 1e308


@pytest.mark.parametrize(
    "weights, what",
    [
        (1.0, "got a float"),
        ("1", "got a str"),
        ({0: 1.0}, "got a dict"),
        ((w for w in [1.0]), "an iterator"),
        ({1.0}, "got a set"),
        (np.ones((1, 1)), "got a 2-D ndarray"),
        ([10**400], r"reward_weights\[0\] is .*too large"),
        ([True], r"reward_weights\[0\] is True: not a number"),
        (["1"], r"reward_weights\[0\] is '1'"),
        ([math.inf], r"reward_weights\[0\] is inf: not finite"),
        ([1.0, 2.0], "got 2"),
    ],
)
def test_reward_weights_of_the_wrong_type(tok, weights, what):
    with pytest.raises(ConfigError, match=rf"rewards: reward_weights must be 1 finite numbers .*{what}"):
        rewards(PROMPTS, count_a, tokenizer=tok, reward_weights=weights)


@pytest.mark.parametrize(
    "weights",
    [[2.0], (2,), np.array([2.0]), torch.tensor([2.0]), [Fraction(2)], [np.float32(2.0)], [torch.tensor(2.0)]],
)
def test_reward_weights_as_lists_tuples_and_arrays(tok, weights):
    assert score_of(tok, returning([1.0] * 7), weights=weights) == 2.0


# ------------------------------------------------------------------------------------- options and models


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("seed", -1, r"seed must be an int in \[0, 2\*\*63 - 1\], got -1"),
        ("seed", 2**63, "seed must be an int"),
        ("seed", True, "seed must be"),
        ("seed", 1.0, "seed must be"),
        ("seed", "3", "seed must be"),
        ("temperature", math.nan, "temperature must be a finite number > 0, got nan"),
        ("temperature", math.inf, "temperature must be"),
        ("temperature", 0, "temperature must be"),
        ("temperature", True, "temperature must be"),
        ("temperature", "1", "temperature must be"),
        ("top_p", math.nan, r"top_p must be a number in \(0, 1\]"),
        ("top_p", 0.0, "top_p must be"),
        ("top_p", 1.5, "top_p must be"),
        ("top_p", True, "top_p must be"),
        ("top_k", -1, r"top_k must be an int >= 0 \(0: no top-k cut\), got -1"),
        ("top_k", 2.5, "top_k must be"),
        ("top_k", True, "top_k must be"),
        ("top_k", "5", "top_k must be"),
    ],
)
def test_generation_options_out_of_range(tok, option, value, message):
    with pytest.raises(ConfigError, match=f"rewards: {message}"):
        rewards(PROMPTS, count_a, tokenizer=tok, do_sample=True, **{option: value})


def test_the_largest_seed_samples(llama, tok):
    kwargs = dict(tokenizer=tok, max_new_tokens=3, do_sample=True, top_k=5, temperature=0.7)
    a = rewards(PROMPTS[:3], length, seed=2**63 - 1, **kwargs)
    assert a(llama) == rewards(PROMPTS[:3], length, seed=2**63 - 1, **kwargs)(llama)
    assert a.completions and all(isinstance(c, str) for c in a.completions)


@pytest.mark.parametrize(
    "bad, what",
    [
        (3, "a int"),
        ({"vocab": 1}, "a dict"),
        (math, "a module"),
        (object(), "a object"),
        (h.transformers.PreTrainedTokenizerFast, r"the class \w+ \(a class: load one with \.from_pretrained"),
        (lambda texts: {"input_ids": [[1]]}, "a function"),
    ],
)
def test_a_tokenizer_of_the_wrong_type_is_refused_when_built(bad, what):
    with pytest.raises(ConfigError, match=rf"rewards: tokenizer must be a tokenizer .*got {what}"):
        rewards(PROMPTS, count_a, tokenizer=bad)


def test_a_model_on_the_meta_device(llama, tok):
    with torch.device("meta"):
        empty = h.transformers.LlamaForCausalLM(h.config())
    with pytest.raises(
        EvaluationError,
        match=r"the evaluated LlamaForCausalLM has 'model.embed_tokens.weight' on "
        "the meta device",
    ):
        rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=2)(empty)
    with pytest.raises(ConfigError, match=r"rewards: model= has 'model.embed_tokens.weight' on the meta device"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=empty)
    with pytest.raises(ConfigError, match=r"model must be a module or a Hugging Face folder, got the class"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=h.transformers.LlamaForCausalLM)
    sd = dict(llama.state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"].to("meta")
    with pytest.raises(EvaluationError, match=r"the state dict holds 'lm_head.weight' on the meta device"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=h.model(1))(sd)


def test_a_model_offloaded_by_accelerate_is_not_refused(llama, tok):
    """Its weights are on meta, loaded by its hooks: it scores as the plain model does."""
    accelerate = pytest.importorskip("accelerate")
    offloaded = h.model(0)
    accelerate.cpu_offload(offloaded, execution_device=torch.device("cpu"))
    assert all(p.is_meta for p in offloaded.parameters())
    evaluate = rewards(PROMPTS, length, tokenizer=tok, max_new_tokens=4)
    assert evaluate(offloaded) == evaluate(llama)


def whitespace_tokenizer():
    """A tokenizer that splits on whitespace and adds no BOS: a blank prompt is zero tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel(h.VOCAB, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return h.transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<eos>", unk_token="<unk>", pad_token="<pad>", padding_side="left"
    )


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_a_prompt_of_zero_tokens_is_refused_before_generating(llama, monkeypatch, batch_size):
    def no_generate(*args, **kwargs):
        raise AssertionError("generate was called")

    monkeypatch.setattr(llama, "generate", no_generate)
    evaluate = rewards(["a", "b", "  \t "], count_a, tokenizer=whitespace_tokenizer(), batch_size=batch_size)
    with pytest.raises(ConfigError, match=r"the prompts list, row 2: the prompt is zero tokens with this tokenizer"):
        evaluate(llama)


def test_a_chat_template_that_raises_names_the_prompt(llama):
    tok = h.tokenizer()
    tok.chat_template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be the "
        "user\\'s') }}{% endif %}" + h.CHAT
    )
    chats = [{"prompt": [{"role": r, "content": "a"}]} for r in ["user", "user", "system", "user"]]
    with pytest.raises(
        ConfigError,
        match=r"the prompts list, row 2: the tokenizer's chat template raised "
        r"\w+: the first message must be the user's",
    ) as info:
        rewards(chats, count_a, tokenizer=tok, max_new_tokens=2)(llama)
    assert info.value.__cause__ is not None


# ------------------------------------------------------------------------------- checked when the evaluation is built


def test_a_device_this_torch_cannot_use_is_refused_when_built(llama, tok):
    """device="cuda" on a torch without CUDA used to fail with a raw AssertionError at the first evaluation."""
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    past = f"cuda:{seen}"  # one past the devices this torch sees (cuda:0 on a CPU-only machine)
    with pytest.raises(ConfigError, match=rf"^rewards: device='{past}', and this torch "):
        rewards(PROMPTS, count_a, tokenizer=tok, device=past)
    with pytest.raises(ConfigError, match=rf"rewards: device='{past}'"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=llama, device=past)  # before the module's placement
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"rewards: device='cuda', and this torch has no usable cuda device"):
            rewards(PROMPTS, count_a, tokenizer=tok, device="cuda")
    with pytest.raises(ConfigError, match=r"rewards: device='meta' holds no data"):
        rewards(PROMPTS, count_a, tokenizer=tok, device=torch.device("meta"))
    for backend in ("xla", "lazy", "ipu"):  # torch knows the names, this build has no such backend
        with pytest.raises(ConfigError, match=rf"^rewards: device='{backend}', and this torch cannot put a tensor"):
            rewards(PROMPTS, count_a, tokenizer=tok, device=backend)
    assert rewards(PROMPTS[:1], count_a, tokenizer=tok, max_new_tokens=2, device=torch.device("cpu"))(llama) >= 0


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", torch.float8_e5m2, "torch.float8_e4m3fnuz"])
def test_a_dtype_no_model_runs_in_is_refused_when_built(tmp_path, llama, tok, dtype):
    """A float8 dtype is floating, and used to be accepted, then fail when the folder was loaded."""
    llama.save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match=r"^rewards: dtype=torch.float8_e\w+ cannot be loaded and generated with"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=str(tmp_path / "m"), dtype=dtype)


def test_the_dtypes_a_model_runs_in_are_accepted(tmp_path, llama, tok):
    llama.save_pretrained(tmp_path / "m")
    for dtype in ("bfloat16", "float16", torch.float32, "torch.float64"):
        evaluate = rewards(PROMPTS[:1], count_a, tokenizer=tok, model=str(tmp_path / "m"), dtype=dtype)
        assert evaluate.resolver.dtype == getattr(torch, str(dtype).removeprefix("torch."))


def test_an_eos_token_id_out_of_range_is_refused(tmp_path, llama, tok):
    """An id past the vocabulary can never be generated: completions would silently never end on it."""
    vocab = len(h.VOCAB)
    with pytest.raises(
        ConfigError,
        match=rf"^rewards: eos_token_id {vocab} is out of range: the model \(LlamaForCausalLM\) has {vocab}",
    ):
        rewards(PROMPTS, count_a, tokenizer=tok, model=llama, eos_token_id=[1, vocab])
    with pytest.raises(
        ConfigError, match=rf"eos_token_id 1000 is out of range: the tokenizer \(\w+\) has {vocab} tokens"
    ):
        rewards(PROMPTS, count_a, tokenizer=tok, eos_token_id=1000)
    llama.save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match=rf"eos_token_id {vocab + 3} is out of range: the model in {tmp_path / 'm'}"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=str(tmp_path / "m"), eos_token_id=vocab + 3)
    wide = h.tokenizer()
    wide.add_tokens(["<x>", "<y>", "<z>"])  # 3 ids the model cannot emit: accepted when built, refused when called
    late = rewards(PROMPTS, count_a, tokenizer=wide, eos_token_id=vocab + 1, max_new_tokens=2)
    with pytest.raises(ConfigError, match=rf"eos_token_id {vocab + 1} is out of range: the model \(LlamaForCausalLM\)"):
        late(llama)
    last = rewards(PROMPTS, count_a, tokenizer=tok, model=llama, eos_token_id=vocab - 1, max_new_tokens=2)
    assert last(llama) >= 0  # the last id is in range
    assert rewards(PROMPTS, count_a, tokenizer=tok, eos_token_id=np.int64(1)).settings.eos_token_id == (1,)
    with pytest.raises(ConfigError, match=r"eos_token_id must be a token id \(an int >= 0\).*got np.int64\(-1\)"):
        rewards(PROMPTS, count_a, tokenizer=tok, eos_token_id=np.int64(-1))


def test_a_tokenizer_or_model_path_with_a_typo_is_refused_when_built(tmp_path, monkeypatch, tok):
    """tokenizer="ckpt/bsae" used to be accepted and fail at the first evaluation, hours later in a training run."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty cache: no id resolves
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt" / "base").mkdir(parents=True)
    for option in ("tokenizer", "model"):
        with pytest.raises(ConfigError, match=rf"^rewards: {option}.*'ckpt/bsae'"):
            rewards(PROMPTS, count_a, **{option: "ckpt/bsae"})  # an id's shape: looked up in the cache
        with pytest.raises(ConfigError, match=rf"rewards: {option}='\./ckpt/bsae' does not exist"):
            rewards(PROMPTS, count_a, **{option: "./ckpt/bsae"})
        with pytest.raises(ConfigError, match=rf"rewards: {option}='{tmp_path}/runs/x/ckpt' does not exist"):
            rewards(PROMPTS, count_a, **{option: tmp_path / "runs" / "x" / "ckpt"})
    with pytest.raises(ConfigError, match=r"rewards: model='ckpt/base' is not a Hugging Face model folder"):
        rewards(PROMPTS, count_a, tokenizer=tok, model="ckpt/base")  # it exists, but holds no model
    with pytest.raises(ConfigError, match=r"rewards: cannot load a tokenizer from ckpt/base"):
        rewards(PROMPTS, count_a, tokenizer="ckpt/base")  # it exists, but holds no tokenizer: loaded when built
    tok.save_pretrained(tmp_path / "ckpt" / "base")
    assert rewards(PROMPTS, count_a, tokenizer="ckpt/base").resolver.tokenizer(None)("ab")["input_ids"] == [
        h.VOCAB["a"],
        h.VOCAB["b"],
    ]


def test_a_damaged_model_or_tokenizer_folder_is_refused_when_built(tmp_path, llama, tok):
    """A model= folder whose config.json does not load, or that holds no weights, used to fail at the first
    evaluation; a tokenizer folder whose config.json is a JSON list raised a raw TypeError."""
    llama.save_pretrained(tmp_path / "good")
    tok.save_pretrained(tmp_path / "good")
    for name, config in (("text", "{not json"), ("list", "[]"), ("untyped", '{"hidden_size": 4}')):
        folder = tmp_path / name
        llama.save_pretrained(folder)
        (folder / "config.json").write_text(config)
        with pytest.raises(ConfigError, match=rf"^rewards: model='{folder}': its config.json does not load \("):
            rewards(PROMPTS, count_a, tokenizer=tok, model=str(folder))
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_bytes((tmp_path / "good" / "config.json").read_bytes())
    with pytest.raises(ConfigError, match=r"^rewards: model='.*bare' holds no weights"):
        rewards(PROMPTS, count_a, tokenizer=tok, model=str(tmp_path / "bare"))
    tok.save_pretrained(tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer_config.json").write_text("[]")
    with pytest.raises(ConfigError, match=r"^rewards: cannot load a tokenizer from .*tok: \w+"):
        rewards(PROMPTS, count_a, tokenizer=str(tmp_path / "tok"))
    with pytest.raises(EvaluationError, match=r"^rewards: cannot evaluate '' \(an empty path\)"):
        rewards(PROMPTS, count_a, tokenizer=tok, max_new_tokens=2)("")
    assert rewards(PROMPTS[:1], count_a, model=str(tmp_path / "good"), max_new_tokens=2)(llama.state_dict()) >= 0
