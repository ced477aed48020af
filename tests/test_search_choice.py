"""A search that could not choose says so (ram_live/selection/choice.py): every candidate scoring the same, or
another within one paired standard error of the winner, warns with ArbitraryChoiceWarning naming the likely
causes, marks the result (``arbitrary``, ``choice_causes``, JSON) and the table; a race that stopped no candidate
says so in its table; the plan says when the prompts are too few to race; ``ram-live search`` prints the warning."""

from __future__ import annotations

import json
import math
import random
import statistics
import warnings

import pytest
import torch
from safetensors.torch import save_file

from ram_live import ArbitraryChoiceWarning, merge, search
from ram_live.cli import main
from ram_live.errors import RamLiveWarning
from ram_live.evaluate import rewards
from ram_live.selection.fidelity import Halving

from conftest import make_agents
from search_evals import TARGET, PromptEval

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")


@pytest.fixture
def agents(base_sd):
    return dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05))), base_sd


def test_a_constant_evaluation_warns_and_marks_the_choice_arbitrary(agents):
    models, base = agents
    with pytest.warns(ArbitraryChoiceWarning) as caught:
        result = search(models, base=base, evaluate=lambda merged: 0.25, budget=5, progress=False)
    (warning,) = [w for w in caught if issubclass(w.category, ArbitraryChoiceWarning)]
    text = str(warning.message)
    assert issubclass(ArbitraryChoiceWarning, RamLiveWarning)
    assert text.startswith("the search could not choose: all 5 candidates scored 0.25; the winner #0 ")
    assert "is an arbitrary pick (the earliest). Likely causes: " in text
    assert "returned 0.25 for every candidate: it may not depend on the merged weights" in text
    assert warning.message.causes == tuple(result.choice_causes) and len(result.choice_causes) == 1
    assert result.arbitrary and result.best_trial.index == 0
    saved = result.to_dict()
    assert saved["arbitrary"] is True and saved["choice_causes"] == result.choice_causes
    table = result.table()
    assert "arbitrary: all 5 candidates have the same score; the search could not choose" in table
    assert "likely causes: the evaluation returned 0.25" in table


def test_a_search_that_chooses_says_nothing(agents):
    models, base = agents
    target = merge(models, base=base, method="ram", lambdas=TARGET)

    def close(merged):
        return -sum(float(((merged[k] - target[k]) ** 2).sum()) for k in target)

    with warnings.catch_warnings():
        warnings.simplefilter("error", ArbitraryChoiceWarning)
        result = search(models, base=base, evaluate=close, budget=5, progress=False)
    assert not result.arbitrary and result.choice_causes == [] and "arbitrary" not in result.table()
    assert result.to_dict()["arbitrary"] is False


def _yes_no(merged, prompts, settings, seeds):
    """Four completions a prompt, whatever the merge: one "yes" (reward 1) and three "no" (reward 0)."""
    return [["yes", "no", "no", "no"] for _ in prompts]


def correct(completions, **kwargs):
    return [float(c == "yes") for c in completions]


def test_a_pass_threshold_above_the_rewards_is_named(agents, tok):
    """The issue's case: ``--samples 4 --metric pass@4 --pass-threshold 2`` with 0/1 rewards scores every
    candidate 0."""
    models, base = agents
    evaluate = rewards(
        [f"q{i}" for i in range(6)],
        correct,
        tokenizer=tok,
        samples=4,
        metric="pass@4",
        pass_threshold=2,
        max_new_tokens=8,
        generate=_yes_no,
    )
    with pytest.warns(ArbitraryChoiceWarning, match="all 4 candidates scored 0;") as caught:
        result = search(models, base=base, evaluate=evaluate, budget="4x", progress=False)
    text = str(next(w.message for w in caught if w.category is ArbitraryChoiceWarning))
    assert (
        "the pass threshold 2 (pass_threshold=, --pass-threshold) is above every weighted reward seen (at most 1)"
        in text
    )
    assert "max_new_tokens=8 (--max-new-tokens) may be too few tokens" in text
    assert result.arbitrary and result.best_score == 0.0 and result.best_trial.se == 0.0
    # with the threshold at the rewards' top, the search scores pass@4 = 1 everywhere: the same, but not 0
    evaluate = rewards(
        [f"q{i}" for i in range(6)], correct, tokenizer=tok, samples=4, metric="pass@4", generate=_yes_no
    )
    with pytest.warns(ArbitraryChoiceWarning, match="all 3 candidates scored 1;"):
        again = search(models, base=base, evaluate=evaluate, budget="3x", progress=False)
    assert not any("pass threshold" in c for c in again.choice_causes)


