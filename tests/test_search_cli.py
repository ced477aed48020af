"""``ram-live search`` end to end on tiny safetensors folders, with an evaluation function from this module."""

from __future__ import annotations

import io
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


def test_an_extrapolating_winner_is_one_line_naming_confirm(folders, capsys):
    tmp, paths, agents, base = folders
    status = main(
        [
            "search",
            *(f"{n}={paths[n]}" for n in LAMBDAS),
            "--base",
            str(paths["base"]),
            "--eval",
            "test_search_cli:held_out",
            "--budget",
            "1",
            "--space",
            '[{"method": "task_arithmetic", "scale": 3.0}]',
            "--out",
            str(tmp / "far"),
        ]
    )
    err = capsys.readouterr().err
    assert status == 0 and err.count("\n") == 1, err
    assert err == (
        "ram-live: warning: the chosen merge task_arithmetic(scale=3.0) scales an agent's task vector by 3 (> 2): "
        "it extrapolates past what that agent learned; check it on data the selection did not see "
        "(--confirm MODULE:FUNCTION)\n"
    )
    assert "confirm=" not in err and "ExtrapolationWarning" not in err


def test_an_existing_output_names_force(folders, capsys):
    tmp, paths, agents, base = folders
    (tmp / "taken").mkdir()
    (tmp / "taken" / "notes.txt").write_text("mine")
    (tmp / "file.safetensors").write_bytes(b"mine")
    common = [*(f"{n}={paths[n]}" for n in LAMBDAS), "--base", str(paths["base"])]
    runs = [
        (["search", *common, "--eval", "test_search_cli:held_out"], tmp / "taken", "exists and is not empty"),
        (["merge", *common], tmp / "taken", "exists and is not empty"),
        (["merge", *common], tmp / "file.safetensors", "exists"),
    ]
    for argv, out, said in runs:
        assert main([*argv, "--out", str(out)]) == 2
        assert _one_line_error(capsys) == f"ram-live: error: output {out} {said}; pass --force to replace it"
    assert (tmp / "taken" / "notes.txt").read_text() == "mine" and (tmp / "file.safetensors").read_bytes() == b"mine"


def test_every_option_of_rewards_has_its_flag():
    """Every keyword of ``rewards()`` is declared in REWARD_OPTIONS, in order, with the signature's default, and
    ``search`` has its flag: callables are given as MODULE:FUNCTION and the model and tokenizer as folders, so no
    keyword is left out."""
    import inspect

    from ram_live.cli.parser import build_parser
    from ram_live.evaluate import rewards
    from ram_live.evaluate.tasks import AUTO
    from ram_live.reward_options import REWARD_OPTIONS

    params = inspect.signature(rewards).parameters
    assert [o.name for o in REWARD_OPTIONS] == list(params)
    for option in REWARD_OPTIONS:
        default = params[option.name].default
        assert option.default == ("data_source" if default is AUTO else None if default is inspect._empty else default)
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["search"]
    flags = {s: a for a in sub._actions for s in a.option_strings}
    for option in REWARD_OPTIONS:
        assert flags[option.flag].dest == option.dest, option.name
    assert {o.flag for o in REWARD_OPTIONS} == {"--pass-threshold", "--reward-weights", "--batch-size",
        "--temperature", "--top-p", "--top-k", "--task-weights", "--objective", "--eval-seed", "--do-sample",
        "--eval-dtype", "--include-stop", "--eos-token-id", "--generate", "--model", "--tokenizer", "--prompts",
        "--reward", "--max-new-tokens", "--task", "--samples", "--metric", "--stop", "--device"}  # fmt: skip


FRACTION = """
def fraction(completions, **kwargs):
    return [min(1.0, c.count("n") / 2) for c in completions]


def ones(completions, **kwargs):
    return [1.0 for c in completions]
"""


