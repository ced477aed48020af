"""``search`` over LoRA / PEFT adapters (ram_live.selection.adapters), with the real ``peft`` on a tiny Llama built
offline: adapter folders and a live PeftModel, the activity rule's density searched on the RAM side, every trial
re-made bit for bit by the adapter entry points, and bad input refused in one line naming the agent."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live import search  # noqa: E402
from ram_live.errors import ConfigError, InputMismatchError, RamLiveError, UnsupportedInputError  # noqa: E402
from ram_live.peft import TopK, ram_merge_adapter_files, ram_merge_adapters  # noqa: E402
from ram_live.peft.svd_options import SvdOptions  # noqa: E402
from ram_live.selection import from_json  # noqa: E402
from ram_live.selection.adapters import adapter_agents  # noqa: E402

from adapter_evals import LogitsScore  # noqa: E402
from conftest import assert_bit_identical, snapshot  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning:peft",
    "ignore::FutureWarning",
    "ignore::ram_live.ExtrapolationWarning",
    "ignore::ram_live.peft.DenseDeltaWarning",
)

LLAMA = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
NAMES = ["code", "tool", "memory"]
X = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
#: one arm of each kind, small grids: every family runs to its end within the budget
SPACE = {
    "ram_plus": [{"r": 0.1, "alpha": 2.0}, {"r": 0.0, "alpha": 2.0}],
    "sparsify": True,
    "leave_one_out": True,
    "task_arithmetic": {"scale": [1.0, 0.5]},
    "ties": {"density": [0.3], "scale": [1.0]},
    "dare_ties": {"density": [0.5], "scale": [1.0]},
}


def _lora(**kw) -> LoraConfig:
    cfg = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    cfg.update(kw)
    return LoraConfig(**cfg)


def _peft_model(base: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Three adapters on a copy of ``base``; "tool" targets other modules (q/o) than the others (q/v)."""
    torch.manual_seed(seed)
    configs = {"code": _lora(), "tool": _lora(r=8, target_modules=["q_proj", "o_proj"]), "memory": _lora(r=2)}
    model = get_peft_model(copy.deepcopy(base), configs["code"], adapter_name="code")
    for name in NAMES[1:]:
        model.add_adapter(name, configs[name])
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.mul_(0.3)
    return model.eval()


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()


@pytest.fixture(scope="module")
def model(base):
    return _peft_model(base)