class Noisy(PromptEval):
    """Per-prompt offsets of spread 1 with the candidates' differences a million times smaller, the same on every
    prompt: every score is within the winner's unpaired standard error (about 1/sqrt(n)), yet each paired
    difference is the same on every prompt, so the order of the candidates is certain."""

    def __init__(self, targets):
        super().__init__(targets, per_task=10)
        g = torch.Generator().manual_seed(1)
        self.offsets = torch.randn(len(self.tasks), generator=g).tolist()

    def prompt_scores(self, merged, indices):
        exact = super().prompt_scores(merged, indices)
        return [self.offsets[i] + 1e-6 * (v - self.offsets[i]) for v, i in zip(exact, indices)]


def test_candidates_ordered_on_every_prompt_are_a_choice_within_the_unpaired_standard_error(agents):
    """The scores lie within the winner's standard error across prompts, but the comparison is paired: the same
    prompts, the same difference on each, so the search chose."""
    from ram_live.selection.choice import paired

    models, base = agents
    targets = {"math": merge(models, base=base, method="ram", lambdas=TARGET)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArbitraryChoiceWarning)
        result = search(models, base=base, evaluate=Noisy(targets), budget="5x", progress=False)
    scores = [t.score for t in result.complete]
    best = result.best_trial
    assert max(scores) > min(scores) and max(scores) - min(scores) <= best.se  # the unpaired rule's false alarm
    assert not result.arbitrary and "arbitrary" not in result.table()
    runner = max((t for t in result.complete if t is not best), key=lambda t: t.score)
    lead, se = paired(best, runner)
    diffs = [best.values[i] - runner.values[i] for i in range(10)]
    assert lead == best.score - runner.score > 0 and lead > 1e3 * se  # constant differences: se is rounding only
    assert se == statistics.stdev(diffs) / math.sqrt(10)


class Coin:
    """Each prompt's 0/1 reward drawn at random, whatever the merge (seeded by the merged weights): the candidates
    differ only by noise."""

    n = 60

    def prompt_tasks(self):
        return ["t"] * self.n

    def prompt_scores(self, merged, indices):
        key = round(float(sum(v.double().sum() for v in merged.values())), 9)
        rng = random.Random(hash(key))  # (a float hashes the same in every process)
        draws = [float(rng.random() < 0.5) for _ in range(self.n)]
        return [draws[i] for i in indices]

    def aggregate(self, values):
        vs = [v for v in values.values() if v is not None]
        return sum(vs) / len(vs), {"t": sum(vs) / len(vs)}

    def __call__(self, merged):
        return self.aggregate(dict(enumerate(self.prompt_scores(merged, range(self.n)))))[0]


@pytest.mark.parametrize("fidelity", [None, "halving"])
def test_candidates_that_differ_by_noise_are_an_arbitrary_choice_raced_or_not(agents, fidelity):
    """Coin flips: the winner's lead over the closest candidate is within one standard error of their paired
    differences; a race that stopped some candidates by chance still warns about those it scored in full."""
    from ram_live.selection.choice import rivals

    models, base = agents
    with pytest.warns(ArbitraryChoiceWarning, match="within one paired standard error of the winner") as caught:
        result = search(models, base=base, evaluate=Coin(), budget="10x", fidelity=fidelity, progress=False)
    assert result.arbitrary and len(result.complete) >= 2
    if fidelity is not None:
        assert any(t.stop for t in result.history)  # a stop no longer silences the warning
    best = result.best_trial
    close = rivals(result)
    assert close and all(t.complete and t is not best for t, _, _ in close)
    rival, lead, se = close[0]
    diffs = [best.values[i] - rival.values[i] for i in range(Coin.n)]
    assert math.isclose(lead, sum(diffs) / Coin.n, abs_tol=1e-12) and 0 <= lead <= se
    assert math.isclose(se, statistics.stdev(diffs) / math.sqrt(Coin.n), rel_tol=1e-12)
    text = str(next(w.message for w in caught if w.category is ArbitraryChoiceWarning))
    assert f"the winner leads #{rival.index} by {lead:.3g}, within the standard error of their paired" in text
    assert f"the winner #{best.index} " in text and "(the highest, by less than the paired standard error)" in text
    assert "arbitrary: " in result.table() and "within one paired standard error of the winner" in result.table()


