"""RAMSchedule(search=SearchSetting(...)) in a plain PyTorch loop: the merge ram_live.search picks with the user's
held-out evaluation, its record (metrics, MergeResult.extra, the JSON file, the state), errors."""

from __future__ import annotations

import json

import pytest
from dataclasses import replace
import torch
from torch import nn

from ram_live import merge
from ram_live.errors import ConfigError, RamLiveError
from ram_live.training.schedule import RAMSchedule
from ram_live.training.search import SearchSetting, search_metrics
from ram_live.training.search_record import load_choice
from ram_live.store import SnapshotStore

pytest.importorskip("ram_live.selection")


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.int32)


def _copy(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _train(model: nn.Module, seed: int, steps: int = 1) -> None:
    """A sparse-ish update: a different random subset of entries per agent moves."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=g) < 0.5
            p.add_(torch.randn(p.shape, generator=g) * 0.1 * mask * steps)


@pytest.fixture()
def setup(tmp_path):
    """Agent 'a' trained and snapshotted (step 4); agent 'b' being trained by the loop under test; the target
    of the evaluation: base + 0.7·τ_a + 1.6·τ_b (neither agent's λ is 1)."""
    store = tmp_path / "store"
    base = _net()
    base_sd = _copy(base)
    a = _net()
    sched_a = RAMSchedule(store, "a", durable=False)
    sched_a.attach(a)
    _train(a, 1)
    sched_a.snapshot(a, 4)
    b = _net()
    _train(b, 2)
    tau_a = {k: a.state_dict()[k] - v for k, v in base_sd.items()}
    tau_b = {k: b.state_dict()[k] - v for k, v in base_sd.items()}
    target = {k: v + 0.7 * tau_a[k] + 1.6 * tau_b[k] for k, v in base_sd.items()}
    return store, base_sd, b, target


def _distance(model: nn.Module, target: dict[str, torch.Tensor]) -> float:
    return float(sum(((v.detach().double() - target[k].double()) ** 2).sum() for k, v in model.state_dict().items()))


def test_searched_merge_is_reproducible_logged_saved_and_restores_the_model(setup):
    store, base_sd, b, target = setup
    calls = []

    def held_out(model):
        calls.append(model)
        return {"dist": _distance(model, target), "other": 1.0}

    setting = SearchSetting(evaluate=held_out, metric="dist", mode="min", budget=12, seed=3)
    sched = RAMSchedule(
        store, "b", merge_every=4, search=setting, durable=False, evaluate=lambda m: {"final": _distance(m, target)}
    )
    sched.attach(_net())  # the base is the model at train start
    before = _copy(b)
    metrics = sched.on_step(b, 4)
    # the evaluation got the training model itself (candidates swapped in), at most `budget` times
    assert 1 <= len(calls) <= 12 and all(m is b for m in calls)
    for k, v in before.items():  # swapped back bit for bit
        assert torch.equal(_bits(b.state_dict()[k]), _bits(v)), k
    result = sched.last_result
    rec = result.extra["search"]
    assert rec is sched.last_search and rec["step"] == 4 and rec["evaluations"] == len(calls)
    # merge(**best) of the store's snapshots re-makes the merged tensors bit for bit
    snaps = SnapshotStore(store).latest_all(["a", "b"])
    again = merge(snaps, base=base_sd, **load_choice(rec["file"]))
    for k, v in again.items():
        assert torch.equal(_bits(result.tensors[k]), _bits(v)), k
    # the logged best score is the metric's own value (a distance, not its negation) of that merge ...
    m = _net()
    m.load_state_dict(again)
    assert metrics["ram/search/best_score"] == pytest.approx(_distance(m, target), rel=1e-12)
    assert metrics["ram/final"] == pytest.approx(_distance(m, target), rel=1e-12)  # the regular evaluate ran on it
    # ... and the smallest distance among the candidates, none of which is worse than plain RAM+ here
    body = json.loads(open(rec["file"]).read())
    scores = [-t["score"] for t in body["history"]["history"] if t["score"] is not None]
    assert len(scores) == len(calls) and metrics["ram/search/best_score"] == min(scores)
    plain = merge(snaps, base=base_sd, method="ram_plus")
    m.load_state_dict(plain)
    assert metrics["ram/search/best_score"] <= _distance(m, target)
    assert metrics[f"ram/search/method/{rec['best']['method']}"] == 1.0
    assert metrics == {**metrics, **search_metrics(rec)}
    assert sched.history[-1]["ram/search/best_score"] == metrics["ram/search/best_score"]


def test_state_dict_keeps_the_record_and_same_seed_same_choice(setup, tmp_path):
    store, base_sd, b, target = setup
    setting = SearchSetting(evaluate=lambda m: -_distance(m, target), budget=8, seed=1)
    recs = []
    for run in range(2):
        sched = RAMSchedule(store, "b", merge_every=4, search=setting, durable=False)
        sched.attach(_net())
        sched.on_step(b, 4 + 4 * run)  # the same weights at another step
        recs.append(sched.last_search)
        state = sched.state_dict()
        json.dumps(state, allow_nan=False)  # a JSON-able checkpoint entry
        fresh = RAMSchedule(store, "b", search=setting, durable=False)
        fresh.load_state_dict(state)
        assert fresh.last_search == sched.last_search
    assert recs[0]["best"] == recs[1]["best"] and recs[0]["best_score"] == recs[1]["best_score"]


def test_setting_validation_and_errors(setup):
    for bad in (
        {"budget": 0},
        {"budget": True},
        {"budget": "0.5x"},
        {"budget": "lots"},
        {"fidelity": "fast"},
        {"mode": "up"},
        {"metric": ""},
        {"evaluate": 3},
        {"confirm_top": 0},
    ):
        with pytest.raises(ConfigError):
            SearchSetting(**bad)
    with pytest.raises(ConfigError, match="unknown search option"):
        SearchSetting.from_mapping({"budgte": 3})
    assert SearchSetting.from_mapping({"budget": 5, "metric": "acc"}) == SearchSetting(budget=5, metric="acc")
    s = SearchSetting(metric="acc")
    assert s.score({"ram/acc": 0.25, "loss": 3.0}) == 0.25
    assert SearchSetting().score({"only": 2}) == 2.0
    with pytest.raises(ConfigError, match="metric"):
        SearchSetting().score({"a": 1, "b": 2})
    with pytest.raises(ConfigError, match="'acc' is not among"):
        s.score({"loss": 1.0})
    assert SearchSetting(evaluate="math:sqrt").evaluation()(4.0) == 2.0
    with pytest.raises(ConfigError, match="cannot import .no_such_module_x."):
        SearchSetting(evaluate="no_such_module_x:f").evaluation()

    store, base_sd, b, target = setup
    # the evaluation names no metric but returns two: a library error naming the metric, nothing saved
    sched = RAMSchedule(
        store,
        "b",
        merge_every=4,
        durable=False,
        search=SearchSetting(evaluate=lambda m: {"x": 1.0, "y": 2.0}, budget=3),
    )
    sched.attach(_net())
    before = _copy(b)
    with pytest.raises(RamLiveError, match="metric"):
        sched.on_step(b, 4)
    for k, v in before.items():
        assert torch.equal(_bits(b.state_dict()[k]), _bits(v)), k
    assert not (store / "_search" / "b").exists() or not any((store / "_search" / "b").iterdir())
    # no evaluation at all
    sched = RAMSchedule(store, "b", merge_every=4, durable=False, search=SearchSetting(budget=3))
    sched.attach(_net())
    with pytest.raises(ConfigError, match="needs an evaluation"):
        sched.on_step(b, 8)


def _ddp_search(rank, tmp, targets):
    """Both ranks hold the same replicated model; each scores candidates against its own target: the search
    sees the mean over ranks, so both choose the same merge."""
    b = _net()
    _train(b, 2)
    target = targets[rank]
    setting = SearchSetting(evaluate=lambda m: {"d": _distance(m, target)}, metric="d", mode="min", budget=10)
    sched = RAMSchedule(tmp / "store", "b", merge_every=4, search=setting, durable=False)
    sched.attach(_net())
    metrics = sched.on_step(b, 4)
    (tmp / f"rank{rank}.json").write_text(
        json.dumps({"best": sched.last_search["best"], "score": metrics["ram/search/best_score"]})
    )


def test_ddp_ranks_choose_the_same_merge_on_scores_averaged_over_ranks(setup, tmp_path):
    from tests.test_distributed import spawn

    store, base_sd, b, target = setup
    other = {k: v + 0.3 for k, v in target.items()}
    spawn(_ddp_search, store.parent, [target, other])
    ranks = [json.loads((store.parent / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    snaps = SnapshotStore(store).latest_all(["a", "b"])
    m = _net()
    m.load_state_dict(merge(snaps, base=base_sd, **load_choice(store / "_search" / "b" / "step_4.json")))
    assert ranks[0]["score"] == pytest.approx((_distance(m, target) + _distance(m, other)) / 2, rel=1e-9)


class _PromptDistance:
    """A prompt-by-prompt evaluation (the protocol search races on): prompt i of task t scores the negated
    distance of the model to target t; every prompt of a task scores alike."""

    def __init__(self, targets: dict[str, dict[str, torch.Tensor]], per_task: int = 9):
        self.targets, self.tasks = targets, [t for t in targets for _ in range(per_task)]
        self.models = []

    def prompt_tasks(self):
        return list(self.tasks)

    def prompt_scores(self, model, indices):
        self.models.append(model)
        dist = {t: -_distance(model, tg) for t, tg in self.targets.items()}
        return [dist[self.tasks[i]] for i in indices]

    def aggregate(self, values):
        tasks = {
            t: sum(v for i, v in values.items() if self.tasks[i] == t) / sum(1 for i in values if self.tasks[i] == t)
            for t in dict.fromkeys(self.tasks[i] for i in values)
        }
        return sum(tasks.values()) / len(tasks), tasks

    def __call__(self, model):
        return self.aggregate(dict(enumerate(self.prompt_scores(model, range(len(self.tasks))))))[0]


def test_a_prompt_budget_races_on_the_training_model_and_logs_each_task(setup):
    store, base_sd, b, target = setup
    other = {k: v * 1.01 for k, v in target.items()}
    ev = _PromptDistance({"math": target, "code": other})
    setting = SearchSetting(evaluate=ev, budget="6x", fidelity="halving", seed=1)
    sched = RAMSchedule(store, "b", merge_every=4, search=setting, durable=False)
    sched.attach(_net())
    before = _copy(b)
    metrics = sched.on_step(b, 4)
    assert ev.models and all(m is b for m in ev.models)  # every slice scored on the training model, swapped in
    for k, v in before.items():
        assert torch.equal(_bits(b.state_dict()[k]), _bits(v)), k
    rec = sched.last_search
    snaps = SnapshotStore(store).latest_all(["a", "b"])
    m = _net()
    m.load_state_dict(merge(snaps, base=base_sd, **load_choice(rec["file"])))
    assert metrics["ram/search/eval/math"] == pytest.approx(-_distance(m, target), rel=1e-12)
    assert metrics["ram/search/eval/code"] == pytest.approx(-_distance(m, other), rel=1e-12)
    body = json.loads(open(rec["file"]).read())
    assert any(t["fidelity"] < 1 for t in body["history"]["history"])  # the race stopped some candidates early
    plain = RAMSchedule(
        store,
        "b",
        merge_every=4,
        durable=False,
        search=SearchSetting(evaluate=lambda m: 1.0, budget="3x", fidelity="halving"),
    )
    plain.attach(_net())
    with pytest.raises(ConfigError, match="fidelity='halving' needs an evaluation that scores prompts"):
        plain.on_step(b, 8)


def test_sampler_storage_and_study_are_checked_like_the_other_options(tmp_path):
    from ram_live.training.preflight import check_search, check_storage_ranks

    for bad, match in (
        ({"sampler": "random"}, "search sampler must be"),
        ({"sampler": object()}, "search sampler must be"),
        ({"study": "s"}, "needs storage="),
        ({"storage": 3}, "storage must be"),
        ({"storage": "sqlite:///s.db", "study": ""}, "study must be"),
        ({"storage": "sqlite://"}, "in this process's memory"),  # a resumed job could not read it
        ({"storage": "sqlite:///:memory:"}, "in this process's memory"),
        ({"storage": "sqlite+pysqlite:///file:s?mode=memory&uri=true"}, "in this process's memory"),
    ):
        with pytest.raises(ConfigError, match=match):
            SearchSetting(**bad)
    url = f"sqlite:///{tmp_path / 's.db'}"
    s = SearchSetting.from_mapping({"sampler": "optuna-tpe", "storage": url, "study": "grpo", "budget": 4})
    assert s.study_name("coder", 200, "run1") == "grpo:coder:run1:step_200"
    assert SearchSetting(storage=url).study_name("coder", 8) == "ram_live:coder:step_8"
    assert SearchSetting().study_name("coder", 8) is None
    options = s.search_options("coder", 200, "run1")
    assert options["sampler"] == "optuna-tpe" and options["storage"] == url
    assert options["study"] == "grpo:coder:run1:step_200" and options["budget"] == 4
    optuna = pytest.importorskip("optuna")
    for storage in (
        optuna.storages.InMemoryStorage(),
        optuna.storages.RDBStorage("sqlite://"),
        optuna.storages.get_storage("sqlite:///:memory:"),  # wrapped in Optuna's cache
    ):
        with pytest.raises(ConfigError, match="in this process's memory"):
            SearchSetting(storage=storage)
    described = SearchSetting(sampler=optuna_sampler()).describe()
    assert described["sampler"] == "optuna:TPESampler" and described["storage"] is None
    json.dumps(s.describe())
    # the pre-flight: the storage opened once (a database that cannot be made fails now), one process only
    assert check_search(s, lambda m: 1.0) and (tmp_path / "s.db").exists()
    broken = SearchSetting(storage=f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 's.db'}")
    with pytest.raises(ConfigError, match="could not open"):
        check_search(broken, lambda m: 1.0)
    check_storage_ranks(s, 1)
    with pytest.raises(ConfigError, match="2 ranks"):
        check_storage_ranks(s, 2)


def optuna_sampler():
    optuna = pytest.importorskip("optuna")
    return optuna.samplers.TPESampler(seed=0)


def test_storage_keeps_each_merge_in_a_study_of_its_own_and_a_resumed_run_scores_nothing_again(setup, tmp_path):
    optuna = pytest.importorskip("optuna")
    store, base_sd, b, target = setup
    calls = []

    def held_out(model):
        calls.append(1)
        return -_distance(model, target)

    url = f"sqlite:///{tmp_path / 'search.db'}"
    setting = SearchSetting(evaluate=held_out, budget=6, seed=1, sampler="tpe", storage=url, study="grpo")
    first = RAMSchedule(store, "b", merge_every=4, search=setting, durable=False)
    first.attach(_net())
    state = first.state_dict()  # the checkpoint before the merge of step 4 (a job killed during its search)
    first.on_step(b, 4)
    scored = len(calls)
    assert scored == 6
    # the job resumed from that checkpoint redoes the merge of step 4: its search is taken from the study
    again = RAMSchedule(store, "b", merge_every=4, search=setting, durable=False)
    again.load_state_dict(state)
    again.attach(_net())
    assert again.run == first.run
    again.on_step(b, 4)
    assert len(calls) == scored and again.last_search["best"] == first.last_search["best"]
    # without the study the same resumed job scores its candidates again (what the storage saved)
    fresh = RAMSchedule(store, "b", merge_every=4, search=replace(setting, storage=None, study=None), durable=False)
    fresh.load_state_dict(state)
    fresh.attach(_net())
    fresh.on_step(b, 4)
    assert len(calls) == 2 * scored
    calls.clear()
    calls.extend([1] * scored)
    assert first.last_search["sampler"] == "tpe" and first.last_search["setting"]["storage"] == url
    # the next merge is a search (a study) of its own, scored anew
    first.on_step(b, 8)
    assert len(calls) == 2 * scored
    names = sorted(optuna.get_all_study_names(url))
    assert [n.rsplit(":", 1)[0] for n in names] == [f"grpo:b:{first.run}:step_4", f"grpo:b:{first.run}:step_8"]
    study = optuna.load_study(study_name=names[0], storage=url)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == scored
    # the per-agent weights of task arithmetic as the trials' params (what optuna-dashboard plots)
    weights = [t for t in done if t.user_attrs["method"] == "task_arithmetic"]
    assert weights and all(set(t.params) == {"w:a", "w:b"} for t in weights)
    assert {(t.params["w:a"], t.params["w:b"]) for t in weights} >= {(1.0, 1.0), (3.0, 1.0)}
