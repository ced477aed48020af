"""The demo (examples/quickstart.py) runs end to end on CPU and prints what it promises."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import ram_live

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")


def test_quickstart_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--out", str(tmp_path), "--seed", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout

    # The results table has one row per method: name, seconds, then percentages.
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1]}
    for method in ram_live.available_methods():
        assert method in rows, f"no table row for {method}:\n{out}"
        float(rows[method][1])
        assert rows[method][2].endswith("%")
    assert "entries by number of agents that updated them" in out  # the probe table

    png = tmp_path / "probe.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["methods"]) == set(ram_live.available_methods())
    for agent, loss in results["specialist_loss"].items():
        assert loss < results["base_loss"][agent], f"specialist {agent} does not beat the base on its own task"
    for method, r in results["methods"].items():
        assert all(math.isfinite(v) for v in [*r["kept"].values(), *r["kept_fp32"].values()]), method
    density = {a: s["density"] for a, s in results["probe"]["agents"].items()}
    assert density["coder"] < min(density["tools"], density["memory"]), density  # heterogeneous, as trained


def test_quickstart_writes_into_a_folder_of_its_own_by_default() -> None:
    import tempfile

    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    default = str(Path(tempfile.gettempdir()) / "ram_live-quickstart")
    assert f"(default:{default})" in "".join(proc.stdout.split())  # argparse wraps the help text