class Mixed(PromptEval):
    """The candidates' differences weighted differently on each prompt (some negative): paired differences that
    vary from prompt to prompt, so that a large enough z stops no candidate."""

    def __init__(self, targets):
        super().__init__(targets, per_task=18)
        g = torch.Generator().manual_seed(2)
        self.weights = (1 + 3 * torch.randn(len(self.tasks), generator=g)).tolist()

    def prompt_scores(self, merged, indices):
        exact = super().prompt_scores(merged, indices)
        return [self.offsets[i] + self.weights[i] * (v - self.offsets[i]) for v, i in zip(exact, indices)]


@pytest.mark.filterwarnings("ignore::ram_live.ArbitraryChoiceWarning")
def test_a_race_that_stops_no_candidate_says_so(agents):
    models, base = agents
    targets = {"math": merge(models, base=base, method="ram", lambdas=TARGET)}
    ev = Mixed(targets)
    raced = search(models, base=base, evaluate=ev, budget="4x", fidelity=Halving(z=1e6), progress=False)
    assert raced.race_slices == (2, 6, 18) and all(t.stop is None for t in raced.history)
    assert (
        "race: no candidate was stopped early (slices of 2/6/18 prompts): every candidate saw every prompt, as in a "
        "full search; none trailed its side's best by more than the race's z standard errors" in raced.table()
    )
    assert raced.to_dict()["race_slices"] == [2, 6, 18]
    stopping = search(
        models, base=base, evaluate=PromptEval(targets, per_task=18), budget="4x", fidelity="halving", progress=False
    )
    assert any(t.stop for t in stopping.history) and "race: no candidate" not in stopping.table()
    assert "race:" not in search(models, base=base, evaluate=ev, budget="2x", progress=False).table()


def test_the_plan_says_when_the_prompts_are_too_few_to_race(agents):
    models, base = agents
    targets = {t: merge(models, base=base, method="ram", lambdas=TARGET) for t in ("a", "b", "c")}
    few = PromptEval(targets, per_task=1)  # a slice holds one prompt of each task: the first is all three
    plan = search(models, base=base, evaluate=few, budget="10x", fidelity="halving", plan=True)
    assert plan.raced is None and plan.full.candidates == (10, 10)
    assert plan.note.startswith("3 prompts are too few to race: with min_fraction=0.111111 the first slice already")
    assert "too few to race" in plan.text() and "raced" not in plan.text()
    enough = search(models, base=base, evaluate=PromptEval(targets, per_task=9), budget="10x", plan=True)
    assert enough.raced is not None and enough.raced.candidates[1] > 10
    result = search(models, base=base, evaluate=few, budget="3x", fidelity="halving", progress=False)
    assert result.race_slices == (3, 3, 3) and "the first slice holds every prompt: too few prompts to race" in (
        result.table()
    )


