"""Run options are checked before anything runs: chunk_numel, workers and device (one check for merge and
probe); bad values are ConfigErrors naming the option, never a hang or an AssertionError."""

from __future__ import annotations

import os

import pytest
import torch

from ram_live import ConfigError, merge, merge_task_vectors, probe, ram_merge
from ram_live.api import check_run_options

BAD = [
    ({"chunk_numel": 0}, "chunk_numel must be a positive integer"),
    ({"chunk_numel": -4}, "chunk_numel must be a positive integer"),
    ({"chunk_numel": 2.5}, "chunk_numel must be a positive integer"),
    ({"chunk_numel": "1024"}, "chunk_numel must be a positive integer"),
    ({"chunk_numel": True}, "chunk_numel must be a positive integer"),
    ({"chunk_numel": None}, "chunk_numel must be a positive integer"),
    ({"workers": 0}, "workers must be a positive integer"),
    ({"workers": -1}, "workers must be a positive integer"),
    ({"workers": 1.0}, "workers must be a positive integer"),
    ({"device": "cpu:x"}, "device='cpu:x'"),
    ({"device": "cpu:3"}, "only 1 cpu device"),
    ({"device": "xla"}, "no xla device is available"),
    ({"device": "meta"}, "holds no values"),
    ({"device": 3.5}, "device=3.5"),
]
if not torch.cuda.is_available():
    BAD.append(({"device": "cuda:7"}, "no cuda device is available"))
else:
    BAD.append(({"device": f"cuda:{torch.cuda.device_count()}"}, "cuda device"))


@pytest.fixture
def inputs(base_sd):
    return {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}, base_sd


@pytest.mark.parametrize("options, why", BAD, ids=[str(o) for o, _ in BAD])
@pytest.mark.parametrize("entry", ["merge", "ram_merge", "probe", "merge_task_vectors"])
def test_bad_run_options_are_config_errors(inputs, options, why, entry, tmp_path):
    agents, base = inputs
    call = {
        "merge": lambda: merge(agents, base=base, out=tmp_path / "out", **options),
        "ram_merge": lambda: ram_merge(agents, base=base, **options),
        "probe": lambda: probe(agents, base=base, **options),
        "merge_task_vectors": lambda: merge_task_vectors(agents, **options),
    }[entry]
    with pytest.raises(ConfigError, match=why.replace("(", r"\(")):
        call()
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


def test_good_run_options_pass(inputs):
    agents, base = inputs
    assert check_run_options(None, 1, None) is None
    assert check_run_options("cpu", 7, 3) == torch.device("cpu")
    assert check_run_options(torch.device("cpu", 0), 2**40, 1) == torch.device("cpu", 0)
    one = merge(agents, base=base, method="ram", chunk_numel=1, workers=1, device="cpu")
    big = merge(agents, base=base, method="ram", chunk_numel=10**9, workers=4)
    assert all(torch.equal(one[k], big[k]) for k in base)


SEARCH_BAD = [(o, w) for o, w in BAD if "chunk_numel" not in o] + [
    ({"workers": -2}, "workers must be a positive integer"),
    ({"workers": 1.5}, "workers must be a positive integer"),
    ({"device": "cuda"}, "no cuda device is available" if not torch.cuda.is_available() else "cuda"),
]
if torch.cuda.is_available():
    SEARCH_BAD.pop()


@pytest.mark.parametrize("options, why", SEARCH_BAD, ids=[str(o) for o, _ in SEARCH_BAD])
@pytest.mark.parametrize("plan", [False, True])
def test_search_checks_device_and_workers_as_merge_does_before_anything_runs(inputs, options, why, plan):
    from ram_live import search

    agents, base = inputs
    called = []

    def evaluate(merged):
        called.append(1)
        return 0.0

    with pytest.raises(ConfigError, match=why.replace("(", r"\(")):
        search(agents, base=base, evaluate=evaluate, budget=4, plan=plan, **options)
    assert not called


@pytest.mark.parametrize(
    "flags, why",
    [
        (["--device", "meta"], "holds no values"),
        (["--device", "cuda:99"], "cuda"),
        (["--device", "cpu:x"], "device='cpu:x'"),
    ],
)
@pytest.mark.parametrize("plan", [False, True])
def test_the_search_command_refuses_a_bad_device_without_a_traceback(tmp_path, base_sd, flags, why, plan, capsys):
    from safetensors.torch import save_file

    from ram_live.cli import main

    paths = []
    for name, sd in (
        ("base", base_sd),
        ("a", {k: v + 1 for k, v in base_sd.items()}),
        ("b", {k: v * 2 for k, v in base_sd.items()}),
    ):
        paths.append(tmp_path / f"{name}.safetensors")
        save_file(sd, str(paths[-1]))
    (tmp_path / "score_mod.py").write_text("def score(merged):\n    raise SystemExit('scored')\n")
    argv = ["search", f"a={paths[1]}", f"b={paths[2]}", "--base", str(paths[0]), "--budget", "3"]
    argv += ["--eval", "score_mod:score", *flags] + (["--plan"] if plan else ["--out", str(tmp_path / "out")])
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert code == 2 and why in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
