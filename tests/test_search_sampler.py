"""search(sampler=...): the built-in TPE and Optuna samplers by ask-and-tell, inside the race."""

from __future__ import annotations

import warnings

import pytest

import ram_live
from ram_live.errors import ConfigError
from sampler_problem import BlockEval, agents

optuna = pytest.importorskip("optuna")


def _search(**kwargs):
    models, base = agents()
    kwargs.setdefault("budget", "12x")
    kwargs.setdefault("fidelity", "halving")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ram_live.ExtrapolationWarning)
        return ram_live.search(models, base=base, evaluate=BlockEval(), progress=False, **kwargs)


def _trials(result):
    return [(t.family, t.method, t.to_dict()["options"], t.score, t.fidelity) for t in result.history]


def test_tpe_same_seed_same_trials_and_the_sampler_is_named():
    a, b = _search(sampler="tpe", seed=4), _search(sampler="tpe", seed=4)
    assert _trials(a) == _trials(b)
    assert any(t.family.startswith("sampled:") for t in a.history)
    assert a.sampler == "tpe" and a.to_dict()["sampler"] == "tpe" and "sampler tpe" in a.table()
    c = _search(sampler="tpe", seed=5)
    sampled = [x for x in _trials(a) if x[0].startswith("sampled:")]
    assert sampled != [x for x in _trials(c) if x[0].startswith("sampled:")]


def test_optuna_tpe_seeded_is_reproducible_and_leaves_the_given_sampler_alone():
    sampler = optuna.samplers.TPESampler(seed=3)
    a = _search(sampler=sampler)
    b = _search(sampler=sampler)  # the same object again: a copy is used each time
    c = _search(sampler=optuna.samplers.TPESampler(seed=3))
    assert _trials(a) == _trials(b) == _trials(c)
    assert a.sampler == "optuna:TPESampler"
    assert any(t.family.startswith("sampled:") for t in a.history)


@pytest.mark.parametrize(
    "make",
    [
        lambda: optuna.samplers.GPSampler(seed=0),
        lambda: optuna.samplers.CmaEsSampler(seed=0),
        lambda: optuna.samplers.NSGAIISampler(seed=0),
        lambda: optuna.samplers.RandomSampler(seed=0),
    ],
)
def test_optuna_samplers_by_ask_and_tell(make):
    if "CmaEs" in repr(make) or make().__class__.__name__ == "CmaEsSampler":
        pytest.importorskip("cmaes")
    sampler = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
        result = _search(sampler=sampler, seed=0)
    sampled = [t for t in result.history if t.family.startswith("sampled:")]
    assert sampled, "the sampler proposed nothing"
    assert result.sampler == f"optuna:{type(sampler).__name__}"
    assert result.best_score >= max(t.score for t in result.history if t.phase == "screen" and t.complete)
    assert result.spent <= 12 + 1e-9


def test_nsga2_searches_the_score_and_the_worst_task():
    from ram_live.selection.sampler import OptunaProposer

    proposer = OptunaProposer(optuna.samplers.NSGAIISampler(seed=0))
    assert proposer.multi
    result = _search(sampler=optuna.samplers.NSGAIISampler(seed=0))
    assert result.sampler == "optuna:NSGAIISampler"
    assert all(t.tasks for t in result.history if t.score is not None)


def test_bad_samplers_are_refused():
    with pytest.raises(ConfigError, match="sampler must be"):
        _search(sampler="random")
    with pytest.raises(ConfigError, match="sampler must be"):
        _search(sampler=object())


def test_the_default_is_tpe_in_a_race_of_10x_and_the_moves_elsewhere():
    assert _search(budget="20x").sampler == "tpe"
    assert _search(budget="10x").sampler == "tpe"
    assert _search(budget="5x").sampler == "moves"
    assert _search(budget=20, fidelity=None).sampler == "moves"


def test_the_raced_sampler_improves_on_its_screen_where_the_moves_are_exact():
    """On a separable quadratic (each agent's weight alone sets its task's score) the coordinate ascent is the
    right tool and ends near the optimum; the raced TPE must still find clearly better than anything screened (the
    base scores about -15 here) and land near the optimum (0)."""
    for seed in (0, 1):
        tpe = _search(sampler="tpe", budget="20x", seed=seed)
        moves = _search(sampler="moves", budget="20x", seed=seed)
        screened = max(t.score for t in tpe.history if t.phase == "screen" and t.complete)
        assert tpe.best_score > screened + 1.0
        assert tpe.best_score > -1.5
        assert moves.best_score > -0.1
        assert tpe.best_trial.complete and tpe.best_trial.family.startswith("sampled:")


def test_parallel_workers_give_the_sampler_the_one_process_trials():
    one = _search(sampler="tpe", seed=2, budget="8x")
    two = _search(sampler="tpe", seed=2, budget="8x", parallel=2)
    assert _trials(two) == _trials(one)


def test_an_arm_is_sampled_exactly_when_it_has_a_box(monkeypatch):
    from ram_live.selection import space as space_module
    from ram_live.selection.budget import arms_of, sampleable
    from ram_live.selection.sampler_box import box_kind

    for spec in (
        None,
        ["task_arithmetic"],
        ["task_arithmetic", "ta_weights"],
        {"task_arithmetic": {"scale": [1, 2]}},
        ["ram_plus"],
        ["ram", "lambdas"],
        ["ties"],
        {"ties": {"density": [0.5], "scale": [1.0]}},
        ["linear"],
    ):
        for arm in arms_of(space_module.parse_space(spec))[1]:
            assert sampleable(arm) == (box_kind(arm.name, arm.families) is not None), (spec, arm.name)
    # a default task-arithmetic grid of one scale: nothing to sample; the arm keeps the moves and scores its grid
    monkeypatch.setitem(space_module.DEFAULT_GRIDS, "task_arithmetic", [{"scale": 1.5}])
    (arm,) = arms_of(space_module.parse_space(["task_arithmetic"]))[1]
    assert not sampleable(arm) and box_kind(arm.name, arm.families) is None
    result = _search(sampler="tpe", space=["task_arithmetic"], budget="3x")
    assert [(t.method, t.options) for t in result.history] == [("task_arithmetic", {"scale": 1.5})]
    assert result.best == {"method": "task_arithmetic", "scale": 1.5}
    # beside other arms it is screened and stays in the race, its one candidate scored
    result = _search(sampler="tpe", space=["task_arithmetic", "ties"], budget="6x")
    assert ("task_arithmetic", {"scale": 1.5}) in [(t.method, t.options) for t in result.history]
    assert not any(t.family == "sampled:task_arithmetic" for t in result.history)
    assert any(t.family == "sampled:ties" for t in result.history)
