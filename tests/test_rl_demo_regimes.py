"""The demo's regimes and N agents (issue 24): task generation for up to 8 agents, the settings of both regimes,
argument checks, and (slower) a sparse ``--quick`` run whose density map must show the paper's pattern."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from rl_demo import regimes  # noqa: E402
from rl_demo.lang import ALL_TASKS, TASK_TOKEN, make_prompts, tasks_for, vocab_for  # noqa: E402

sys.path.remove(str(ROOT / "examples"))

REFERENCE = {
    "shift": lambda d: [(x + 3) % 10 for x in d],
    "rev": lambda d: d[::-1],
    "sort": sorted,
    "comp": lambda d: [9 - x for x in d],
    "rot": lambda d: d[2:] + d[:2],
    "sortd": lambda d: sorted(d, reverse=True),
    "swap": lambda d: [d[1], d[0], d[3], d[2], d[4]],
    "dbl": lambda d: [2 * x % 10 for x in d],
}


@pytest.mark.parametrize("task", ALL_TASKS)
def test_every_task_is_checkable(task: str) -> None:
    p, a = make_prompts(task, torch.Generator().manual_seed(1), 64)
    assert p.shape == (64, 7) and a.shape == (64, 5)
    assert (p[:, 0] == TASK_TOKEN[task]).all() and (p[:, 6] == 13).all()
    for row, ans in zip(p[:, 1:6].tolist(), a.tolist()):
        assert ans == REFERENCE[task](row)


def test_tasks_and_vocabulary() -> None:
    assert tasks_for(3) == ("shift", "rev", "sort") and vocab_for(tasks_for(3)) == 16
    assert tasks_for(5) == ("shift", "rev", "sort", "comp", "rot") and vocab_for(tasks_for(5)) == 16
    assert vocab_for(tasks_for(8)) == 20
    assert len(set(TASK_TOKEN.values())) == 8 and max(TASK_TOKEN.values()) < 20 and 13 not in TASK_TOKEN.values()
    with pytest.raises(ValueError):
        tasks_for(9)


@pytest.mark.parametrize("regime", ["dense", "sparse"])
@pytest.mark.parametrize("n", [3, 5, 8])
def test_settings_have_a_recipe_per_task(regime: str, n: int) -> None:
    for quick in (False, True):
        s, target = regimes.settings(regime, tasks_for(n), quick)
        assert set(s.recipes) == set(tasks_for(n)) and 0 < target < 1
    assert [m[2].get("scale") for m in regimes.methods(n)][0] == pytest.approx(1 / n)


def test_dense_three_agents_are_todays_settings() -> None:
    from rl_demo.train import DEFAULT, QUICK

    assert regimes.settings("dense", tasks_for(3), False)[0] == DEFAULT
    assert regimes.settings("dense", tasks_for(3), True)[0] == QUICK


def test_agents_out_of_range_is_an_argument_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rl_merge_demo.py"), "--agents", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--agents" in proc.stderr


SPARSE_ARGS = ["--regime", "sparse", "--quick"]


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rl_demo_sparse")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rl_merge_demo.py"), *SPARSE_ARGS, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def sparse_run(sparse_dir: Path) -> dict:
    return json.loads((sparse_dir / "results.json").read_text())


def test_reuse_trained_gives_the_same_table_without_training(sparse_dir: Path, sparse_run: dict) -> None:
    """--reuse-trained merges the agents the run left (no training: every row bit for bit); a folder whose
    settings differ, or whose training did not finish (no trained.json), is not taken."""
    import argparse

    from rl_demo import regimes, reuse
    from rl_demo.lang import tasks_for

    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "rl_merge_demo.py"),
            *SPARSE_ARGS,
            "--out",
            str(sparse_dir),
            "--reuse-trained",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = json.loads((sparse_dir / "results.json").read_text())
    assert "reused_training" in again["timings"] and "rl" not in again["timings"]
    assert again["accuracy"] == sparse_run["accuracy"] and again["density"] == sparse_run["density"]
    tasks = tasks_for(3)
    s, target = regimes.settings("sparse", tasks, True)
    args = argparse.Namespace(seed=0, threads=1)
    assert reuse.load(sparse_dir, args, s, tasks, target) is not None
    assert reuse.load(sparse_dir, argparse.Namespace(seed=1, threads=1), s, tasks, target) is None
    assert reuse.load(sparse_dir, args, regimes.settings("dense", tasks, True)[0], tasks, target) is None
    reuse.forget(sparse_dir)
    assert reuse.load(sparse_dir, args, s, tasks, target) is None


def test_sparse_regime_has_the_papers_density_pattern(sparse_run: dict) -> None:
    """One agent changes about 5 % of the entries or fewer (bf16; the paper's coding agent: 3.2 %), one ≥ 30 %;
    unique shares span ≥ 5×. The training's float32 sums differ between CPUs: the sparse agent changed 5.2 % on an
    Intel Xeon with AVX-512 and under 5 % on an AMD EPYC, so the bound is 6 %."""
    res = sparse_run
    assert res["regime"] == "sparse" and res["tasks"] == ["shift", "rev", "sort"] and res["agents"] == 3
    dens, uniq = res["density"], res["unique_share"]
    assert set(dens) == set(uniq) == set(res["tasks"])
    assert min(dens.values()) <= 0.06 and max(dens.values()) >= 0.30, dens
    assert max(uniq.values()) >= 5 * min(uniq.values()), uniq
    assert len(res["probe"]["histogram"]) == 4


def test_sparse_regime_scores_every_row(sparse_run: dict) -> None:
    acc = sparse_run["accuracy"]
    rows = {
        "base",
        "TA (1/N)",
        "TA (tuned)",
        "TIES",
        "DARE+TA",
        "DARE+TIES",
        "RAM",
        "RAM+",
        "RAM+s",
        "RAM (sign)",
        "RAM+ (sign)",
        "RAM (curvature)",
        "RAM+ (curvature)",
        "RAM (curvature, bc)",
        *(f"specialist {t}" for t in sparse_run["tasks"]),
    }
    assert set(acc) == rows
    for name, row in acc.items():
        assert row["mean"] == pytest.approx(sum(row[t] for t in sparse_run["tasks"]) / 3), name
