"""The ram-live command's conventions: --version, --json on every command, --force, a quiet closed pipe, help on
every option, --help without torch, probe columns for any rho."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from safetensors.torch import load_file

import ram_live
from ram_live import merge, probe
from ram_live.cli.output import replacing
from ram_live.io.jsonable import jsonable
from ram_live.cli.parser import METHOD_NAMES, build_parser
from ram_live.cli import BROKEN_PIPE_STATUS, main

from tests.conftest import assert_bit_identical

ROOT = Path(__file__).resolve().parent.parent


def score(merged) -> float:
    """An evaluation for ``search --eval``: minus the distance to the base (the plainest merge wins)."""
    base = load_file(os.environ["RAM_LIVE_TEST_BASE"])
    return -math.sqrt(sum(float(((merged[k].double() - base[k].double()) ** 2).sum()) for k in base))


def test_version_is_the_package_version_and_pyproject_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"ram-live {ram_live.__version__}\n"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == ram_live.__version__


def test_method_names_are_the_registry():
    assert METHOD_NAMES == tuple(ram_live.available_methods())


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_help_on_every_option_and_every_method_listed():
    from ram_live.integrations.verl.cli import build_parser as verl_parser

    parser = build_parser()
    parsers = {"": parser, **_subparsers(parser), "verl-snapshot (own)": verl_parser()}
    assert set(parsers) >= {"probe", "merge", "merge-adapters", "search", "stores", "clean", "verl-snapshot"}
    for name, p in parsers.items():
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help and action.help != argparse.SUPPRESS, (name, action.option_strings or action.dest)
    for name in ("merge", "merge-adapters"):
        text = parsers[name].format_help()
        assert all(m in text for m in METHOD_NAMES), name
    probe_help = parsers["probe"].format_help()
    for option in ("--eps", "--activity", "--r", "--alpha", "--json", "--plot"):
        assert option in probe_help
    for name in ("merge", "merge-adapters", "search"):
        assert "--force" in parsers[name].format_help() and "--json" in parsers[name].format_help()


@pytest.mark.parametrize("argv", [["--help"], ["merge", "--help"], ["merge-adapters", "--help"], ["--version"]])
def test_help_imports_no_torch(argv):
    code = (
        "import sys, ram_live.cli\n"
        "try:\n"
        f"    ram_live.cli.main({argv!r})\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'safetensors', 'numpy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "ram-live" in result.stdout


def test_json_of_probe_merge_stores_clean_and_search(files, capsys, monkeypatch):
    tmp, base, agents, paths = files
    b = str(tmp / "base.safetensors")
    assert main(["probe", *paths, "--base", b, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = probe(agents, base=base).to_dict()
    assert list(report["agents"]) == ["coder", "tools", "memory"]
    assert [a["active"] for a in report["agents"].values()] == [a["active"] for a in expected["agents"].values()]
    assert main(["probe", "--base", b, "--json", *paths]) == 2  # --json FILE would have taken the first agent
    assert "looks like an agent" in capsys.readouterr().err
    assert_bit_identical(load_file(paths[0]), agents[0])  # the checkpoint was not overwritten with JSON
    assert main(["probe", *paths, "--base", b, "--json", str(tmp / "r.json")]) == 0
    assert "rho" in capsys.readouterr().out and json.loads((tmp / "r.json").read_text()) == report

    assert main(["merge", *paths, "--base", b, "--out", str(tmp / "m.safetensors"), "--json", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out)
    _, info = merge(agents, base=base, return_info=True)
    assert data["method"] == "ram_plus" and data["agents"] == ["coder", "tools", "memory"]
    assert data["tensors"] == info.tensors == 5 and data["parameters"] == sum(t.numel() for t in base.values())
    assert data["lambdas"] == dict(zip(data["agents"], info.lambdas.values()))
    assert data["out"] == str(tmp / "m.safetensors") and data["config"]["r"] == 0.1

    from ram_live import SnapshotStore

    store = SnapshotStore(tmp / "store", durable=False)
    store.writer("coder", base).snapshot(agents[0], 10)
    assert main(["stores", str(tmp / "store"), "--json"]) == 0
    assert [(r["agent"], r["step"]) for r in json.loads(capsys.readouterr().out)["snapshots"]] == [("coder", 10)]
    assert main(["stores", str(tmp / "store"), "--json", "--verify"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)

    stale = tmp / "out" / ".m.tmp-abcdef12"
    stale.mkdir(parents=True)
    assert main(["clean", str(tmp / "out"), "--min-age", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"folder": str(tmp / "out"), "removed": [str(stale)]}
    assert not stale.exists()

    monkeypatch.setenv("RAM_LIVE_TEST_BASE", b)
    assert (
        main(
            [
                "search",
                *paths,
                "--base",
                b,
                "--eval",
                "test_cli_conventions:score",
                "--budget",
                "3",
                "--space",
                '["linear"]',
                "--out",
                str(tmp / "s"),
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((tmp / "s" / "search.json").read_text())
    search = [
        "search",
        *paths,
        "--base",
        b,
        "--eval",
        "test_cli_conventions:score",
        "--budget",
        "2",
        "--space",
        '["linear"]',
        "--out",
        str(tmp / "s"),
        "-q",
    ]
    (tmp / "s" / "mine.txt").write_text("old")
    assert main(search) == 2 and "not empty" in capsys.readouterr().err  # refused before searching
    assert main([*search, "--force"]) == 0
    written = sorted(p.name for p in (tmp / "s").iterdir())
    assert written == ["model.safetensors", "ram_merge.json", "search.json", "table.txt"]
    assert json.loads((tmp / "s" / "search.json").read_text())["budget"] == 2


def test_json_of_merge_config(files, capsys):
    pytest.importorskip("yaml")
    tmp, base, agents, paths = files
    config = tmp / "ties.yml"
    config.write_text(
        "merge_method: ties\nbase_model: "
        + str(tmp / "base.safetensors")
        + "\nmodels:\n"
        + "".join(f"  - model: {p}\n    parameters: {{weight: 1.0, density: 0.5}}\n" for p in paths)
    )
    code = main(["merge", "--config", str(config), "--out", str(tmp / "c.safetensors"), "--json", "-q"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    assert data["mergekit_method"] == "ties" and data["method"] == "ties" and len(data["agents"]) == 3


def test_errors_stay_one_line_on_stderr_with_json(files, capsys):
    tmp, base, agents, paths = files
    code = main(
        [
            "merge",
            *paths,
            "--base",
            str(tmp / "base.safetensors"),
            "--out",
            str(tmp / "o"),
            "--method",
            "slerp",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and captured.err.count("\n") == 1 and "slerp" in captured.err


def test_force_replaces_only_what_existed(files, capsys):
    tmp, base, agents, paths = files
    b = str(tmp / "base.safetensors")
    expected = merge(agents, base=base)
    single = tmp / "m.safetensors"
    single.write_bytes(b"old")
    sibling = tmp / "keep.txt"
    sibling.write_text("sibling")
    assert main(["merge", *paths, "--base", b, "--out", str(single), "-q"]) == 2  # without --force: refused
    assert "exists" in capsys.readouterr().err and single.read_bytes() == b"old"
    assert main(["merge", *paths, "--base", b, "--out", str(single), "-q", "--force"]) == 0
    assert_bit_identical(load_file(single), expected)
    folder = tmp / "merged"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "old.bin").write_bytes(b"x")
    assert main(["merge", *paths, "--base", b, "--out", str(folder), "-q", "--force"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "ram_merge.json"]
    assert_bit_identical(load_file(folder / "model.safetensors"), expected)
    assert sibling.read_text() == "sibling"
    assert not [p for p in tmp.iterdir() if ".replaced-" in p.name]
    # a failing merge puts the old output back
    before = (folder / "model.safetensors").read_bytes()
    assert main(["merge", *paths, "--base", b, "--out", str(folder), "--force", "--method", "slerp"]) == 2
    capsys.readouterr()
    assert (folder / "model.safetensors").read_bytes() == before
    assert not [p for p in tmp.iterdir() if ".replaced-" in p.name]


def test_force_refuses_a_symlinked_output(files, capsys):
    tmp, base, agents, paths = files
    target = tmp / "real"
    target.mkdir()
    (target / "data.bin").write_bytes(b"keep")
    (tmp / "neighbour.bin").write_bytes(b"keep too")
    (tmp / "link").symlink_to(target)
    code = main(["merge", *paths, "--base", str(tmp / "base.safetensors"), "--out", str(tmp / "link"), "--force"])
    assert code == 2 and "symbolic link" in capsys.readouterr().err
    assert (target / "data.bin").read_bytes() == b"keep" and (tmp / "neighbour.bin").read_bytes() == b"keep too"
    assert (tmp / "link").is_symlink()


def test_replacing_never_removes_what_appeared_meanwhile(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError), replacing(out, force=True):
        assert not out.exists()
        out.mkdir()
        (out / "new.txt").write_text("someone else's")
        raise RuntimeError("the merge failed")
    assert (out / "new.txt").read_text() == "someone else's" and not (out / "old.txt").exists()
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".out.replaced-")]
    assert len(kept) == 1 and (kept[0] / "out" / "old.txt").read_text() == "old"
    with replacing(tmp_path / "absent", force=True):  # nothing to replace: nothing happens
        pass
    assert not (tmp_path / "absent").exists()


def test_distributed_force_is_refused(files, capsys):
    tmp, base, agents, paths = files
    assert (
        main(
            [
                "merge",
                *paths,
                "--base",
                str(tmp / "base.safetensors"),
                "--out",
                str(tmp / "o"),
                "--distributed",
                "--force",
            ]
        )
        == 2
    )
    assert "--distributed" in capsys.readouterr().err


def test_closed_stdout_ends_quietly(files):
    tmp, base, agents, paths = files
    argv = [sys.executable, "-m", "ram_live", "probe", *paths, "--base", str(tmp / "base.safetensors")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # closed before the table is printed (importing torch alone takes longer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == BROKEN_PIPE_STATUS
    assert "BrokenPipeError" not in err and "Traceback" not in err and err == ""


def test_probe_table_columns_fit_any_rho(files):
    tmp, base, agents, paths = files
    report = probe(agents, base=base)
    names = report.agent_names
    lambdas = report.agents[names[0]].lambdas
    # rho = shared / unique: 61728 / 5, 10 / 0 (no unique entry), 0 / 7
    for name, (active, unique) in zip(names, [(61733, 5), (10, 0), (7, 7)]):
        report.agents[name] = dataclasses.replace(
            report.agents[name], total=10**6, active=active, unique=unique, lambdas=lambdas
        )
    lines = report.table().splitlines()[: 2 + len(names)]
    header, rule, rows = lines[0], lines[1], lines[2:]
    assert {len(line) for line in lines} == {len(header)} and set(rule) == {"-"}
    end = header.index("rho") + len("rho")  # right-aligned: every rho ends under the header's
    cells = [row[:end].split()[-1] for row in rows]
    assert cells == ["12345.600", "inf", "0.000"]
    assert [row.split()[:2] for row in rows] == [[n, f"{report.agents[n].active:,}"] for n in names]
    assert json.dumps(jsonable({"rho": math.inf}), allow_nan=False) == '{"rho": "inf"}'
