"""Evaluations inside a Ray job run in a Ray actor, never in the driver (integrations/verl/remote.py and
evaluation.py): a real local Ray (2 CPUs, no GPU, one ``fake_gpu`` custom resource standing for a GPU that the
tests ask for with ``ram.eval_resources``). The actor's process is another than the driver's; its metrics equal the
local evaluation's exactly; errors come back as the local error; a cluster without a GPU is refused at start-up;
an actor nobody can place, or an evaluation that runs too long, is an error naming ``ram.eval_timeout``.

Functions below are named by dotted path (``test_verl_remote:...``): the actor imports this module (the fixture
puts tests/verl and tests on the workers' PYTHONPATH). Each records its process id in ``$RAM_LIVE_TEST_PIDS``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live.errors import ConfigError, EvaluationError, SearchError
from ram_live.integrations.verl import RAMVerl, evaluation, options_from_mapping
from ram_live.store import SnapshotStore

HERE = Path(__file__).resolve().parent
FAKE_GPU = {"resources": {"fake_gpu": 1}}


def _record() -> None:
    with open(os.environ["RAM_LIVE_TEST_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\n")


def weights_score(merged_dir: str, step: int | None = None) -> dict[str, float]:
    """A deterministic evaluation of a merged folder: the squared norm of its weights, and the step."""
    _record()
    sd = load_file(os.path.join(merged_dir, "model.safetensors"))
    return {"norm": sum(float(sd[k].double().pow(2).sum()) for k in sorted(sd)), "seen_step": float(step or 0)}


def broken(merged_dir: str, step: int | None = None) -> dict[str, float]:
    _record()
    raise ValueError(f"no held-out data for step {step}")


def sleepy(merged_dir: str, step: int | None = None) -> dict[str, float]:
    time.sleep(120)
    return {"never": 0.0}


def length_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's convention; rewards long completions and a right first letter."""
    _record()
    return {"score": len(solution_str) + (1.0 if solution_str.startswith(ground_truth[:1]) else 0.0)}


