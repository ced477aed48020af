"""``ram-live search`` end to end on tiny safetensors folders, with an evaluation function from this module."""

from __future__ import annotations

import json
import math
import os
import sys
import zlib

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live import merge
from ram_live.cli import main
from ram_live.selection import from_json

from conftest import make_agents

LAMBDAS = {"coder": 2.0, "tools": 0.5, "memory": 1.0}
SEEN: list[type] = []


def held_out(merged) -> float:
    """−‖merged − target‖ for the target in $RAM_LIVE_TEST_TARGET (what ``--eval`` calls)."""
    SEEN.append(type(merged))
    target = load_file(os.environ["RAM_LIVE_TEST_TARGET"])
    return -math.sqrt(sum(float(((merged[k].double() - target[k].double()) ** 2).sum()) for k in target))


def doubled(merged) -> float:
    return 2 * held_out(merged)


def too_large(merged) -> int:
    return 10**400  # an int no float holds


def exits(merged) -> float:
    sys.exit(0)  # user code ending the process: never a silent success


@pytest.fixture
def folders(tmp_path, base_sd, monkeypatch):
    agents = dict(zip(LAMBDAS, make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    paths = {}
    for name, sd in {"base": base_sd, **agents}.items():
        paths[name] = tmp_path / name
        paths[name].mkdir()
        save_file(sd, str(paths[name] / "model.safetensors"))
    (paths["base"] / "config.json").write_text('{"model_type": "tiny"}')
    target = merge(agents, base=base_sd, method="ram", lambdas=LAMBDAS)
    save_file(target, str(tmp_path / "target.safetensors"))
    monkeypatch.setenv("RAM_LIVE_TEST_TARGET", str(tmp_path / "target.safetensors"))
    return tmp_path, paths, agents, base_sd


def test_search_writes_the_best_merge_and_the_table(folders, capsys):
    tmp, paths, agents, base = folders
    out = tmp / "best"
    SEEN.clear()
    code = main(
        [
            "search",
            *(f"{n}={paths[n]}" for n in LAMBDAS),
            "--base",
            str(paths["base"]),
            "--eval",
            "test_search_cli:held_out",
            "--budget",
            "40",
            "--out",
            str(out),
            "--space",
            '["lambdas", "ties"]',
            "--confirm",
            "test_search_cli:doubled",
            "--confirm-top",
            "2",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0 and "best:" in printed and "best baseline: ties" in printed
    assert set(SEEN) == {dict}  # the evaluation gets a state dict
    data = json.loads((out / "search.json").read_text())
    assert data["best"] == {"method": "ram", "lambdas": LAMBDAS} and data["best_score"] == 0.0
    assert len(data["history"]) <= 40 and sum(t["confirm_score"] is not None for t in data["history"]) == 2
    assert (out / "table.txt").read_text().startswith("  #")
    assert (out / "config.json").read_text() == '{"model_type": "tiny"}'
    written = load_file(out / "model.safetensors")
    want = merge(agents, base=base, **from_json(data["best"]))
    assert sorted(written) == sorted(want) and all(torch.equal(written[k], want[k]) for k in want)


def test_search_json_to_stdout_and_errors(folders, capsys):
    tmp, paths, agents, base = folders
    args = [*(str(paths[n]) for n in LAMBDAS), "--base", str(paths["base"])]
    assert (
        main(
            [
                "search",
                *args,
                "--eval",
                "test_search_cli:held_out",
                "--budget",
                "3",
                "--out",
                str(tmp / "o"),
                "--json",
                "--space",
                '{"ram_plus": {"r": [0.5], "alpha": ["inf"]}}',
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["best"] == {"method": "ram_plus", "r": 0.5, "alpha": "inf"}
    cases = [
        (["--eval", "test_search_cli:nothing"], "has no function 'nothing'"),
        (["--eval", "no_such_module_x:f"], "cannot import 'no_such_module_x'"),
        (["--eval", "held_out"], "--eval takes package.module:function"),
        (["--eval", "test_search_cli:held_out", "--budget", "0"], "budget must be an int >= 1"),
        (["--eval", "test_search_cli:held_out", "--space", "[nope"], "--space is not JSON"),
    ]
    for extra, message in cases:
        assert main(["search", *args, *extra, "--out", str(tmp / "p")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp / "p").exists()
    assert main(["search", *args, "--eval", "test_search_cli:held_out", "--out", str(tmp / "o")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err  # refused before the search runs


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ram-live: error: ") and "Traceback" not in captured.err, captured
    return lines[0]


@pytest.mark.parametrize(
    "body, code, message",
    [
        ("import sys\nsys.exit(0)\n", 2, "--eval='{name}:score': importing '{name}' called sys.exit(0)"),
        ("raise SystemExit(3)\n", 2, "--eval='{name}:score': importing '{name}' called sys.exit(3)"),
        ("import json\njson.loads('{{')\n", 2, "--eval='{name}:score': importing '{name}' raised JSONDecodeError: "),
        ("raise RuntimeError('two\\nlines')\n", 2, "importing '{name}' raised RuntimeError: two lines"),
    ],
)
def test_user_code_that_exits_or_fails_while_imported_is_one_line_and_writes_nothing(
    folders, capsys, monkeypatch, body, code, message
):
    tmp, paths, agents, base = folders
    name = f"eval_at_import_{zlib.crc32(body.encode())}"
    (tmp / f"{name}.py").write_text(body + "def score(merged):\n    return 0.0\n")
    monkeypatch.chdir(tmp)
    status = main(
        [
            "search",
            *(str(paths[n]) for n in LAMBDAS),
            "--base",
            str(paths["base"]),
            "--eval",
            f"{name}:score",
            "--budget",
            "3",
            "--out",
            str(tmp / "p"),
        ]
    )
    assert status == code
    assert message.format(name=name) in _one_line_error(capsys)
    assert not (tmp / "p").exists()


@pytest.mark.parametrize(
    "function, code, message",
    [
        ("too_large", 2, "evaluate returned 1000000000"),
        ("exits", 1, "ram-live: error: user code called sys.exit(0) during the command"),
    ],
)
def test_an_evaluation_that_exits_or_overflows_is_one_line_and_writes_nothing(folders, capsys, function, code, message):
    tmp, paths, agents, base = folders
    status = main(
        [
            "search",
            *(str(paths[n]) for n in LAMBDAS),
            "--base",
            str(paths["base"]),
            "--eval",
            f"test_search_cli:{function}",
            "--budget",
            "3",
            "--out",
            str(tmp / "p"),
        ]
    )
    assert status == code
    line = _one_line_error(capsys)
    assert message in line and len(line) < 400, line
    assert not (tmp / "p").exists()
