"""Progress off a terminal (ram_live/progress.py): plain lines through ``logging`` at a modest rate, driven here by
counts and an injected clock (no timing), and ``ram-live search`` with its output in a file (lines) or ``--quiet``
(none)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from safetensors.torch import save_file

from ram_live.progress import LOGGER, SearchProgress, TerminalProgress, log_line


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_search_lines_every_few_candidates_and_at_the_end(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    bar = SearchProgress(every=3, clock=clock)  # stderr under pytest is not a terminal
    assert not bar.live
    bar.begin(10, False, 0)
    for i in range(10):
        clock.now += 1.0  # well under the interval: only the count decides
        bar.trial(i, f"ram_plus(r={i})", i + 1, 0.5, 0)
    bar.end()
    lines = _lines(caplog)
    assert lines[0] == "[search] started: budget 10 candidates"  # before the first candidate, however long it takes
    assert [line.split()[1] for line in lines[1:-1]] == ["1", "3", "6", "9"]  # the first, then every 3
    assert lines[2] == "[search] 3 scored  spent 3/10 candidates  best 0.5 (#0)  1 s/candidate  #2 ram_plus(r=2)"
    assert lines[-1] == "[search] 10 candidates scored in 10.0 s, best 0.5 (#0)"
    assert not any("\r" in line or "\x1b" in line for line in lines)


def test_search_lines_at_least_every_interval(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    bar = SearchProgress(every=1000, interval=30.0, clock=clock)
    bar.begin(1000, True, 200)
    for i, step in enumerate([10.0, 10.0, 10.0, 31.0, 5.0]):  # at t = 10, 20, 30, 61, 66
        clock.now += step
        bar.trial(i, "ties(density=0.5)", 0.5 * (i + 1), None, None)
    lines = _lines(caplog)
    assert lines[0] == "[search] started: budget 1000x (200000 prompts)"
    # the first (t=10); t=20 and t=30 are under 30 s after it; t=61 is 51 s after (a line); t=66 is 5 s after
    assert [line.split()[1] for line in lines[1:]] == ["1", "4"]
    assert lines[1].startswith("[search] 1 scored  spent 0.5x/1000x (100/200000 prompts)  best -  10 s/candidate")


def test_a_line_each_interval_exactly():
    """The pace by itself: due at the first step, every ``every`` steps, and once ``interval`` has passed."""
    from ram_live.progress import _Pace

    clock = Clock()
    pace = _Pace(every=4, interval=30.0, clock=clock)
    due = []
    for count, t in enumerate([0, 5, 10, 20, 29, 45, 49, 90], start=1):
        clock.now = float(t)
        due.append(pace.due(count))
    # 1: first; 4: every 4 (t=20); 5-7 (t=29, 45, 49): under 30 s after t=20; 8: every 4
    assert due == [True, False, False, True, False, False, False, True]
    clock.now = 200.0
    assert pace.due(9)  # 110 s after the last line


def test_merge_lines_each_quarter_and_the_end(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    bar = TerminalProgress(clock=clock)
    bar.start("merge", 8, 8000)
    for i in range(8):
        clock.now += 0.5
        bar.update(f"layer.{i}.weight", 1000)
    bar.close()
    lines = _lines(caplog)
    assert [line.split()[1] for line in lines] == ["1/8", "2/8", "4/8", "6/8", "8/8"]
    assert lines[-1] == "[merge] 8/8 tensors, 8.0 KB in 4.0 s (2.0 KB/s)"


def test_a_given_stream_gets_the_plain_lines_and_a_silenced_logger_none(caplog):
    stream = io.StringIO()
    bar = SearchProgress(stream, every=2, clock=Clock())
    bar.begin(4, False, 0)
    for i in range(4):
        bar.trial(i, "x", i + 1, 1.0, 0)
    bar.end()
    assert [line.split()[1] for line in stream.getvalue().splitlines()] == ["started:", "1", "2", "4", "4"]
    caplog.set_level(logging.WARNING, logger=LOGGER)
    log_line("not shown")
    assert _lines(caplog) == []


def test_the_search_logs_by_default_and_nothing_with_false(problem_search, caplog):
    search, agents, base, ev = problem_search
    caplog.set_level(logging.INFO, logger=LOGGER)
    result = search(agents, base=base, evaluate=ev, budget=3)
    lines = _lines(caplog)
    assert lines[0] == "[search] started: budget 3 candidates"
    assert lines[1].startswith("[search] 1 scored  spent 1/3 candidates")
    assert lines[-1].startswith(f"[search] {len(result.history)} candidates scored in ")
    caplog.clear()
    search(agents, base=base, evaluate=ev, budget=3, progress=False)
    assert _lines(caplog) == []


@pytest.fixture
def problem_search(base_sd):
    from tests.conftest import make_agents

    from ram_live import search

    agents = dict(zip(("a", "b"), make_agents(base_sd, [0.3, 0.3], scale=0.05)))

    def ev(merged):
        return -sum(float(v.double().abs().sum()) for v in merged.values())

    return search, agents, base_sd, ev


EVAL = """
def score(merged):
    return -sum(float(v.double().abs().sum()) for v in merged.values())
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_ram_live_search_into_a_file_logs_progress_unless_quiet(tmp_path, base_sd, quiet):
    from tests.conftest import make_agents

    paths = []
    for name, sd in {"base": base_sd, **dict(zip(("a", "b"), make_agents(base_sd, [0.3, 0.3])))}.items():
        (tmp_path / name).mkdir()
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / name / "model.safetensors"))
        paths.append(f"{name}={tmp_path / name}" if name != "base" else "")
    (tmp_path / "base" / "config.json").write_text('{"model_type": "tiny"}')
    (tmp_path / "evals.py").write_text(textwrap.dedent(EVAL))
    args = [sys.executable, "-m", "ram_live", "search", *[p for p in paths if p], "--base", str(tmp_path / "base")]
    args += ["--eval", "evals:score", "--budget", "4", "--out", str(tmp_path / "out"), "--space", '["ram_plus"]']
    args += ["--quiet"] if quiet else []
    with open(tmp_path / "log.txt", "w") as log:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(args, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=300)
    text = (tmp_path / "log.txt").read_text()
    assert done.returncode == 0, text
    progress = [line for line in text.splitlines() if " ram_live [search] " in line]
    if quiet:
        assert progress == [] and "[search]" not in text
    else:
        assert progress[0].split(" ram_live ")[1] == "[search] started: budget 4 candidates"
        assert progress[1].split(" ram_live ")[1].startswith("[search] 1 scored  spent 1/4 candidates")
        assert progress[-1].split(" ram_live ")[1].startswith("[search] 4 candidates scored in ")
        assert all("\r" not in line and "\x1b" not in line for line in progress)