def test_search_scores_as_the_same_api_search(tmp_path, monkeypatch, capsys):
    """``--pass-threshold 0.5 --samples 4 --metric pass@4`` and the other rewards() flags: every candidate's
    score is the API search's with the same keywords (and not the one a fixed threshold of 1.0 gives)."""
    h = pytest.importorskip("evaluate_helpers")
    from ram_live import search
    from ram_live.evaluate import rewards

    h.model(0).save_pretrained(tmp_path / "base")
    h.tokenizer().save_pretrained(tmp_path / "base")
    agents = {}
    for i, name in enumerate(["coder", "tools"]):
        g = torch.Generator().manual_seed(10 + i)
        sd = {
            k: v + (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g) * 0.5
            for k, v in h.model(0).state_dict().items()
        }
        agents[name] = str(tmp_path / name)
        (tmp_path / name).mkdir()
        save_file(sd, str(tmp_path / name / "model.safetensors"))
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for i, p in enumerate(h.PROMPTS):
            f.write(json.dumps({"prompt": p, "kind": "even" if i % 2 == 0 else "odd"}) + "\n")
    (tmp_path / "fraction_rewards.py").write_text(FRACTION)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fraction_rewards

    base = str(tmp_path / "base")
    keywords = dict(
        max_new_tokens=6, batch_size=3, temperature=0.7, top_k=8, seed=3, task="kind", weights={"even": 2, "odd": 1}
    )
    flags = ["--max-new-tokens", "6", "--batch-size", "3", "--temperature", "0.7", "--top-k", "8", "--eval-seed", "3"]
    flags += ["--task", "kind", "--task-weights", "even=2", "odd=1", "--reward-weights", "2", "0.5"]
    space = '[{"method": "task_arithmetic", "scale": 0.5}, {"method": "task_arithmetic", "scale": 1.0}]'
    argv = ["search", *(f"{n}={p}" for n, p in agents.items()), "--base", base, "--budget", "2", "--space", space]
    argv += ["--prompts", "prompts.jsonl", "--reward", "fraction_rewards:fraction", "--reward", "fraction_rewards:ones"]
    argv += [*flags, "--samples", "4", "--metric", "pass@4", "--pass-threshold", "1.5", "--out", "best", "-q"]
    assert main(argv) == 0, capsys.readouterr().err
    cli = [t["score"] for t in json.loads((tmp_path / "best" / "search.json").read_text())["history"]]

    def api(threshold: float) -> list[float]:
        evaluate = rewards(
            "prompts.jsonl",
            [fraction_rewards.fraction, fraction_rewards.ones],
            tokenizer=base,
            model=base,
            reward_weights=[2, 0.5],
            samples=4,
            metric="pass@4",
            pass_threshold=threshold,
            **keywords,
        )
        return [
            t.score for t in search(agents, base=base, evaluate=evaluate, budget=2, space=json.loads(space)).history
        ]

    assert len(cli) == 2 and cli == api(1.5) and all(0 < s < 1 for s in cli), cli
    assert cli != api(2.5)  # the threshold reached the evaluation (a reward is 2 * fraction + 0.5 * 1)


def test_search_plan_prints_what_the_budget_buys_and_writes_nothing(folders, capsys):
    tmp, paths, agents, base = folders
    args = ["search", *(str(paths[n]) for n in LAMBDAS), "--base", str(paths["base"])]
    args += ["--eval", "test_search_cli:held_out", "--budget", "5"]
    SEEN.clear()
    assert main([*args, "--plan", "--seconds-per-candidate", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1] == "  full     5 candidates, spent 5, about 15 s of evaluation"
    assert SEEN == [] and sorted(p.name for p in tmp.iterdir()) == sorted([*LAMBDAS, "base", "target.safetensors"])
    assert main([*args, "--plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["full"]["candidates"] == [5, 5]
    assert main([*args, "--seconds-per-candidate", "3", "--out", str(tmp / "o")]) == 2
    assert "--seconds-per-candidate is an option of --plan" in capsys.readouterr().err
    assert main(args) == 2 and "search needs --out FOLDER" in capsys.readouterr().err


def test_search_progress_on_a_terminal_and_quiet(folders, capsys, monkeypatch):
    tmp, paths, agents, base = folders

    class FakeTTY(io.StringIO):
        def isatty(self):
            return True

    args = ["search", *(str(paths[n]) for n in LAMBDAS), "--base", str(paths["base"])]
    args += ["--eval", "test_search_cli:held_out", "--budget", "3", "--space", '["ram_plus"]']
    for quiet, out in ((False, "a"), (True, "b")):
        tty = FakeTTY()
        monkeypatch.setattr("sys.stderr", tty)
        assert main([*args, "--out", str(tmp / out), *(["--quiet"] if quiet else [])]) == 0
        assert ("[search] 3 scored  spent 3/3 candidates" in tty.getvalue()) is not quiet
        assert (tty.getvalue() == "") is quiet
