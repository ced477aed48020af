"""The store with real processes: writers killed with SIGKILL (a few trials here; 50 in
``benchmarks/crash_trials.py --trials 50``), and two writers (pruning) plus a merger at the same time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import crash_trials

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")


def test_writer_killed_at_random_moments_leaves_earlier_snapshots_intact(tmp_path):
    r = crash_trials.crash_trials(2, seed=1, store_dir=str(tmp_path / "store"), max_delay=0.8)
    assert r["failures"] == [] and r["killed"] == 2
    # every snapshot ever committed is still listed and was checked bit-exactly after each kill
    assert r["snapshots_checked"] >= r["snapshots_committed"]


def test_two_writers_and_a_merger_see_no_torn_snapshot(tmp_path):
    r = crash_trials.concurrency(1.5, store_dir=str(tmp_path / "store"))
    assert r["n_errors"] == 0, r["errors"]
    assert r["reads"] >= 2 and min(r["commits"]) >= 1