def test_ram_live_merge_into_a_file_logs_each_stage(tmp_path, base_sd):
    from tests.conftest import make_agents

    args = [sys.executable, "-m", "ram_live", "merge"]
    for name, sd in {"base": base_sd, **dict(zip(("a", "b"), make_agents(base_sd, [0.3, 0.3])))}.items():
        (tmp_path / name).mkdir()
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / name / "model.safetensors"))
        args += [f"{name}={tmp_path / name}"] if name != "base" else []
    args += ["--base", str(tmp_path / "base"), "--method", "ram_plus", "--out", str(tmp_path / "out.safetensors")]
    with open(tmp_path / "log.txt", "w") as log:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(args, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=300)
    text = (tmp_path / "log.txt").read_text()
    assert done.returncode == 0, text
    lines = [line.split(" ram_live ", 1)[1] for line in text.splitlines() if " ram_live [" in line]
    assert lines and any(" tensors, " in line and " in " in line for line in lines)  # each stage's end
    assert all("\r" not in line and "\x1b" not in line for line in lines)


def _rank_worker(rank: int, root: str) -> None:
    """One rank of a two-process gloo group: progress with no stream of its own, logged into its own file."""
    import torch.distributed as dist

    handler = logging.FileHandler(os.path.join(root, f"rank{rank}.log"))
    logging.getLogger(LOGGER).addHandler(handler)
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=2)
    try:
        bar = SearchProgress(every=1, clock=Clock())
        bar.begin(2, False, 0)
        for i in range(2):
            bar.trial(i, "x", i + 1, 1.0, 0)
        bar.end()
        tensors = TerminalProgress(clock=Clock())
        tensors.start("merge", 2, 20)
        for i in range(2):
            tensors.update(f"t{i}", 10)
        tensors.close()
        mine = io.StringIO()  # a stream given: written on every rank
        bar = SearchProgress(mine, every=1, clock=Clock())
        bar.begin(1, False, 0)
        bar.end()
        with open(os.path.join(root, f"stream{rank}.txt"), "w") as fh:
            fh.write(mine.getvalue())
        handler.flush()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # as tests/test_distributed.py: skip the interpreter's teardown of gloo


def test_under_torch_distributed_only_rank_0_reports(tmp_path):
    """Every rank of a DDP job runs the same search (RAMSchedule's search=) and their stderr shares one log: rank 0
    writes the progress lines, the others none, unless given a stream of their own."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs gloo")
    import time

    ctx = mp.start_processes(_rank_worker, args=(str(tmp_path),), nprocs=2, start_method="spawn", join=False)
    end = time.monotonic() + 240
    while not ctx.join(timeout=1):  # True once every rank has exited (an error in one is raised here)
        if time.monotonic() > end:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("the ranks did not finish within 240 s")
    zero = (tmp_path / "rank0.log").read_text().splitlines()
    assert zero[0] == "[search] started: budget 2 candidates" and zero[-1].startswith("[merge] 2/2 tensors, ")
    assert [line.split()[1] for line in zero] == ["started:", "1", "2", "2", "1/2", "2/2"]
    assert (tmp_path / "rank1.log").read_text() == ""
    for rank in (0, 1):
        assert (tmp_path / f"stream{rank}.txt").read_text().splitlines()[0] == "[search] started: budget 1 candidates"


def test_the_librarys_logger_at_warning_silences_progress_and_levels_are_left_alone(caplog):
    """``logging.getLogger("ram_live").setLevel(WARNING)``, the usual way to quiet a library, silences the progress
    lines; no level is set on any logger by writing one; with the root at WARNING (its default), they still show."""
    caplog.set_level(logging.INFO)  # the root's capture handler takes INFO
    parent, child = logging.getLogger("ram_live"), logging.getLogger(LOGGER)
    before = (parent.level, child.level)
    try:
        parent.setLevel(logging.WARNING)
        log_line("hidden")
        assert _lines(caplog) == [] and child.level == logging.NOTSET
        parent.setLevel(logging.NOTSET)
        logging.getLogger().setLevel(logging.WARNING)
        log_line("shown")
        assert _lines(caplog) == ["shown"] and child.level == logging.NOTSET
        child.setLevel(logging.DEBUG)  # a level set on the logger itself decides, below its parent's
        parent.setLevel(logging.WARNING)
        log_line("shown again")
        assert _lines(caplog) == ["shown", "shown again"]
    finally:
        parent.setLevel(before[0])
        child.setLevel(before[1])
