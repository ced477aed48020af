"""search(storage=..., study=...): a killed search resumes from the study without scoring a candidate again; two
processes sharing a sqlite study split the work and both end with the trials of one."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ram_live
from ram_live.errors import ConfigError, SearchError
from sampler_problem import BlockEval, agents

optuna = pytest.importorskip("optuna")
HERE = Path(__file__).resolve().parent


def _search(evaluate, **kwargs):
    models, base = agents()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ram_live.ExtrapolationWarning)
        return ram_live.search(models, base=base, evaluate=evaluate, progress=False, **kwargs)


def _trials(result):
    return [(t.family, t.method, t.to_dict()["options"], t.score, t.fidelity, t.stop) for t in result.history]


@pytest.mark.parametrize(
    "options",
    [{"budget": 14}, {"budget": "14x", "fidelity": "halving", "sampler": "tpe"}],
    ids=["moves", "tpe-race"],
)
def test_a_killed_search_resumes_without_scoring_again(tmp_path, options):
    whole = BlockEval()
    reference = _search(whole, seed=2, **options)
    url = f"sqlite:///{tmp_path / 'search.db'}"
    killed = BlockEval(fail_after=whole.calls // 2)
    with pytest.raises(SearchError):
        _search(killed, seed=2, storage=url, study="s", **options)
    resumed = BlockEval()
    result = _search(resumed, seed=2, storage=url, study="s", **options)
    assert _trials(result) == _trials(reference)
    assert result.best == reference.best
    # the RAM counting passes: each merged once (one taken for an outcome of the study counts once too)
    assert result.statistics_passes == reference.statistics_passes > 0
    # every call before the kill was kept: only the rest is scored again
    assert resumed.calls == whole.calls - killed.fail_after
    again = BlockEval()
    replayed = _search(again, seed=2, storage=url, study="s", **options)
    assert _trials(replayed) == _trials(reference)
    assert again.calls == 0 and replayed.statistics_passes == reference.statistics_passes
    study = optuna.load_study(study_name="s", storage=url)
    states = {t.state.name for t in study.trials}
    assert "COMPLETE" in states and "RUNNING" not in states


def test_another_search_under_the_same_study_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    _search(BlockEval(), budget=3, seed=0, storage=url, study="s")
    with pytest.raises(ConfigError, match="holds another search"):
        _search(BlockEval(), budget=3, seed=1, storage=url, study="s")
    with pytest.raises(ConfigError, match="needs storage="):
        _search(BlockEval(), budget=3, study="s")
    # the same settings over other weights (agents of the same names retrained): its scores are not theirs
    models, base = agents()
    models = {name: {"w": tensors["w"] * 3} for name, tensors in models.items()}
    with pytest.raises(ConfigError, match="inputs differ"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ram_live.ExtrapolationWarning)
        ram_live.search(
            models, base=base, evaluate=BlockEval(), budget=3, seed=0, progress=False, storage=url, study="s"
        )
    with pytest.raises(ConfigError, match="storage must be"):
        _search(BlockEval(), budget=3, storage=3)


WORKER = """
import json, sys, time, warnings
from pathlib import Path
sys.path.insert(0, {here!r})
import ram_live
from sampler_problem import BlockEval, agents
folder = Path({folder!r})
(folder / f"ready{{sys.argv[1]}}").write_text("")
while not (folder / "go").exists():
    time.sleep(0.05)
models, base = agents()
ev = BlockEval(delay=0.15)
warnings.simplefilter("ignore")
r = ram_live.search(models, base=base, evaluate=ev, seed=1, progress=False,
                    storage="sqlite:///" + str(folder / "search.db"), study="shared", **{options})
