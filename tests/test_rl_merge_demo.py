"""End to end: examples/rl_merge_demo.py --quick --search (base SFT, GRPO specialists through the snapshot store,
probe, every merge method scored, the merge ram_live.search picks on the selection split). Checks structure and
sanity, not a particular winner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ram_live
from ram_live.store import SnapshotStore

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("shift", "rev", "sort")
METHODS = (
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
    "search",
)
BUDGET = 10


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("rl_demo")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "rl_merge_demo.py"),
            "--quick",
            "--search",
            "--search-budget",
            str(BUDGET),
            "--out",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def test_files_and_every_method_scored(run: tuple[Path, dict]) -> None:
    out, res = run
    for name in ("results.json", "results.png", "probe.png", "base.safetensors", "merged_ram.safetensors"):
        assert (out / name).stat().st_size > 0, name
    acc = res["accuracy"]
    expected = {"base", *(f"specialist {t}" for t in TASKS), *METHODS}
    assert set(acc) == expected
    for name, row in acc.items():
        assert set(row) == {*TASKS, "mean"}, name
        assert all(0.0 <= v <= 1.0 for v in row.values()), (name, row)
        assert row["mean"] == pytest.approx(sum(row[t] for t in TASKS) / len(TASKS))
    for m in METHODS:
        assert res["merge_seconds"][m] is not None and res["merge_seconds"][m] >= 0
    assert set(res["lambdas"]["RAM+"]) == set(TASKS)
    assert all(1.0 <= v <= 1.2 + 1e-9 for v in res["lambdas"]["RAM+"].values())
    assert 100_000 < res["parameters"] < 1_000_000


def test_specialists_beat_the_base_on_their_own_task(run: tuple[Path, dict]) -> None:
    acc = run[1]["accuracy"]
    for t in TASKS:
        assert acc[f"specialist {t}"][t] > acc["base"][t], (t, acc[f"specialist {t}"][t], acc["base"][t])


def test_task_vectors_are_partial_and_differ_in_density(run: tuple[Path, dict]) -> None:
    dens = run[1]["density"]
    assert all(0.0 < d < 1.0 for d in dens.values()), dens
    assert max(dens.values()) - min(dens.values()) > 0.05, dens


def test_ram_output_equals_the_engine_merge_of_the_saved_agents(run: tuple[Path, dict]) -> None:
    out, _ = run
    store = SnapshotStore(out / "store", create=False)
    agents = store.latest_all(TASKS)
    base = load_file(str(out / "base.safetensors"))
    for variant in ("ram", "ram_plus"):
        saved = load_file(str(out / f"merged_{variant}.safetensors"))
        mine = ram_live.merge(agents, base=base, method=variant)  # None: plain RAM
        assert set(mine) == set(saved)
        for k, v in saved.items():
            assert mine[k].dtype == v.dtype == torch.bfloat16, k
            assert torch.equal(mine[k].view(torch.int16), v.view(torch.int16)), (variant, k)


def test_curvature_row_is_the_merge_with_the_stored_importances(run: tuple[Path, dict]) -> None:
    """Every specialist's latest snapshot carries importances (Adam: exp_avg_sq; SGD: a Fisher), the curvature
    row is merge(store.latest_all(), method="ram", importance="stored") bit for bit, and it differs from plain RAM."""
    out, res = run
    store = SnapshotStore(out / "store", create=False)
    agents = store.latest_all(TASKS)
    assert all(agents[t].importance is not None for t in TASKS)
    base = load_file(str(out / "base.safetensors"))
    mine, info = ram_live.merge(agents, base=base, method="ram", importance="stored", return_info=True)
    assert info.extra["importance"] == "stored"
    saved = load_file(str(out / "merged_ram_curvature.safetensors"))
    plain = load_file(str(out / "merged_ram.safetensors"))
    assert set(mine) == set(saved)
    for k, v in saved.items():
        assert torch.equal(mine[k].view(torch.int16), v.view(torch.int16)), k
    assert any(not torch.equal(saved[k], plain[k]) for k in saved)
    assert res["rl"]["shift"]["importance"] == "fisher" and res["rl"]["rev"]["importance"] == "adam exp_avg_sq"


def test_search_row_is_merge_of_best_and_within_budget(run: tuple[Path, dict]) -> None:
    from ram_live.selection import from_json

    out, res = run
    row = res["search"]["search"]
    assert 1 <= row["evaluations"] <= BUDGET == res["search_budget"]
    assert len(row["history"]["history"]) >= row["evaluations"]
    assert row["selection"] == max(t["score"] for t in row["history"]["history"] if t["score"] is not None)
    assert res["accuracy"]["search"] == row["test"]
    assert 0.0 <= row["overhead_share"] <= 1.0
    store = SnapshotStore(out / "store", create=False)
    base = load_file(str(out / "base.safetensors"))
    best = from_json(row["best"])
    if isinstance(best.get("importance"), dict):  # the snapshots' own importances (JSON keeps only their names):
        del best["importance"]  # without importance=, merge uses exactly those
    mine = ram_live.merge(store.latest_all(TASKS), base=base, **best)
    saved = load_file(str(out / "merged_search.safetensors"))
    assert set(mine) == set(saved)
    for k, v in saved.items():
        assert torch.equal(mine[k].view(torch.int16), v.view(torch.int16)), k
    assert (out / "search.png").stat().st_size > 0


def test_selection_split_is_disjoint_from_the_test_prompts() -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from rl_demo.lang import make_prompts
        from rl_demo.selection import selection_split
    finally:
        sys.path.remove(str(ROOT / "examples"))
    g = torch.Generator().manual_seed(10_000)
    test = {t: make_prompts(t, g, 3000) for t in TASKS}  # 3000 of 10^5 strings: chance overlaps are certain
    sel = selection_split(test, 500, seed=0)
    for t in TASKS:
        p, a = sel[t]
        assert p.shape == (500, 7) and a.shape == (500, 5)
        taken = {tuple(r) for r in test[t][0][:, 1:].tolist()}
        assert not taken & {tuple(r) for r in p[:, 1:].tolist()}, t
        digits = p[:, 1:6]
        ref = {"shift": (digits + 3) % 10, "rev": digits.flip(1), "sort": digits.sort(dim=1).values}[t]
        assert torch.equal(a, ref), t
