"""gpu_check.py's vLLM check: ``benchmarks/bench_vllm.py`` on the device, greedy float32 (seconds per candidate
through VLLMGenerate and through Hugging Face generate, and how many completions agree). Skipped where vLLM is not
installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .runner import Outcome, Skip

BENCH = Path(__file__).resolve().parents[1] / "bench_vllm.py"


def check_vllm(device: torch.device, out: Outcome, timeout: float) -> None:
    """bench_vllm.py in a process of its own (each engine in one more); the figures go into ``out.result``."""
    if importlib.util.find_spec("vllm") is None:
        raise Skip("vLLM is not installed here (pip install -e '.[vllm]')")
    if device.type != "cuda":
        raise Skip("the vLLM check times vLLM on a GPU (tests/vllm_engine check it on a CPU)")
    with tempfile.TemporaryDirectory() as tmp:
        figures = Path(tmp) / "vllm.json"
        cmd = [sys.executable, str(BENCH), "--samples", "1", "--prompts", "64", "--hidden", "1024", "--layers", "12"]
        proc = subprocess.run([*cmd, "--json", str(figures)], capture_output=True, text=True, timeout=timeout)
        if not out.require(proc.returncode == 0, f"bench_vllm.py failed: {proc.stderr[-2000:]}"):
            return
        result = json.loads(figures.read_text())
    out.result.update(result)
    out.require(result["identical"] is not None and result["identical"] > 0, "no greedy completion agrees")
