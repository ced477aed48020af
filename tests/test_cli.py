"""The ram-live command line: probe and merge from files, one-line errors with exit codes."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from ram_live import UnsupportedInputError, merge
from ram_live.cli import main
from tests.conftest import assert_bit_identical, make_agents


def test_probe_json_and_table(files, capsys):
    tmp, base, agents, paths = files
    assert main(["probe", *paths, "--base", str(tmp / "base.safetensors"), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["agents"]) == ["coder", "tools", "memory"]
    assert main(["probe", *paths, "--base", str(tmp / "base.safetensors")]) == 0
    assert "rho" in capsys.readouterr().out


def test_merge_with_method_options(files, capsys):
    tmp, base, agents, paths = files
    out = tmp / "ties.safetensors"
    code = main(
        [
            "merge",
            *paths,
            "--base",
            str(tmp / "base.safetensors"),
            "--out",
            str(out),
            "--method",
            "ties",
            "-O",
            "density=0.3",
            "-O",
            "weights=[1, 2, 0.5]",
            "--dtype",
            "bf16",
            "--quiet",
        ]
    )
    assert code == 0
    expected = merge(agents, base=base, method="ties", density=0.3, weights=[1, 2, 0.5], dtype=torch.bfloat16)
    assert_bit_identical(load_file(out), expected)


def test_merge_with_the_sign_elected_shared_region(files):
    tmp, base, agents, paths = files
    out = tmp / "sign.safetensors"
    assert (
        main(
            [
                "merge",
                *paths,
                "--base",
                str(tmp / "base.safetensors"),
                "--out",
                str(out),
                "--method",
                "ram_plus",
                "--shared",
                "sign",
                "--quiet",
            ]
        )
        == 0
    )
    expected = merge(agents, base=base, method="ram_plus", shared="sign")
    assert_bit_identical(load_file(out), expected)
    assert any(not torch.equal(expected[k], v) for k, v in merge(agents, base=base, method="ram_plus").items())


def test_errors_are_one_line_with_exit_code(files, capsys):
    tmp, base, agents, paths = files
    code = main(
        ["merge", *paths, "--base", str(tmp / "base.safetensors"), "--out", str(tmp / "o"), "--method", "slerp"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unknown merge method 'slerp'" in err
    code = main(["merge", paths[0], "--base", str(tmp / "missing"), "--out", str(tmp / "o")])
    assert code == 2 and "no such file" in capsys.readouterr().err
    with pytest.raises(UnsupportedInputError):
        main(["--debug", "merge", paths[0], "--base", str(tmp / "missing"), "--out", str(tmp / "o")])


def test_console_entry_point(files):
    tmp, base, agents, paths = files
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ram_live",
            "merge",
            *paths,
            "--base",
            str(tmp / "base.safetensors"),
            "--out",
            str(tmp / "m"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "[merge] 5/5 tensors" in result.stderr and "lambda: coder=" in result.stdout
    assert (tmp / "m" / "model.safetensors").exists()


def test_torchrun_distributed_merge(files):
    tmp, base, agents, paths = files
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "ram_live",
        "merge",
        *paths,
        "--base",
        str(tmp / "base.safetensors"),
        "--out",
        str(tmp / "d"),
        "--distributed",
        "--max-shard-size",
        "0.000001",
        "--quiet",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    from ram_live.io.sources import SafetensorsSource

    src = SafetensorsSource(tmp / "d")
    assert_bit_identical({k: src.get(k).clone() for k in src.keys()}, merge(agents, base=base))


def test_stores_and_merge_from_a_store(tmp_path, base_sd, capsys):
    from ram_live import SnapshotStore, merge

    store = SnapshotStore(tmp_path / "store", durable=False)
    agents = dict(zip(["coder", "tools"], make_agents(base_sd, [0.05, 0.5])))
    for step, (name, sd) in enumerate(agents.items(), start=1):
        store.writer(name, base_sd).snapshot(sd, step * 10)
    assert main(["stores", str(tmp_path / "store")]) == 0
    table = capsys.readouterr().out
    assert "coder" in table and "tools" in table and "%" in table
    assert main(["stores", str(tmp_path / "store"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["snapshots"]
    assert {(r["agent"], r["step"]) for r in rows} == {("coder", 10), ("tools", 20)}
    assert main(["merge", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "m.safetensors"), "--quiet"]) == 0
    expected = merge({n: agents[n] for n in sorted(agents)}, base=base_sd)
    assert_bit_identical(load_file(tmp_path / "m.safetensors"), expected)
    assert main(["merge", "--store", str(tmp_path / "store"), "--base", "x", "--out", str(tmp_path / "o")]) == 2
    assert "not both" in capsys.readouterr().err


def test_quiet_switches_huggingface_hub_bars_off_for_the_command_only(monkeypatch):
    hub = pytest.importorskip("huggingface_hub.utils.tqdm")
    from ram_live.cli.quiet import quiet_libraries

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    before = hub.are_progress_bars_disabled()
    with quiet_libraries(False):
        assert hub.are_progress_bars_disabled() == before and "TRANSFORMERS_VERBOSITY" not in os.environ
    with quiet_libraries(True):
        assert hub.are_progress_bars_disabled() and os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    assert hub.are_progress_bars_disabled() == before and "TRANSFORMERS_VERBOSITY" not in os.environ
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    with pytest.raises(KeyError), quiet_libraries(True):  # restored when the command fails too
        raise KeyError("x")
    assert hub.are_progress_bars_disabled() == before and os.environ["TRANSFORMERS_VERBOSITY"] == "info"
