"""ram_live.selection.parallel: parallel=N gives the trials, winner and table of parallel=1 (with and without the race,
process workers and a local Ray), failures in a worker are the errors of one process, a killed worker is a
library error."""

from __future__ import annotations

import os
import time

import pytest
import torch
from safetensors.torch import save_file

from ram_live import ConfigError, SearchError, search

from conftest import assert_bit_identical, make_agents, snapshot
from search_evals import TARGET, Dies, KillOn, PromptEval, Raises, Threads

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")


@pytest.fixture
def problem(base_sd, tmp_path):
    from ram_live import merge

    agents = dict(zip(TARGET, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    targets = {
        "math": merge(agents, base=base_sd, method="ram", lambdas=TARGET),
        "code": merge(agents, base=base_sd, method="ram", lambdas={"coder": 2.5, "tools": 0.5, "memory": 2.0}),
    }
    paths = {}
    for name, sd in [("base", base_sd), *agents.items()]:
        (tmp_path / name).mkdir()
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / name / "model.safetensors"))
        paths[name] = tmp_path / name
    return agents, base_sd, PromptEval(targets), paths


def _rows(result):
    return [
        (t.index, t.family, t.method, repr(t.options), t.score, t.fidelity, t.tasks, t.stop, t.extrapolation, t.phase)
        for t in result.history
    ]


def _table(result):
    """The table without its timing columns and time line."""
    lines = result.table().splitlines()
    return [line[: line.find("  ", 60)] if i else line for i, line in enumerate(lines) if "merge" not in line or i == 0]


@pytest.mark.parametrize("fidelity", [None, "halving"])
def test_two_process_workers_give_the_one_process_search(problem, fidelity):
    agents, base, ev, paths = problem
    kwargs = dict(budget="10x", fidelity=fidelity, seed=1)
    one = search(agents, base=base, evaluate=ev, **kwargs)
    two = search(agents, base=base, evaluate=ev, parallel=2, **kwargs)
    assert _rows(two) == _rows(one)
    assert two.best == one.best and two.spent == one.spent and two.statistics_passes == one.statistics_passes
    assert _table(two) == _table(one)
    # files: each worker memory-maps them itself
    files = search({n: paths[n] for n in agents}, base=paths["base"], evaluate=ev, parallel=3, **kwargs)
    assert _rows(files) == _rows(one)


def test_a_local_ray_gives_the_one_process_search(problem):
    ray = pytest.importorskip("ray")
    agents, base, ev, _ = problem
    one = search(agents, base=base, evaluate=ev, budget="8x", fidelity="halving")
    # the test's evaluation class lives in tests/: the Ray workers need it on their path (a user's is installed)
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}},
        include_dashboard=False,
        log_to_driver=False,
    )
    try:  # inside a Ray job: search uses it without an address
        on_ray = search(agents, base=base, evaluate=ev, budget="8x", fidelity="halving", parallel=2)
    finally:
        ray.shutdown()
    assert _rows(on_ray) == _rows(one) and on_ray.best == one.best


def test_a_failure_in_a_worker_is_the_error_of_one_process(problem):
    agents, base, ev, _ = problem
    errors = []
    for parallel in (1, 2):
        with pytest.raises(SearchError) as info:
            search(agents, base=base, evaluate=Raises(ev.targets), budget=4, parallel=parallel)
        errors.append(info.value)
    assert str(errors[0]) == str(errors[1])
    assert "raised KeyError on candidate #0" in str(errors[1]) and "'answer' missing" in str(errors[1])
    assert type(errors[1].__cause__) is KeyError and errors[1].candidate == errors[0].candidate


def test_a_killed_worker_is_a_library_error(problem):
    agents, base, ev, _ = problem
    with pytest.raises(SearchError, match="an evaluation worker died while scoring candidate #0"):
        search(agents, base=base, evaluate=Dies(ev.targets), budget=4, parallel=2)


def test_bad_parallel_options(problem):
    agents, base, ev, _ = problem
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ConfigError, match="parallel must be an int >= 1"):
            search(agents, base=base, evaluate=ev, budget=2, parallel=bad)
    with pytest.raises(ConfigError, match="cannot be pickled.*not a lambda"):
        search(agents, base=base, evaluate=lambda m: 0.0, budget=2, parallel=2)
    with pytest.raises(ConfigError, match="ray_address must be a string"):
        search(agents, base=base, evaluate=ev, budget=2, ray_address=3)


def test_workers_compute_with_the_search_process_thread_count(problem):
    """Float sums can depend on the thread count: the workers use the search process's."""
    agents, base, ev, _ = problem
    one = search(agents, base=base, evaluate=Threads(ev.targets), budget=2)
    two = search(agents, base=base, evaluate=Threads(ev.targets), budget=2, parallel=2)
    assert [t.score for t in two.history] == [t.score for t in one.history] == [float(torch.get_num_threads())] * 2


