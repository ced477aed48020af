"""Hostile flags and arguments of the newest surfaces, found by trying them: JSON options nested too deeply or
holding thousands of digits, shard sizes, clean's --min-age, the plan's checks, huge ascent steps, ints too long to
print, DARE seeds. Each is a ConfigError naming the option (the CLI: one line, exit status 2, no traceback), raised
before anything is written."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
from safetensors.torch import save_file

from ram_live import merge, search
from ram_live.cli import main
from ram_live.errors import ConfigError
from ram_live.io.outputs import clean_stale
from ram_live.option_checks import parse_json, shown

DIGITS = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000
HUGE = -(10**5000)


@pytest.fixture
def folder(tmp_path, base_sd, monkeypatch):
    save_file(base_sd, str(tmp_path / "base.safetensors"))
    save_file({k: v + 1 for k, v in base_sd.items()}, str(tmp_path / "a.safetensors"))
    save_file({k: v * 2 for k, v in base_sd.items()}, str(tmp_path / "b.safetensors"))
    (tmp_path / "score_mod.py").write_text("def score(merged):\n    return float(merged['w'].sum())\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


AGENTS = ["a=a.safetensors", "b=b.safetensors", "--base", "base.safetensors"]
SEARCH = ["search", *AGENTS, "--eval", "score_mod:score"]
MERGE = ["merge", *AGENTS, "--out", "out"]

CASES = [
    (SEARCH + ["--plan", "--space", DEEP], "--space: its JSON is nested too deeply"),
    (SEARCH + ["--plan", "--space", "[" + DIGITS + "]"], "--space: holds an integer of more than"),
    (SEARCH + ["--plan", "--space", '{"ram_plus": {"r": [' + DIGITS + "]}}"], "--space: holds an integer"),
    (SEARCH + ["--plan", "--parallel", "0"], "parallel must be an int >= 1"),
    (SEARCH + ["--plan", "--confirm-top", "0"], "confirm_top must be an int >= 1"),
    (MERGE + ["--lambdas", DEEP], "lambdas \\(a JSON object.*nested too deeply"),
    (MERGE + ["--lambdas", '{"a": ' + DIGITS + ', "b": 1}'], "holds an integer of more than"),
    (MERGE + ["--method", "ties", "-O", "density=" + DIGITS], "-O density: holds an integer"),
    (MERGE + ["--method", "linear", "-O", "weights=" + DEEP], "-O weights: its JSON is nested too deeply"),
    (MERGE + ["-O", "exclude=" + DEEP], "-O exclude: its JSON is nested too deeply"),
    (MERGE + ["--method", "dare_ties", "-O", "seed=" + DIGITS], "-O seed: holds an integer"),
    (MERGE + ["--method", "dare_ties", "-O", "seed=1.5"], "seed must be an int from -2\\*\\*63"),
    (MERGE + ["--max-shard-size", "nan"], "--max-shard-size must be a number of GB"),
    (MERGE + ["--max-shard-size", "1e308"], "--max-shard-size must be a number of GB"),
    (MERGE + ["--max-shard-size", "-1"], "--max-shard-size must be a number of GB"),
    (MERGE + ["--max-shard-size", "1e-300"], "--max-shard-size must be a number of GB"),
    (["clean", ".", "--min-age", "nan"], "min_age \\(--min-age\\) must be a number of seconds >= 0"),
    (["clean", ".", "--min-age", "-1"], "min_age \\(--min-age\\) must be a number of seconds >= 0"),
]


@pytest.mark.parametrize("argv, why", CASES, ids=[f"{i}-{c[0][0]}" for i, c in enumerate(CASES)])
def test_hostile_flags_are_one_line_errors_and_write_nothing(folder, argv, why, capsys):
    import re

    before = sorted(p.name for p in folder.iterdir())
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of a flag's value: usage and one line, status 2
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err and re.search(why, err) and len(err.strip().splitlines()[-1]) < 400, err
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == [
        n for n in before if n != "__pycache__"
    ]


@pytest.mark.filterwarnings("ignore:the search could not choose")
def test_a_huge_ascent_step_never_builds_an_option_beyond_float32(folder, base_sd):
    """An ascent whose step would take λ past float32's range stops there: the search ends, not a ConfigError
    after it began (each trial a valid merge)."""
    agents = {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}

    def score(merged):
        return float(sum(t.double().sum() for t in merged.values()).clamp(-1e30, 1e30))

    for step in (1e300, 3e38):
        result = search(agents, base=base_sd, evaluate=score, budget=8, space={"lambdas": {"step": step}})
        assert result.scored and all(
            all(math.isfinite(v) and abs(v) <= 3.5e38 for v in t.options.get("lambdas", {}).values())
            for t in result.history
        )


def test_max_shard_bytes_is_checked_before_anything_is_written(tmp_path, base_sd):
    agents = {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}
    for bad in (0, -1, 1.5, "5GB", True, None, HUGE, float("nan")):
        with pytest.raises(ConfigError, match="max_shard_bytes must be a positive integer"):
            merge(agents, base=base_sd, out=tmp_path / "out", max_shard_bytes=bad)
        assert not list(tmp_path.iterdir())
    merge(agents, base=base_sd, out=tmp_path / "out", max_shard_bytes=1)  # one tensor a shard
    assert len(list((tmp_path / "out").glob("*.safetensors"))) == len(base_sd)


def test_clean_never_takes_a_nan_or_negative_age(tmp_path):
    stale = tmp_path / ".out.tmp-abc123"
    stale.mkdir()
    os.utime(stale, (time.time() - 10, time.time() - 10))
    for bad in (float("nan"), -1, "60", True):
        with pytest.raises(ConfigError, match="min_age"):
            clean_stale(tmp_path, min_age=bad)
        assert stale.exists()
    assert clean_stale(tmp_path, min_age=math.inf) == [] and stale.exists()
    assert clean_stale(tmp_path, min_age=0) == [stale] and not stale.exists()


@pytest.mark.parametrize(
    "options, why",
    [
        ({"workers": HUGE}, "workers must be a positive integer"),
        ({"chunk_numel": HUGE}, "chunk_numel must be a positive integer"),
        ({"device": HUGE}, "device="),
        ({"dtype": HUGE}, "dtype= must be one of"),
        ({"method": "dare_ties", "seed": HUGE}, "seed must be an int"),
        ({"method": "dare_ties", "seed": 2**64}, "seed must be an int"),
        ({"method": "dare_ties", "seed": "1"}, "seed must be an int"),
        ({"method": "dare_ties", "seed": True}, "seed must be an int"),
    ],
    ids=[
        "workers",
        "chunk_numel",
        "device",
        "dtype",
        "dare-seed",
        "dare-seed-2**64",
        "dare-seed-str",
        "dare-seed-bool",
    ],
)
def test_merge_options_too_long_to_print_are_config_errors(base_sd, options, why):
    agents = {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}
    with pytest.raises(ConfigError, match=why) as caught:
        merge(agents, base=base_sd, **options)
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    "options, why",
    [
        ({"parallel": HUGE}, "parallel must be an int >= 1"),
        ({"confirm_top": HUGE, "confirm": lambda m: 0.0}, "confirm_top must be an int >= 1"),
        ({"seed": 10**5000}, "seed must be an int from"),
        ({"seed": 1.0}, "seed must be an int from"),
        ({"seconds_per_candidate": HUGE, "plan": True}, "seconds_per_candidate must be a finite number"),
        ({"importance": HUGE}, "importance must be"),
        ({"space": [HUGE]}, "space\\[0\\] must be a family name"),
        ({"fidelity": HUGE}, "fidelity must be"),
        ({"ray_address": HUGE}, "ray_address must be a string"),
        ({"plan": HUGE}, "plan must be True or False"),
        ({"progress": HUGE}, "progress must be"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v) if isinstance(v, dict) else None,
)
def test_search_options_too_long_to_print_are_config_errors(base_sd, options, why):
    agents = {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}
    scored = []
    with pytest.raises(ConfigError, match=why) as caught:
        search(agents, base=base_sd, evaluate=lambda m: scored.append(1) or 0.0, budget=2, **options)
    assert len(str(caught.value)) < 400 and not scored


def test_shown_and_parse_json_never_raise_on_what_they_are_given():
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("no repr")

    assert shown(HUGE) == "-<an int of about 5000 digits>"
    assert "BadRepr" in shown(BadRepr())
    assert len(shown(DEEP)) <= 80 and len(shown(eval("[" * 50 + "]" * 50))) <= 80
    assert parse_json("-O x", "ties", plain_text=True) == "ties"
    assert parse_json("-O x", "[1, 2.5]") == [1, 2.5]
    with pytest.raises(ConfigError, match="--space is not JSON"):
        parse_json("--space", "[nope")


def test_a_base_side_file_is_read_through_side_files_only(folder, base_sd):
    """A folder base with an unreadable side file (a folder in its place, a FIFO) merges: they are not files."""
    base = folder / "basefolder"
    base.mkdir()
    save_file(base_sd, str(base / "model.safetensors"))
    (base / "tokenizer.json").mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(base / "special_tokens_map.json")  # opening it for reading would block
    agents = {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}
    merge(agents, base=str(base), out=folder / "merged")
    names = {p.name for p in Path(folder / "merged").iterdir()}
    assert "tokenizer.json" not in names and "special_tokens_map.json" not in names