print(json.dumps({{"calls": ev.calls, "best": r.best, "trials": [t.to_dict()["options"] for t in r.history]}}))
"""


@pytest.mark.parametrize(
    "options",
    [{"budget": 16}, {"budget": "16x", "fidelity": "halving", "sampler": "tpe"}],
    ids=["moves", "tpe-race"],
)
def test_two_processes_sharing_a_study_split_the_work(tmp_path, options):
    alone = BlockEval()
    reference = _search(alone, seed=1, **options)
    script = WORKER.format(here=str(HERE), folder=str(tmp_path), options=repr(options))
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(2)
    ]
    import time

    deadline = time.time() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.time() < deadline, "the workers did not start"
        time.sleep(0.1)
    (tmp_path / "go").write_text("")
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    expected = [t.to_dict()["options"] for t in reference.history]
    for o in outs:
        assert o["trials"] == expected
        assert o["best"] == json.loads(json.dumps(ram_live.selection.to_json(reference.best)))
    calls = [o["calls"] for o in outs]
    study = optuna.load_study(study_name="shared", storage=f"sqlite:///{tmp_path / 'search.db'}")
    scored = [t.user_attrs["ram_live:key"] for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(scored) == len(set(scored)) >= len(reference.history)  # no candidate scored twice
    if "fidelity" not in options:  # one call a candidate (raced: one a slice)
        assert len(scored) == sum(calls)
        assert max(calls) < alone.calls and min(calls) >= 1  # both did part of it
    else:  # the sampler's proposals, each scored by one of the two: the sampled phase is in the study once
        kept = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
        sampled = [t for t in kept if t.user_attrs["family"].startswith("sampled:")]
        assert len(sampled) == sum(t.family.startswith("sampled:") for t in reference.history) > 0
        # (how the work splits depends on timing here: a candidate scored ahead against a side's best that has
        # changed by the time the search reaches it is keyed by another reference, and scored again)


def test_parallel_workers_record_in_the_study_and_resume(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    reference = _search(BlockEval(), budget=8, seed=3)
    first = _search(BlockEval(), budget=8, seed=3, parallel=2, storage=url, study="p")
    assert _trials(first) == _trials(reference)
    again = BlockEval()
    resumed = _search(again, budget=8, seed=3, storage=url, study="p")
    assert _trials(resumed) == _trials(reference) and again.calls == 0


def test_the_command_line_resumes_from_its_storage(tmp_path, capsys):
    import sampler_problem
    from safetensors.torch import save_file

    from ram_live.cli import main

    models, base = agents()
    for name, sd in {"base": base, **models}.items():
        (tmp_path / name).mkdir()
        save_file(sd, str(tmp_path / name / "model.safetensors"))
    (tmp_path / "base" / "config.json").write_text('{"model_type": "tiny"}')
    url = f"sqlite:///{tmp_path / 'search.db'}"
    args = [*(f"{n}={tmp_path / n}" for n in models), "--base", str(tmp_path / "base")]
    args += ["--eval", "sampler_problem:plain_score", "--budget", "10", "--storage", url, "--study", "cli"]
    sampler_problem.CALLS.clear()
    assert main(["search", *args, "--sampler", "optuna-tpe", "--out", str(tmp_path / "a"), "--quiet"]) == 0
    first = len(sampler_problem.CALLS)
    assert first == 10
    assert main(["search", *args, "--sampler", "optuna-tpe", "--out", str(tmp_path / "b"), "--quiet"]) == 0
    assert len(sampler_problem.CALLS) == first  # all of it taken from the study
    a = json.loads((tmp_path / "a" / "search.json").read_text())
    b = json.loads((tmp_path / "b" / "search.json").read_text())
    timeless = [[{k: v for k, v in t.items() if not k.endswith("_seconds")} for t in run["history"]] for run in (a, b)]
    assert a["sampler"] == b["sampler"] == "optuna:TPESampler" and timeless[0] == timeless[1]
    assert any(t["family"].startswith("sampled:") for t in a["history"])
    # another sampler is another search: refused under the same study
    assert main(["search", *args, "--sampler", "tpe", "--out", str(tmp_path / "c"), "--quiet"]) == 2
    assert "holds another search" in capsys.readouterr().err


def test_a_claim_left_by_a_killed_process_is_abandoned(tmp_path):
    import socket

    from optuna.trial import TrialState, create_trial

    url = f"sqlite:///{tmp_path / 'search.db'}"
    reference = _search(BlockEval(), budget=4, seed=0, storage=url, study="first")
    first = reference.history[0]
    key = next(t.user_attrs["ram_live:key"] for t in optuna.load_study(study_name="first", storage=url).trials)
    # a study where a process (gone: no such pid on this host) claimed the first candidate and was killed
    study = optuna.create_study(storage=url, study_name="second", direction="maximize")
    dead = f"{socket.gethostname()}:99999999:gone"
    study.add_trial(create_trial(state=TrialState.RUNNING, user_attrs={"ram_live:key": key, "ram_live:owner": dead}))
    ev = BlockEval()
    result = _search(ev, budget=4, seed=0, storage=url, study="second")
    assert _trials(result) == _trials(reference) and result.history[0].score == first.score
    states = [t.state for t in optuna.load_study(study_name="second", storage=url).trials]
    assert states[0] == TrialState.FAIL and TrialState.RUNNING not in states


def test_the_trials_params_are_their_point_in_the_arms_box(tmp_path):
    url = f"sqlite:///{tmp_path / 'search.db'}"
    result = _search(
        BlockEval(), budget="12x", fidelity="halving", sampler="optuna-tpe", seed=1, storage=url, study="p"
    )
    assert result.sampler == "optuna:TPESampler"
    trials = {
        json.dumps(t.user_attrs["options"], sort_keys=True): t
        for t in optuna.load_study(study_name="p", storage=url).trials
    }
    names = list(agents()[0])
    sampled = [t for t in result.history if t.family == "sampled:task_arithmetic"]
    assert len(sampled) >= 3
    for t in sampled:  # the sampler's per-agent weights, as Optuna params with the box's distribution
        stored = trials[json.dumps(t.to_dict()["options"], sort_keys=True)]
        assert stored.params == {f"w:{a}": pytest.approx(w) for a, w in zip(names, t.options["weights"])}
        dist = stored.distributions[f"w:{names[0]}"]
        assert isinstance(dist, optuna.distributions.FloatDistribution) and dist.low == 0.0 and dist.high >= 3.0
    ties = [t for t in result.history if t.method == "ties"]
    assert ties
    for t in ties:  # a TIES screen point: density and scale
        stored = trials[json.dumps(t.to_dict()["options"], sort_keys=True)]
        assert stored.params == {"density": t.options["density"], "scale": t.options["scale"]}