def test_a_worker_that_dies_on_a_candidate_the_search_never_needed_costs_only_a_restart(problem, tmp_path):
    agents, base, ev, _ = problem
    kw = dict(budget=14, space=["task_arithmetic", "ta_weights"], seed=0)
    logs = {}
    for p in (1, 2):
        log = tmp_path / f"log{p}"
        search(agents, base=base, evaluate=KillOn(ev.targets, str(log)), parallel=p, **kw)
        logs[p] = log.read_text().split()
    speculative = [m for m in logs[2] if m not in set(logs[1])]
    assert speculative, "parallel=2 prefetched a candidate parallel=1 never scored"
    one = search(agents, base=base, evaluate=KillOn(ev.targets, str(tmp_path / "a")), **kw)
    two = search(
        agents, base=base, evaluate=KillOn(ev.targets, str(tmp_path / "b"), victim=speculative[0]), parallel=2, **kw
    )
    assert _rows(two) == _rows(one)


def test_a_prefetch_after_a_worker_died_restarts_the_pool(problem, tmp_path):
    """A worker that died on a prefetched candidate breaks the pool; the loop's next prefetch (before it asks for
    any outcome) restarts it rather than raising BrokenProcessPool out of the search."""
    from concurrent.futures.process import BrokenProcessPool

    from ram_live.selection.fidelity import Scorer
    from ram_live.selection.outcome import run_candidate
    from ram_live.selection.parallel import Pool, make_merger

    agents, base, ev, _ = problem
    victim = {"method": "task_arithmetic", "scale": 0.7}
    other = {"method": "task_arithmetic", "scale": 0.4}
    merger = make_merger(agents, base, None, None)
    merged, _, _ = merger.merge(victim)
    mark = f"{float(merged['head.weight'].double().sum()):.12e}"
    scorer = Scorer(KillOn(ev.targets, str(tmp_path / "log"), victim=mark))
    expected = run_candidate(merger, Scorer(ev), other, None).scored.score
    pool = Pool(2, (agents, base, None, None, scorer))
    try:
        pool.submit("victim", victim, None)
        with pytest.raises(BrokenProcessPool):
            pool.pending["victim"][0].result(timeout=120)
        pool.submit("other", other, None)  # raised BrokenProcessPool
        assert "victim" not in pool.pending
        assert pool.score("other", other, None, "#1").scored.score == expected
    finally:
        pool.close(abort=True)


def _kill(ray, actor):
    """``ray.kill`` returns before the actor is dead: a call made at once may still be served."""
    ray.kill(actor)
    for _ in range(600):
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    pytest.fail("the killed actor still answers")


def test_a_ray_actor_that_died_is_replaced_and_what_it_held_scored_again(problem, tmp_path):
    """On Ray, work queued on an actor that died (on a prefetched candidate) is scored again on a new actor in its
    place; a candidate that kills its actor again is a SearchError naming it."""
    ray = pytest.importorskip("ray")
    from ram_live.selection.fidelity import Scorer
    from ram_live.selection.outcome import run_candidate
    from ram_live.selection.parallel import Pool, make_merger

    agents, base, ev, _ = problem
    victim = {"method": "task_arithmetic", "scale": 0.7}
    others = [{"method": "task_arithmetic", "scale": s} for s in (0.4, 0.5)]
    merger = make_merger(agents, base, None, None)
    merged, _, _ = merger.merge(victim)
    mark = f"{float(merged['head.weight'].double().sum()):.12e}"
    expected = [run_candidate(merger, Scorer(ev), c, None).scored.score for c in others]
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}},
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        pool = Pool(2, (agents, base, None, None, Scorer(KillOn(ev.targets, str(tmp_path / "log"), victim=mark))))
        first = pool._actors[0]
        pool.submit("victim", victim, None)  # on actor 0
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pool.pending["victim"][0], timeout=120)
        pool.submit("a", others[0], None)  # on actor 1
        pool.submit("b", others[1], None)  # queued on the dead actor 0
        assert pool.pending["b"][2] == (0, first)
        assert [pool.score(k, c, None, f"#{i}").scored.score for i, (k, c) in enumerate(zip("ab", others))] == expected
        assert pool._actors[0] is not first
        with pytest.raises(SearchError, match=r"a Ray evaluation worker died while scoring candidate #7: "):
            pool.score("victim", victim, None, "#7")
        # both actors lost at once (a node): work queued on either is scored again on its own slot's new actor
        for actor in pool._actors:
            _kill(ray, actor)
        pool._next = 0
        for key, candidate in zip("abc", [*others, others[0]]):
            pool.submit(key, candidate, None)  # a -> slot 0, b -> slot 1, c -> slot 0
        pool.discard(["b"])  # slot 1 keeps its dead actor
        assert pool.score("a", others[0], None, "#0").scored.score == expected[0]  # slot 0 gets a new actor
        assert pool.score("c", others[0], None, "#2").scored.score == expected[0]  # on it, not on slot 1's dead one
        pool.close()
    finally:
        ray.shutdown()


