"""``ram_live.training.failures`` under torch.distributed (two CPU processes, gloo): a failure on one rank only (the
evaluation, a search candidate's score, rank 0's snapshot write, rank 0's picks, rank 1's opening them) reaches every
rank at the next agreement, so every rank leaves the merge together, warns (``on_error="warn"``) and trains on, and
the next merge succeeds on both; nothing is left waiting in a collective (a hang fails the test at its deadline)."""

from __future__ import annotations

import json
import os
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ram_live.errors import ConfigError, MergeFailedWarning
from ram_live.store import LocalCollective, SnapshotWriter
from ram_live.training.failures import agreeing, check_on_error, error_line, guarded
from ram_live.training.schedule import RAMSchedule
from ram_live.training.search import SearchSetting

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

DEADLINE_S = 240
STEPS = 6


def _evaluate(rank: int, where: str) -> Any:
    def evaluate(model: nn.Module) -> dict[str, float]:
        if where in (f"evaluate@{rank}", f"search@{rank}") and _STEP[0] == 4:
            raise ValueError(f"rank {rank}'s judge is down")
        return {"score": float(model.weight.sum())}

    return evaluate


_STEP = [0]


def _worker(rank: int, root: str, where: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=2)
    report: dict[str, Any] = {"rank": rank}
    try:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        evaluate = _evaluate(rank, where)
        search = SearchSetting(evaluate=evaluate, metric="score", budget=3, space=["task_arithmetic"])
        schedule = RAMSchedule(
            Path(root) / "store", "a", snapshot_every=2, merge_every=2, evaluate=evaluate,
            search=search if where.startswith("search") else None,
            snapshot_activity="abs" if where.startswith("open") else "changed", snapshot_eps=0.0,
        )  # fmt: skip
        schedule.attach(model)
        write = SnapshotWriter.write

        def write_fails_at_4(self: SnapshotWriter, capture: Any, step: int, **kw: Any) -> Any:
            if step == 4:
                raise OSError(28, "No space left on device")
            return write(self, capture, step, **kw)

        if where == "write@0":
            SnapshotWriter.write = write_fails_at_4  # type: ignore[method-assign]
        if where == "picks@0" and rank == 0:
            agents = schedule.store.agents
            schedule.store.agents = lambda: (
                (_ for _ in ()).throw(OSError("stale NFS handle")) if _STEP[0] == 4 else agents()
            )
        if where == "open@1" and rank == 1:  # a lossy snapshot is opened from the store to merge it
            open_ = schedule.store.open
            schedule.store.open = lambda *a, **k: (
                (_ for _ in ()).throw(OSError("bad sector")) if _STEP[0] == 4 else open_(*a, **k)
            )
        caught: list[str] = []
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for step in range(1, STEPS + 1):
                _STEP[0] = step
                with torch.no_grad():
                    model.weight.add_(0.01 * step)  # the same update on both ranks, as DDP keeps them
                with guarded(schedule, "loop", "merge", step):
                    schedule.on_step(model, step)
        caught = [f"{w.message.step}|{w.message.error}" for w in seen if isinstance(w.message, MergeFailedWarning)]
        report["warnings"] = caught
        report["history"] = [h["step"] for h in schedule.history]
        report["errors"] = schedule.errors
        total = torch.tensor([float(step)])
        dist.all_reduce(total)  # both ranks reach the end, in step
        report["sum"] = float(total.item())
        report["ok"] = True
    except BaseException:
        report["ok"], report["error"] = False, traceback.format_exc()
    finally:
        (Path(root) / f"report{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()
    os._exit(0)  # as tests/test_distributed.py: skip the interpreter's teardown of gloo


def _run(where: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ram_live_fail_") as tmp:
        ctx = mp.start_processes(_worker, args=(tmp, where), nprocs=2, start_method="spawn", join=False)
        end = time.monotonic() + DEADLINE_S
        while not ctx.join(timeout=1):
            if time.monotonic() > end:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"{where}: the ranks did not finish within {DEADLINE_S} s (a rank waits in a collective)")
        return [json.loads((Path(tmp) / f"report{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize(
    ("where", "own"),
    [
        ("evaluate@1", "ValueError: rank 1's judge is down"),  # the evaluation, on rank 1 only
        ("search@1", "rank 1's judge is down"),  # a search candidate's score, on rank 1 only (a SearchError)
        ("write@0", "No space left on device"),  # rank 0 writes the snapshot
        ("picks@0", "stale NFS handle"),  # rank 0 picks the snapshots to merge
        ("open@1", "OSError: bad sector"),  # rank 1 opens the picked snapshots
    ],
)
def test_a_failure_on_one_rank_reaches_every_rank_and_training_goes_on(where: str, own: str) -> None:
    reports = _run(where)
    for rep in reports:
        assert rep["ok"], rep.get("error")
        assert rep["sum"] == 2.0 * STEPS and rep["errors"] == 1
        assert rep["history"] == [2.0, 6.0]  # the merge of step 4 failed on every rank; step 6's succeeded
    # the failing rank warns with its own error; the other with RemoteRankError where it is rank 0, else not at all
    failing = int(where[-1])
    mine, other = reports[failing]["warnings"], reports[1 - failing]["warnings"]
    assert len(mine) == 1 and mine[0].startswith("4|") and own in mine[0]
    if failing == 1:
        assert len(other) == 1 and other[0].startswith("4|") and "RemoteRankError" in other[0]
        assert "rank 0: another rank failed" in other[0]
    else:
        assert other == []


def test_agreeing_in_one_process_is_the_block_itself() -> None:
    with pytest.raises(ValueError, match="x"):
        with agreeing(LocalCollective(), "a test"):
            raise ValueError("x")
    with agreeing(LocalCollective(), "a test"):
        pass


def test_guarded_turns_an_exception_into_one_warning_and_keeps_interrupts() -> None:
    class Host:
        on_error, errors, last_error, agent, collective = "warn", 0, None, "a", LocalCollective()

    host = Host()
    with pytest.warns(MergeFailedWarning, match=r"the merge at step 3 failed \(OSError: disk\s+gone\)") as rec:
        with guarded(host, "loop", "merge", 3) as outcome:
            raise OSError("disk\n  gone")
    assert outcome.failed and outcome.error == "OSError: disk gone" and host.errors == 1
    assert rec[0].message.step == 3 and host.last_error == {"step": 3, "what": "merge", "error": "OSError: disk gone"}
    for interrupt in (KeyboardInterrupt, SystemExit):
        with pytest.raises(interrupt):
            with guarded(host, "loop", "merge", 4):
                raise interrupt()
    host.on_error = "raise"
    with pytest.raises(OSError):
        with guarded(host, "loop", "merge", 5):
            raise OSError("disk gone")
    assert host.errors == 1
    assert error_line(ValueError("a" * 400)).endswith("...") and len(error_line(ValueError("a" * 400))) < 320
    with pytest.raises(ConfigError):
        check_on_error("warning")