def test_ram_live_search_prints_the_warning_and_the_table_line(tmp_path, base_sd, capsys, monkeypatch):
    paths = {}
    for name, sd in {"base": base_sd, **dict(zip(("a", "b"), make_agents(base_sd, [0.3, 0.3])))}.items():
        paths[name] = tmp_path / name
        paths[name].mkdir()
        save_file({k: v.contiguous() for k, v in sd.items()}, str(paths[name] / "model.safetensors"))
    (paths["base"] / "config.json").write_text('{"model_type": "tiny"}')
    (tmp_path / "flat_eval.py").write_text("def score(merged):\n    return 0.5\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = ["search", f"a={paths['a']}", f"b={paths['b']}", "--base", str(paths["base"]), "--eval"]
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = main([*args, "flat_eval:score", "--budget", "3", "--out", str(out), "--space", '["ram_plus"]'])
    captured = capsys.readouterr()
    assert code == 0
    assert "ram-live: warning: the search could not choose: all 3 candidates scored 0.5; the winner #0" in captured.err
    assert "arbitrary: all 3 candidates have the same score" in captured.out
    saved = json.loads((out / "search.json").read_text())
    assert saved["arbitrary"] is True and saved["choice_causes"] and math.isclose(saved["best_score"], 0.5)
    assert "likely causes:" in (out / "table.txt").read_text()


def test_a_training_search_record_and_its_metrics_carry_the_arbitrary_choice(tmp_path):
    """RAMSchedule(search=...) with an evaluation that ignores the weights: the record (JSON) says ``arbitrary``
    with the causes, ``ram/search/arbitrary`` is 1, and the warning names the search."""
    from torch import nn

    from ram_live.training.schedule import RAMSchedule
    from ram_live.training.search import SearchSetting

    def net(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))

    store = tmp_path / "store"
    a, b = net(0), net(0)
    with torch.no_grad():
        a[0].weight.add_(0.1)
        b[2].weight.add_(-0.1)
    first = RAMSchedule(store, "a", durable=False)
    first.attach(net(0))
    first.snapshot(a, 2)
    setting = SearchSetting(evaluate=lambda model: {"acc": 0.5}, metric="acc", budget=4)
    sched = RAMSchedule(store, "b", merge_every=2, search=setting, durable=False)
    sched.attach(net(0))
    with pytest.warns(ArbitraryChoiceWarning, match="all 4 candidates scored 0.5"):
        metrics = sched.on_step(b, 2)
    record = json.loads(open(sched.last_search["file"]).read())
    assert record["arbitrary"] is True and "may not depend on the merged weights" in record["choice_causes"][0]
    assert metrics["ram/search/arbitrary"] == 1.0


def test_the_causes_are_read_through_a_training_searchs_wrapper(agents, tok):
    """RAMSchedule's search scores candidates through a wrapper that keeps the evaluation as ``fn``: the causes
    still name the pass threshold."""
    from ram_live.selection.choice import likely_causes

    models, base = agents
    evaluate = rewards(
        ["q0", "q1"], correct, tokenizer=tok, samples=4, metric="pass@4", pass_threshold=2, generate=_yes_no
    )

    class Wrapper:
        fn = evaluate

        def __call__(self, merged):
            return evaluate(merged)

    with pytest.warns(ArbitraryChoiceWarning):
        result = search(models, base=base, evaluate=evaluate, budget="3x", progress=False)
    causes = likely_causes(result, Wrapper())
    assert causes == result.choice_causes and "the pass threshold 2" in causes[0]


def test_a_race_that_compared_no_candidate_does_not_say_they_kept_up(agents):
    """Each candidate the first of its side (a RAM-family one, then a baseline): nothing was raced, and the table
    says so rather than that none trailed its side's best."""
    models, base = agents
    targets = {"math": merge(models, base=base, method="ram", lambdas=TARGET)}
    result = search(
        models,
        base=base,
        evaluate=PromptEval(targets, per_task=18),
        budget="2x",
        fidelity="halving",
        space=["ram_plus", "task_arithmetic"],
        progress=False,
    )
    assert [t.side for t in result.history] == ["ram", "baseline"] and all(t.fidelity == 1.0 for t in result.history)
    (line,) = [line for line in result.table().splitlines() if line.startswith("race:")]
    assert line.endswith(
        "full search; none was raced: each was the first of its side (RAM family, baselines) scored on every prompt"
    )


def test_arbitrary_is_judged_on_the_trials_as_they_are():
    """A new trial, a changed score and per-prompt scores added to a trial (as a race adds them) each change the
    judgement; the JSON and a pickled copy agree."""
    import pickle

    from ram_live.selection.result import SearchResult, Trial

    def trial(i: int, score: float, values: dict) -> Trial:
        return Trial(i, "ram", "ram", {}, score, 0.0, 0.0, 1.0, values=values)

    res = SearchResult([trial(0, 0.5, {0: 0.5, 1: 0.6}), trial(1, 0.5, {0: 0.5, 1: 0.6})], 2, 0, ("a", "b"))
    assert res.arbitrary is True and "arbitrary: " in res.table()
    res.history.append(trial(2, 0.9, {0: 0.9, 1: 1.0}))
    assert res.arbitrary is False
    res.history[2].score = 0.5
    res.history[2].values = {0: 0.5, 1: 0.6}
    assert res.arbitrary is True
    again = pickle.loads(pickle.dumps(res))
    assert again == res and again.arbitrary is True
    assert json.dumps(again.to_dict()) == json.dumps(res.to_dict())