def test_store_snapshots_and_checkpoint_files_go_to_the_workers_as_files(problem, tmp_path):
    """A store's snapshots (memory-mapped, checksummed files) and safetensors checkpoints are sent to the workers
    as where they lie: each worker opens them itself, and the search is the one-process search."""
    from ram_live.store import SnapshotStore

    agents, base, ev, _ = problem
    store = SnapshotStore(tmp_path / "store")
    for name, sd in agents.items():
        store.writer(name, base=base).snapshot(sd, step=1)
    snaps = store.latest_all()
    one = search(snaps, evaluate=ev, budget="6x", fidelity="halving")
    two = search(store.latest_all(), evaluate=ev, budget="6x", fidelity="halving", parallel=2)
    assert _rows(two) == _rows(one) and two.best == one.best


# ------------------------------------------------------------------ a new user's search: models held by evaluate


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread here and so in the workers: a tiny model's generation is no faster on more, only dearer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def new_user(tmp_path_factory, one_thread):
    """Three tiny Llama agents saved as folders (the base with its locally built tokenizer), a verl-layout parquet
    of three data sources and the TRL-style reward functions of ``tests/parallel_rewards.py``."""
    pytest.importorskip("transformers")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import evaluate_helpers as h

    root = tmp_path_factory.mktemp("new_user")
    base = h.model(0)
    base.save_pretrained(root / "base")
    h.tokenizer().save_pretrained(root / "base")
    agents = {}
    for i, name in enumerate(["math", "code", "chat"]):
        g = torch.Generator().manual_seed(10 + i)
        agent = h.model(0)
        with torch.no_grad():
            for tensor in agent.state_dict().values():
                mask = torch.rand(tensor.shape, generator=g) < 0.3
                tensor.add_(torch.randn(tensor.shape, generator=g) * 0.05 * mask)
        agent.save_pretrained(root / name)
        agents[name] = str(root / name)
    sources = ["openai/gsm8k", "math", "code"]
    rows = [
        {
            "data_source": sources[i % 3],
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": "test", "index": i},
        }
        for i, (prompt, answer) in enumerate(zip(h.PROMPTS * 2, h.ANSWERS * 2))
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "val.parquet")
    return agents, str(root / "base"), str(root / "val.parquet")


def _evaluation(parquet, model, tokenizer):
    from ram_live.evaluate import rewards

    from parallel_rewards import first_char, has_a

    return rewards(
        parquet,
        [first_char, has_a],
        model=model,
        tokenizer=tokenizer,
        samples=4,
        metric="pass@4",
        max_new_tokens=4,
        batch_size=64,
    )


RACED = dict(budget="20x", fidelity="halving", seed=0)  # at "10x" the workers rarely overlapped


@pytest.fixture(scope="module")
def one_process(new_user):
    """The new user's raced search in one process (the evaluation loads the base folder, scored first)."""
    agents, base, parquet = new_user
    evaluate = _evaluation(parquet, model=base, tokenizer=base)
    evaluate(base)
    return search(agents, base=base, evaluate=evaluate, **RACED)


def test_a_new_users_raced_search_on_two_workers_is_the_one_process_search(new_user, one_process):
    """The evaluation holds the model it loads each candidate into (the base was scored first): every worker
    scores on a model of its own, so the trials are those of one process and of a direct evaluation."""
    from ram_live import merge

    agents, base, parquet = new_user
    one = one_process
    assert len({t.score for t in one.history}) >= 3  # the candidates score apart: a mixed-up model would show
    direct = _evaluation(parquet, model=base, tokenizer=base)(merge(agents, base=base, **one.history[0].candidate))
    assert one.history[0].fidelity == 1.0 and one.history[0].score == direct
    evaluate = _evaluation(parquet, model=base, tokenizer=base)
    evaluate(base)  # the evaluation now holds the loaded base
    for _ in range(2):
        two = search(agents, base=base, evaluate=evaluate, parallel=2, **RACED)
        assert _rows(two) == _rows(one)
        assert two.best == one.best and _table(two) == _table(one)


def test_an_evaluation_holding_a_module_gives_each_worker_its_own(new_user, one_process):
    """``rewards(..., model=<module>)``: each candidate's state dict is loaded into the module, in each worker
    into its own copy; the caller's module is left as it was."""
    import evaluate_helpers as h

    agents, base, parquet = new_user
    module = h.model(0)
    before = snapshot(module)
    two = search(agents, base=base, evaluate=_evaluation(parquet, model=module, tokenizer=base), parallel=2, **RACED)
    assert _rows(two) == _rows(one_process) and two.best == one_process.best
    assert_bit_identical(snapshot(module), before)