@pytest.fixture(scope="module")
def folders(model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    model.save_pretrained(root, selected_adapters=NAMES)
    return [root / name for name in NAMES]


class Recorder:
    """The evaluation: a score of the merged weights (or logits), and a bit-exact copy of each merge it saw."""

    def __init__(self, score=None) -> None:
        self.seen: list[dict[str, torch.Tensor]] = []
        self.score = score

    def __call__(self, merged) -> float:
        self.seen.append(snapshot(merged))
        if self.score is not None:
            return self.score(merged)
        if isinstance(merged, torch.nn.Module):
            assert not any("lora_" in n for n, _ in merged.named_parameters())  # the plain base, merged into
            with torch.no_grad():
                return -float(merged(X).logits.double().pow(2).mean())
        return -float(sum(v.double().pow(2).sum() for v in merged.values()))


def _scored(result, recorder):
    """(trial, the merge it was scored on), in order."""
    trials = [t for t in result.history if t.score is not None]
    assert len(trials) == len(recorder.seen)
    return list(zip(trials, recorder.seen))


@pytest.mark.parametrize("kind", ["module", "state_dict"])
def test_folders_every_trial_is_remade_bit_for_bit_by_ram_merge_adapter_files(base, folders, kind):
    base_in = base if kind == "module" else base.state_dict()
    recorder = Recorder()
    result = search(folders, base=base_in, evaluate=recorder, budget=30, space=SPACE)
    assert result.agents == tuple(NAMES)  # named after their folders, as ram_merge_adapter_files names them
    families = {t.family for t in result.history}
    assert {"ram_plus", "sparsify", "leave_one_out", "task_arithmetic", "ties", "dare_ties"} <= families
    rules = [t.options.get("sparsify") for t in result.history if t.family == "sparsify"]
    assert rules == [TopK(0.3), TopK(0.7), TopK(0.2)]
    assert all("sparsify" not in t.options for t in result.history if t.side == "baseline")
    assert all("seed" not in t.options for t in result.history)  # DARE keeps its own seed (see adapters.py)
    for trial, seen in _scored(result, recorder):
        remade = ram_merge_adapter_files(folders, base=base_in, into_base=True, **trial.candidate)
        assert_bit_identical(snapshot(remade), seen)
    best = ram_merge_adapter_files(folders, base=base_in, into_base=True, **result.best)
    assert recorder.score is None and Recorder()(best) == result.best_score
    # the JSON of the result re-makes the same merge
    saved = json.loads(json.dumps(result.to_dict()))
    again = ram_merge_adapter_files(folders, base=base_in, into_base=True, **from_json(saved["best"]))
    assert_bit_identical(snapshot(again), snapshot(best))


def test_untargeted_modules_keep_the_base_bits_and_counts_are_taken_once_per_rule(base, folders):
    recorder = Recorder()
    result = search(
        folders,
        base=base,
        evaluate=recorder,
        budget=12,
        confirm=lambda merged: 1.0,
        confirm_top=2,
        space={"ram_plus": [{"r": 0.1, "alpha": 2.0}, {"r": 1.0, "alpha": 2.0}], "sparsify": True},
    )
    assert sorted(t.confirm_score for t in result.history if t.confirm_score is not None) == [1.0, 1.0]
    untouched = [k for k in base.state_dict() if "k_proj" in k or "mlp" in k or "norm" in k]
    assert untouched
    for seen in recorder.seen:
        for k in untouched:
            assert torch.equal(seen[k], base.state_dict()[k]), k
    rules = {str(t.options.get("sparsify")) for t in result.history}
    assert result.statistics_passes == len(rules) == 4  # the default rule and the three moves, once each


def test_live_peft_model_every_trial_is_remade_by_ram_merge_adapters(model):
    before = snapshot(model)
    recorder = Recorder()
    result = search(model, adapters=["code", "tool"], evaluate=recorder, budget=14, space=SPACE)
    assert result.agents == ("code", "tool")
    assert any(t.family == "sparsify" for t in result.history)
    for trial, seen in _scored(result, recorder):
        remade = ram_merge_adapters(model, ["code", "tool"], into_base=True, **trial.candidate)
        assert_bit_identical(snapshot(remade), seen)
    assert_bit_identical(snapshot(model), before)  # the model, its adapters and its base are left as they were
    everything = search(model, evaluate=Recorder(), budget=2, space=["ram_plus"])  # adapters=None: all of them
    assert everything.agents == tuple(NAMES)


def test_the_density_that_wins_is_in_best_and_remade(base, folders):
    """An evaluation that prefers fewer changed weights picks the sparsest rule; ``result.best`` carries it."""
    reference = base.state_dict()

    def fewer_changes(merged) -> float:
        sd = merged.state_dict()
        return -float(sum(int((sd[k] != reference[k]).sum()) for k in reference))

    recorder = Recorder(fewer_changes)
    result = search(
        folders,
        base=base,
        evaluate=recorder,
        budget=8,
        space={"ram_plus": [{"r": 0.0, "alpha": 2.0}], "sparsify": True},
    )
    assert result.best["sparsify"] == TopK(0.2)
    remade = ram_merge_adapter_files(folders, base=base, into_base=True, **result.best)
    assert fewer_changes(remade) == result.best_score
    assert "sparsify=topk(density=0.2)" in result.table()


def test_the_default_adapter_space_finds_the_density(base, folders):
    """Without ``space=``: the adapter space (its RAM+ grid, the density move, the baselines) within the budget; an
    evaluation that wants the plain-RAM merge at TopK(0.3) gets it."""
    from ram_live.selection.adapters import ADAPTER_RAM_PLUS_GRID

    wanted = ram_merge_adapter_files(folders, base=base, into_base=True, method="ram", sparsify=TopK(0.3))
    target = {k: v.double() for k, v in wanted.state_dict().items()}

    def near(merged) -> float:
        return -float(sum((v.double() - target[k]).abs().sum() for k, v in merged.state_dict().items()))

    result = search(folders, base=base, evaluate=near, budget=40)
    assert result.spent <= 40
    assert {"ram_plus", "sparsify", "task_arithmetic", "ties", "dare_ties"} <= {t.family for t in result.history}
    assert all(t.options in ADAPTER_RAM_PLUS_GRID for t in result.history if t.family == "ram_plus")
    assert not any(t.family == "activity" and "eps" in t.options for t in result.history)
    assert result.best_score == 0.0 and result.best["sparsify"] == TopK(0.3)


def test_rules_go_to_json_and_back_as_sparsify_takes_them():
    from ram_live.peft import RelativeThreshold
    from ram_live.peft.sparsify import sparsify_rule
    from ram_live.selection import to_json

    best = {"method": "ram", "sparsify": TopK(0.3), "lambdas": {"code": 1.0}}
    back = from_json(json.loads(json.dumps(to_json(best))))
    assert back == {"method": "ram", "sparsify": ("topk", 0.3), "lambdas": {"code": 1.0}}
    assert sparsify_rule(back["sparsify"], "ram") == TopK(0.3)
    relative = from_json(json.loads(json.dumps(to_json({"sparsify": RelativeThreshold(1.5)}))))["sparsify"]
    assert sparsify_rule(relative, "ram") == RelativeThreshold(1.5)
    assert from_json(to_json({"sparsify": None})) == {"sparsify": None}


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert isinstance(exc, RamLiveError) and "\n" not in text
    return text


def test_adapters_of_another_base_are_refused_naming_the_adapter(base, folders, tmp_path):
    torch.manual_seed(1)
    other = LlamaForCausalLM(LlamaConfig(**{**LLAMA, "hidden_size": 32})).eval()
    foreign = get_peft_model(other, _lora(), adapter_name="stranger")
    foreign.save_pretrained(tmp_path)
    with pytest.raises(InputMismatchError) as info:  # two adapters that disagree on a module
        search({"code": folders[0], "stranger": tmp_path / "stranger"}, base=base, evaluate=Recorder(), budget=2)
    assert "'stranger'" in _one_line(info.value) and info.value.agent == "stranger"
    with pytest.raises(InputMismatchError) as info:  # every adapter of another base than base=
        search({"stranger": tmp_path / "stranger"}, base=base, evaluate=Recorder(), budget=2)
    assert "'stranger'" in _one_line(info.value)


def test_a_mix_of_adapters_and_full_models_is_refused_naming_the_agent(base, folders, model):
    with pytest.raises(UnsupportedInputError) as info:
        search({"code": folders[0], "full": base.state_dict()}, base=base, evaluate=Recorder(), budget=2)
    assert "'full'" in _one_line(info.value) and "'code'" in str(info.value)
    with pytest.raises(UnsupportedInputError) as info:
        search({"live": model, "full": base}, base=base, evaluate=Recorder(), budget=2)
    assert "'live'" in _one_line(info.value) and "adapters=" in str(info.value)


@pytest.mark.parametrize(
    "case",
    [
        "adapters_with_folders",
        "base_with_live",
        "folders_without_base",
        "importance",
        "shared_weights",
        "unknown_adapter",
        "bad_rule",
    ],
)
def test_what_an_adapter_search_does_not_take_is_a_config_error(base, folders, model, case):
    run = dict(evaluate=Recorder(), budget=2)
    calls = {
        "adapters_with_folders": lambda: search(folders, base=base, adapters=["code"], **run),
        "base_with_live": lambda: search(model, base=base, **run),
        "folders_without_base": lambda: search(folders, **run),
        "importance": lambda: search(folders, base=base, importance={n: 1.0 for n in NAMES}, **run),
        "shared_weights": lambda: search(folders, base=base, space=["ram_plus", "shared_weights"], **run),
        "unknown_adapter": lambda: search(model, adapters=["code", "nope"], **run),
        "bad_rule": lambda: search(folders, base=base, space={"sparsify": [TopK(0.3), "most"]}, **run),
    }
    with pytest.raises(ConfigError) as info:
        calls[case]()
    _one_line(info.value)


def test_sparsify_over_full_models_is_a_config_error(base):
    agents = {"a": base.state_dict(), "b": base.state_dict()}
    for space in (["ram_plus", "sparsify"], [{"method": "ram", "sparsify": TopK(0.3)}]):
        with pytest.raises(ConfigError, match="adapters") as info:
            search(agents, base=base.state_dict(), evaluate=Recorder(), budget=2, space=space)
        _one_line(info.value)


def test_the_rank_move_is_a_refactored_adapter_remade_by_ram_merge_adapter_files(base, folders, tmp_path):
    """``rank``: the agents' largest rank (8) and twice it, capped at the layers' full rank (16); each such trial is
    the adapter ``ram_merge_adapter_files(folders, out=..., **candidate)`` writes, folded into the base."""
    from ram_live.peft import lora_deltas

    recorder = Recorder()
    result = search(
        folders,
        base=base.state_dict(),
        evaluate=recorder,
        budget=6,
        space={"ram_plus": SPACE["ram_plus"][:1], "rank": None},
    )
    ranked = [(t, seen) for t, seen in _scored(result, recorder) if t.family == "rank"]
    assert [t.options["rank"] for t, _ in ranked] == [8, 16]
    reference = base.state_dict()
    for trial, seen in ranked:
        out = ram_merge_adapter_files(folders, out=tmp_path / f"rank-{trial.index}", **trial.candidate)
        deltas = lora_deltas(out)
        assert json.loads((out / "adapter_config.json").read_text())["r"] == trial.options["rank"]
        for module, delta in deltas.items():
            key = f"{module}.weight"
            want = reference[key].double() + delta.double()
            assert torch.allclose(seen[key].double(), want, atol=1e-6), key
    with pytest.raises(ConfigError, match="rank= is the rank of a re-factored LoRA adapter"):
        search({"a": base, "b": base}, base=base, evaluate=lambda m: 0.0, space={"rank": [4]})


def _trials(result) -> list[tuple]:
    return [(t.index, t.family, t.side, t.candidate, t.score, t.error, t.extrapolation) for t in result.history]


def _table(result) -> list[str]:
    """The table's trial rows without the timing columns (between ``extrap`` and ``candidate``), and its summary
    without the time line."""
    head, *lines = result.table().splitlines()
    cut = slice(head.index("extrap") + len("extrap"), head.index("candidate"))
    blank = lines.index("")
    rows = [line[: cut.start] + line[cut.stop :] for line in lines[:blank]]
    return [head[: cut.start] + head[cut.stop :], *rows, *(line for line in lines[blank:] if " s, " not in line)]


@pytest.mark.parametrize("kind", ["folders", "live", "svd"])
def test_two_process_workers_give_the_one_process_adapter_search(base, folders, model, kind):
    """``parallel=2`` over adapters: each worker builds the adapters' merger from the adapters read once; the
    trials (exact merges into the base and a ``rank`` re-factored one; with ``svd``, as a LoRA callback searches,
    every candidate re-factored), the winner and the table are those of one process."""
    if kind == "svd":
        read = adapter_agents(folders, base, None)
        agents = dict(models=dataclasses.replace(read, svd=SvdOptions(rank=2)))
    else:
        agents = dict(models=folders, base=base) if kind == "folders" else dict(models=model)
    run = dict(
        evaluate=LogitsScore(LLAMA["vocab_size"]),
        budget=6,
        space={"ram_plus": SPACE["ram_plus"], "sparsify": [TopK(0.3)], "rank": [4], "ties": SPACE["ties"]},
    )
    one = search(**agents, **run)
    two = search(**agents, parallel=2, **run)
    assert [t.family for t in one.history] == ["ram_plus", "ties", "ram_plus", "sparsify", "rank"]
    assert all(t.score is not None and t.error is None for t in one.history)
    assert _trials(two) == _trials(one)
    assert two.best == one.best and two.best_score == one.best_score and two.spent == one.spent == 5
    assert two.statistics_passes == one.statistics_passes
    assert _table(two) == _table(one) and any("rank=4" in row for row in _table(one))
