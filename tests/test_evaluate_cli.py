"""``ram-live search AGENTS --base B --prompts P --reward MOD:FN --out DIR`` end to end on tiny saved Llama folders:
the chosen merge's score is the hand-written greedy loop's on the saved winner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from ram_live.cli import main

import evaluate_helpers as h
from evaluate_helpers import ANSWERS, PROMPTS

REWARDS = """
def length(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def starts_right(completions, answer):
    return [1.0 if c.startswith(a[:1]) else 0.0 for c, a in zip(completions, answer)]


def broken(completions, **kwargs):
    return [1.0] * (len(completions) + 1)
"""


@pytest.fixture
def folders(tmp_path, monkeypatch):
    tok, base = h.tokenizer(), h.model(0)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    for i, name in enumerate(["coder", "tools"]):
        g = torch.Generator().manual_seed(10 + i)
        sd = {
            k: v + (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g) * 0.5
            for k, v in base.state_dict().items()
        }
        (tmp_path / name).mkdir()
        save_file(sd, str(tmp_path / name / "model.safetensors"))
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for p, a in zip(PROMPTS, ANSWERS):
            f.write(json.dumps({"prompt": p, "answer": a}) + "\n")
    (tmp_path / "toy_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)  # the reward module is importable from the current folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def args(tmp, *extra):
    return [
        "search",
        f"coder={tmp / 'coder'}",
        f"tools={tmp / 'tools'}",
        "--base",
        str(tmp / "base"),
        "--prompts",
        str(tmp / "prompts.jsonl"),
        "--max-new-tokens",
        "6",
        "--budget",
        "3",
        "--space",
        '["task_arithmetic"]',
        "--out",
        str(tmp / "best"),
        *extra,
    ]


def test_search_with_a_reward_function_end_to_end(folders, capsys):
    tmp = folders
    code = main(args(tmp, "--reward", "toy_rewards:length", "--reward", "toy_rewards:starts_right"))
    assert code == 0 and "best:" in capsys.readouterr().out
    data = json.loads((tmp / "best" / "search.json").read_text())
    winner = h.transformers.AutoModelForCausalLM.from_pretrained(tmp / "best")
    tok = h.transformers.AutoTokenizer.from_pretrained(tmp / "best")
    completions = [tok.decode(h.greedy(winner, tok, tok(p)["input_ids"], 6), skip_special_tokens=True) for p in PROMPTS]
    expected = sum(float(len(c)) + (1.0 if c.startswith(a[:1]) else 0.0) for c, a in zip(completions, ANSWERS)) / len(
        PROMPTS
    )
    assert data["best_score"] == expected and 0 < expected
    assert len({t["score"] for t in data["history"]}) > 1, data["history"]  # the candidates score differently


def test_errors_are_one_line(folders, capsys):
    tmp = folders
    assert main(args(tmp, "--reward", "toy_rewards:broken")) == 2  # a SearchError, the EvaluationError in it
    err = capsys.readouterr().err
    assert "reward function 'broken' returned" in err and "rewards for 7 prompts" in err and "Traceback" not in err
    (tmp / "empty.jsonl").write_text("")
    bad = args(tmp, "--reward", "toy_rewards:length")
    bad[bad.index("--prompts") + 1] = str(tmp / "empty.jsonl")
    assert main(bad) == 2
    assert "empty.jsonl is empty" in capsys.readouterr().err
    assert main(args(tmp)) == 2
    assert "--eval MODULE:FUNCTION, or --reward" in capsys.readouterr().err
    assert main(args(tmp, "--reward", "toy_rewards:nope")) == 2
    assert "--reward='toy_rewards:nope'" in capsys.readouterr().err


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ram-live: error: ") and "Traceback" not in captured.err, captured
    return lines[0]


def test_a_reward_module_that_exits_while_imported_is_an_error_not_a_silent_success(folders, capsys):
    tmp = folders
    (tmp / "exiting_rewards.py").write_text("import sys\nsys.exit(0)\n" + REWARDS)
    assert main(args(tmp, "--reward", "exiting_rewards:length")) == 2
    line = _one_line_error(capsys)
    assert "--reward='exiting_rewards:length': importing 'exiting_rewards' called sys.exit(0)" in line
    (tmp / "failing_rewards.py").write_text("import json\njson.loads('{')\n" + REWARDS)
    assert main(args(tmp, "--reward", "failing_rewards:length")) == 2
    assert "importing 'failing_rewards' raised JSONDecodeError: " in _one_line_error(capsys)
    assert not (tmp / "best").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n', "line 2: not UTF-8"),
        (b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1: nested too deeply"),
    ],
    ids=["latin-1 byte", "deep nesting"],
)
def test_a_bad_prompts_file_is_one_line_and_writes_nothing(folders, capsys, content, message):
    # the library's checks (ram_live/evaluate/prompts.py) seen through the command: one line, no traceback, no --out
    tmp = folders
    (tmp / "bad.jsonl").write_bytes(content)
    bad = args(tmp, "--reward", "toy_rewards:length")
    bad[bad.index("--prompts") + 1] = str(tmp / "bad.jsonl")
    assert main(bad) == 2
    line = _one_line_error(capsys)
    assert "bad.jsonl" in line and message in line and len(line) < 300, line
    assert not (tmp / "best").exists()


BAR = ("Loading weights", "Loading checkpoint shards", "%|", "it/s]", "\r")


def test_quiet_silences_the_loading_bars_and_restores_the_settings(folders, capsys):
    tmp = folders
    logging = h.transformers.utils.logging
    was = logging.is_progress_bar_enabled()
    logging.enable_progress_bar()  # whatever other tests did: bars on, as for a user
    try:
        assert main(args(tmp, "--reward", "toy_rewards:length")) == 0
        assert "Loading weights" in capsys.readouterr().err  # what --quiet must silence (transformers' tqdm bar)
        before = (logging.is_progress_bar_enabled(), logging.get_verbosity())
        assert main(args(tmp, "--reward", "toy_rewards:length", "--quiet", "--force")) == 0
        captured = capsys.readouterr()
        assert not [b for b in BAR if b in captured.err], captured.err
        assert captured.out == ""
        assert (logging.is_progress_bar_enabled(), logging.get_verbosity()) == before  # restored after the command
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


def test_quiet_silences_transformers_first_imported_by_the_command(folders):
    # in a fresh process transformers is imported during the command (by --reward's model): it must start quiet
    tmp = folders
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    env.pop("TRANSFORMERS_VERBOSITY", None)
    done = subprocess.run(
        [sys.executable, "-m", "ram_live", *args(tmp, "--reward", "toy_rewards:length", "--quiet")],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert not [b for b in BAR if b in done.stderr], done.stderr
    assert done.stdout == "" and (tmp / "best" / "search.json").is_file()


def test_search_by_task_with_a_prompt_budget_and_the_race(folders, capsys):
    """--task groups the prompts (each trial's task scores in search.json), --budget 4x --fidelity halving races
    the candidates; the winner's score is the mean over the tasks of the hand-written greedy loop's rewards."""
    tmp = folders
    with open(tmp / "prompts.jsonl", "w") as f:
        for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS)):
            f.write(json.dumps({"prompt": p, "answer": a, "kind": "even" if i % 2 == 0 else "odd"}) + "\n")
    code = main(
        args(
            tmp,
            "--reward",
            "toy_rewards:length",
            "--task",
            "kind",
            "--fidelity",
            "halving",
            "--budget",
            "4x",
            "--space",
            '["task_arithmetic", "ties"]',
        )
    )
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp / "best" / "search.json").read_text())
    assert all(set(t["tasks"]) == {"even", "odd"} for t in data["history"])
    assert data["spent"] <= 4.0 and data["budget"] == "4x"
    winner = h.transformers.AutoModelForCausalLM.from_pretrained(tmp / "best")
    tok = h.transformers.AutoTokenizer.from_pretrained(tmp / "best")
    lengths = [
        float(len(tok.decode(h.greedy(winner, tok, tok(p)["input_ids"], 6), skip_special_tokens=True))) for p in PROMPTS
    ]
    even, odd = lengths[0::2], lengths[1::2]
    assert data["best_score"] == pytest.approx((sum(even) / len(even) + sum(odd) / len(odd)) / 2, abs=1e-12)
    with pytest.raises(SystemExit) as exit_:
        main(args(tmp, "--reward", "toy_rewards:length", "--budget", "2.5", "--force"))
    assert exit_.value.code == 2 and "argument --budget: '2.5' is neither" in capsys.readouterr().err