def failing_score(data_source, solution_str, ground_truth, extra_info=None):
    _record()
    raise ZeroDivisionError("the reward divided by zero")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray with 2 CPUs, no GPU and one ``fake_gpu``; its workers import this folder's modules."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray job is already running in this process")
    pids = tmp_path_factory.mktemp("pids") / "pids.txt"
    pids.write_text("")
    with pytest.MonkeyPatch.context() as mp:
        path = [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
        mp.setenv("RAM_LIVE_TEST_PIDS", str(pids))
        ray.init(num_cpus=2, num_gpus=0, resources={"fake_gpu": 1}, include_dashboard=False, log_to_driver=False)
        try:
            yield SimpleNamespace(ray=ray, pids=pids)
        finally:
            ray.shutdown()


def _pids(cluster: SimpleNamespace) -> set[int]:
    """The process ids recorded since the last call (the file is emptied)."""
    found = {int(line) for line in cluster.pids.read_text().split()}
    cluster.pids.write_text("")
    return found


def _local(monkeypatch: pytest.MonkeyPatch, make):
    """``make()`` as if no Ray job ran: its evaluations are local."""
    with monkeypatch.context() as mp:
        mp.setattr(evaluation, "ray_if_running", lambda: None)
        return make()


def _toy(tmp: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """A base folder of small fp32 weights, and a store under ``tmp/store`` with two agents' snapshots at step 3."""
    g = torch.Generator().manual_seed(0)
    base = {
        "model.layer.weight": torch.randn(8, 6, generator=g),
        "model.layer.bias": torch.randn(8, generator=g),
        "lm_head.weight": torch.randn(5, 8, generator=g),
    }
    folder = tmp / "base_model"
    folder.mkdir()
    save_file(base, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "toy"}')
    return folder, base


def _snapshots(store: Path, base: dict[str, torch.Tensor]) -> None:
    writer = SnapshotStore(store, durable=False)
    for i, name in enumerate(["a", "b"]):
        g = torch.Generator().manual_seed(10 + i)
        writer.writer(name, base=base).snapshot(
            {
                k: v + torch.randn(v.shape, generator=g) * 0.1 * (torch.rand(v.shape, generator=g) < 0.5)
                for k, v in base.items()
            },
            3,
        )


def _options(tmp: Path, folder: Path, merged: str, **extra):
    values = {
        "store": str(tmp / "store"),
        "agent": "a",
        "base": str(folder),
        "weights": "fp32",
        "merge_every": 1,
        "merged_dir": str(tmp / merged),
        **extra,
    }
    return options_from_mapping(values)


def _untimed(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if "seconds" not in k}


@pytest.fixture
def rewards_run(tmp_path):
    """The tiny Llama of tests/evaluate_helpers.py saved as the base, and a held-out prompts file (verl's rows)."""
    pytest.importorskip("transformers")
    import evaluate_helpers as h

    tok, base = h.tokenizer(), h.model(0)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    with open(tmp_path / "val.jsonl", "w") as f:
        for p, a in zip(h.PROMPTS, h.ANSWERS):
            f.write(json.dumps({"prompt": p, "data_source": "toy", "reward_model": {"ground_truth": a}}) + "\n")
    sd = base.state_dict()
    _snapshots(tmp_path / "store", {k: v.float() for k, v in sd.items()})
    return tmp_path


def test_evaluate_runs_in_the_actor_and_scores_as_locally(ray_cluster, tmp_path, monkeypatch):
    folder, base = _toy(tmp_path)
    _snapshots(tmp_path / "store", base)
    remote = RAMVerl(
        _options(tmp_path, folder, "m_remote", evaluate="test_verl_remote:weights_score", eval_resources=FAKE_GPU)
    )
    assert remote.evaluations.remote is not None and remote.evaluations.remote.resources == FAKE_GPU
    _pids(ray_cluster)
    got = remote.merge(step=3)
    in_actor = _pids(ray_cluster)
    assert in_actor == {remote.evaluations.remote.pid} and os.getpid() not in in_actor  # not the driver
    local = _local(
        monkeypatch, lambda: RAMVerl(_options(tmp_path, folder, "m_local", evaluate="test_verl_remote:weights_score"))
    )
    assert local.evaluations.remote is None
    expected = local.merge(step=3)
    assert _pids(ray_cluster) == {os.getpid()}
    assert _untimed(got) == _untimed(expected) and got["ram/seen_step"] == 3.0 and got["ram/norm"] > 0
    # the actor stays for the next merge (one placement, one process), and the last save frees it
    remote.merge(step=4)
    assert _pids(ray_cluster) == in_actor
    remote.last_snapshot_step = 4  # (no checkpoint folder here: the save at the last step merely ends the run)
    remote.on_save(4, str(tmp_path), last=True)
    assert remote.evaluations.remote.actor is None


def test_search_with_the_runs_reward_in_the_actor(ray_cluster, rewards_run, monkeypatch):
    """ram.search with ram.rewards: the driver writes each candidate's folder, the actor (one model, loaded once)
    scores it; the chosen merge and every logged number equal the local search's."""
    tmp = rewards_run

    def options(merged: str, **extra):
        return _options(
            tmp,
            tmp / "base",
            merged,
            search={"budget": 3, "space": ["task_arithmetic"]},
            rewards={
                "prompts": str(tmp / "val.jsonl"),
                "compute_score": "test_verl_remote:length_score",
                "max_new_tokens": 6,
            },
            **extra,
        )

    remote = RAMVerl(options("m_remote", eval_resources=FAKE_GPU))
    assert remote.evaluations.search.key == remote.evaluations.evaluate.key == "evaluate"  # one model in the actor
    _pids(ray_cluster)
    got = remote.merge(step=3)
    in_actor = _pids(ray_cluster)
    assert in_actor == {remote.evaluations.remote.pid} and os.getpid() not in in_actor
    local = _local(monkeypatch, lambda: RAMVerl(options("m_local")))
    expected = local.merge(step=3)
    assert _pids(ray_cluster) == {os.getpid()}
    assert _untimed(got) == _untimed(expected)
    assert got["ram/reward"] > 0 and got["ram/search/evaluations"] == expected["ram/search/evaluations"] >= 1
    chosen = [
        json.loads((tmp / m / "a" / "global_step_3" / "ram_merge.json").read_text())["search"]["best"]
        for m in ("m_remote", "m_local")
    ]
    assert chosen[0] == chosen[1]
    assert [p.name for p in (tmp / "m_remote" / "a").iterdir()] == ["global_step_3"]  # the candidate folder is gone
    remote.close()


def test_errors_come_back_as_the_local_error(ray_cluster, rewards_run, monkeypatch):
    tmp = rewards_run
    folder = str(tmp / "base")

    def raised(make, *args) -> BaseException:
        ram = make()
        with pytest.raises(Exception) as err:
            ram.evaluate(*args) if args else ram.merge(step=3)
        ram.close()
        return err.value

    def rewards(merged: str, **extra):
        return _options(
            tmp,
            tmp / "base",
            merged,
            rewards={
                "prompts": str(tmp / "val.jsonl"),
                "max_new_tokens": 4,
                "compute_score": "test_verl_remote:failing_score",
            },
            **extra,
        )

    # a reward function that raises: ram_live.evaluate's EvaluationError, the same here and there
    there = raised(lambda: RAMVerl(rewards("m1", eval_resources=FAKE_GPU)), folder, 1)
    here = raised(lambda: _local(monkeypatch, lambda: RAMVerl(rewards("m1"))), folder, 1)
    assert type(there) is type(here) is EvaluationError
    assert str(there) == str(here) and "failing_score" in str(here) and there.function == here.function
    assert any("raised in the evaluation actor" in n for n in getattr(there, "__notes__", []))
    _pids(ray_cluster)
    # the user's evaluation that raises: an EvaluationError naming it, the same here and there
    plain = {"evaluate": "test_verl_remote:broken"}
    there = raised(lambda: RAMVerl(_options(tmp, tmp / "base", "m2", eval_resources=FAKE_GPU, **plain)), folder, 5)
    here = raised(lambda: _local(monkeypatch, lambda: RAMVerl(_options(tmp, tmp / "base", "m2", **plain))), folder, 5)
    assert type(there) is type(here) is EvaluationError and str(there) == str(here)
    assert (
        str(here)
        == (f"ram.evaluate test_verl_remote:broken raised ValueError on {folder}: no held-out data for step 5")
        and here.function == "ram.evaluate test_verl_remote:broken"
    )
    # in a search: the search's SearchError, naming the function, here and there
    search = {"search": {"budget": 2, "space": ["task_arithmetic"], "evaluate": "test_verl_remote:broken"}}
    there = raised(lambda: RAMVerl(_options(tmp, tmp / "base", "m3", eval_resources=FAKE_GPU, **search)))
    here = raised(lambda: _local(monkeypatch, lambda: RAMVerl(_options(tmp, tmp / "base", "m4", **search))))
    for err in (there, here):
        assert type(err) is SearchError
        assert "raised EvaluationError on candidate" in str(err)
        assert "ram.search.evaluate test_verl_remote:broken raised ValueError" in str(err)
    pids = _pids(ray_cluster)
    assert os.getpid() in pids and len(pids) >= 2  # this process's and the actors'


def test_a_cluster_without_gpu_is_refused_at_start_up(ray_cluster, rewards_run):
    tmp = rewards_run
    prompts = {"prompts": str(tmp / "val.jsonl"), "compute_score": "test_verl_remote:length_score"}

    def build(**extra) -> RAMVerl:
        return RAMVerl(_options(tmp, tmp / "base", "m", **extra))

    for extra in (
        {"evaluate": "test_verl_remote:weights_score"},
        {"rewards": prompts},
        {"rewards": {**prompts, "device": "cuda"}},
        {"evaluate": "test_verl_remote:weights_score", "eval_resources": {"num_gpus": 0.5}},
        {"rewards": {**prompts, "device": "cpu"}, "eval_resources": {"num_gpus": 1}},
    ):
        with pytest.raises(ConfigError, match=r"^ram: the Ray cluster has no GPU and .* never generates there") as e:
            build(**extra)
        assert "\n" not in str(e.value)
    assert "ram.rewards would" in str(pytest.raises(ConfigError, build, rewards=prompts).value)
    # asked for explicitly: a CPU Ray worker (still not the driver)
    ram = build(rewards={**prompts, "device": "cpu"})
    assert ram.evaluations.remote.resources == {"num_cpus": 1}
    ram = build(evaluate="test_verl_remote:weights_score", eval_resources={"num_cpus": 1, "memory": 2**28})
    assert ram.evaluations.remote.resources == {"num_cpus": 1, "memory": 2**28}
    assert build().evaluations.remote is None  # nothing to evaluate: nothing asked for
    with pytest.raises(ConfigError, match=r"^ram.eval_resources=.*GPU"):
        build(evaluate="test_verl_remote:weights_score", eval_resources={"resources": {"GPU": 1}})  # Ray's check


def test_timeouts_name_the_key(ray_cluster, tmp_path):
    folder, _ = _toy(tmp_path)
    ram = RAMVerl(
        _options(
            tmp_path,
            folder,
            "m",
            evaluate="test_verl_remote:weights_score",
            eval_timeout=2,
            eval_resources={"resources": {"nobody_has_this": 1}},
        )
    )
    t0 = time.monotonic()
    with pytest.raises(
        EvaluationError,
        match=r"^ram.eval_timeout: the evaluation actor for ram.evaluate "
        r"test_verl_remote:weights_score .* was not placed within 2 s .*held "
        r"by verl's workers.*fractional num_gpus",
    ) as err:
        ram.evaluate(str(folder), step=1)
    assert "\n" not in str(err.value) and time.monotonic() - t0 < 30
    assert ram.evaluations.remote.actor is None  # killed: it holds nothing
    # placed (by a first, quick evaluation), then one that runs past the timeout
    ram = RAMVerl(
        _options(
            tmp_path,
            folder,
            "m",
            evaluate="test_verl_remote:sleepy",
            eval_timeout=20,
            eval_resources=FAKE_GPU,
            search={"budget": 1, "evaluate": "test_verl_remote:weights_score", "metric": "norm"},
        )
    )
    assert ram.evaluations.search(str(folder), step=1)["norm"] > 0
    with pytest.raises(
        EvaluationError,
        match=r"^ram.eval_timeout: ram.evaluate test_verl_remote:sleepy did not "
        r"finish on .* within 20 s",
    ):
        ram.evaluate(str(folder), step=1)
    assert ram.evaluations.remote.actor is None
    assert ram.evaluations.search(str(folder), step=2)["seen_step"] == 2.0  # a new actor for the next one
    ram.close()


def test_eval_keys_are_checked(tmp_path):
    folder, _ = _toy(tmp_path)
    cases = [
        ({"eval_resources": 1}, r"ram.eval_resources must be a mapping"),
        ({"eval_resources": {"num_gpu": 1}}, r"unknown ram.eval_resources option\(s\) num_gpu; the options are"),
        ({"eval_resources": {"num_gpus": -1}}, r"ram.eval_resources.num_gpus must be a finite number >= 0"),
        ({"eval_resources": {"num_cpus": True}}, r"ram.eval_resources.num_cpus must be"),
        ({"eval_resources": {"resources": {"x": "a"}}}, r"ram.eval_resources.resources.x must be"),
        ({"eval_resources": {"resources": []}}, r"ram.eval_resources.resources must be a mapping"),
        ({"eval_resources": {"accelerator_type": 3}}, r"ram.eval_resources.accelerator_type must be a string"),
        ({"eval_timeout": 0}, r"ram.eval_timeout must be a finite number of seconds > 0"),
        ({"eval_timeout": float("inf")}, r"ram.eval_timeout must be"),
        ({"eval_timeout": "1h"}, r"ram.eval_timeout must be"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match="^" + message):
            _options(tmp_path, folder, "m", **extra)
    opts = _options(
        tmp_path, folder, "m", eval_resources={"num_gpus": 0.25, "resources": {"eval_gpu": 1}}, eval_timeout=60
    )
    assert opts.eval_resources == {"num_gpus": 0.25, "resources": {"eval_gpu": 1}} and opts.eval_timeout == 60.0
    assert (
        _options(tmp_path, folder, "m").eval_timeout == 3600.0
        and _options(tmp_path, folder, "m").eval_resources is None
    )
