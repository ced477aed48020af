"""One genuine verl run per test session (CPU, 2 processes, gloo): see make_checkpoints.py. Skipped without verl
(its own environment: scripts/test_verl.sh)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false", VERL_LOGGING_LEVEL="WARNING"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(), timeout=600)
    if proc.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-4000:]}")


def _merger(local_dir: Path, target: Path, log: Path) -> subprocess.Popen:
    fh = open(log, "w")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(local_dir),
            "--target_dir",
            str(target),
        ],
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=_env(),
    )


@pytest.fixture(scope="session")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """base/ (tiny Qwen2, bf16), root/<agent>/global_step_N/actor (verl checkpoints), store/ (the coder's snapshots,
    written by the callback during its run), ref/ (all-gathered fp32 weights), merged_tools/ and merged_lora/
    (verl's own model merger on tools step 2 and lora step 1)."""
    pytest.importorskip("verl.trainer")  # not "verl": this folder is a namespace package of that name
    from verl_helpers import build_base

    tmp = tmp_path_factory.mktemp("verl")
    base, root, store, ref = tmp / "base", tmp / "root", tmp / "store", tmp / "ref"
    ref.mkdir()
    build_base(base)
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(HERE / "make_checkpoints.py"),
            str(base),
            str(root),
            str(store),
            str(ref),
        ],
        tmp / "torchrun.log",
    )
    jobs = [
        (
            _merger(root / "tools" / "global_step_2" / "actor", tmp / "merged_tools", tmp / "merger_tools.log"),
            tmp / "merger_tools.log",
        ),
        (
            _merger(root / "lora" / "global_step_1" / "actor", tmp / "merged_lora", tmp / "merger_lora.log"),
            tmp / "merger_lora.log",
        ),
    ]
    for proc, log in jobs:
        if proc.wait(timeout=600):
            raise AssertionError(f"verl.model_merger failed:\n{log.read_text()[-4000:]}")
    return SimpleNamespace(
        tmp=tmp,
        base=base,
        root=root,
        store=store,
        ref=ref,
        merged_tools=tmp / "merged_tools",
        merged_lora=tmp / "merged_lora",
    )
