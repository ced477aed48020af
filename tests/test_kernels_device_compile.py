"""Every device kernel builds with Triton's real compiler for an H100/H200 (sm_90: Triton's frontend, LLVM and the
ptxas it ships, down to a cubin), on a machine without a GPU: tests/kernel_compile.py records each op's launches on
CPU tensors and compiles them, in a process without Triton's interpreter. What the interpreter's tests cannot see
(a construct the compiler rejects, a register or resource limit, a contracted multiply-add or an approximate
division that would change the CPU's bits) fails here, and so do the resources of bandwidth-bound code: at most 128
registers a thread (16 warps a multiprocessor) and no spills, every input read with 128-bit loads, and one
specialisation per kernel and dtype in a merge (odd sizes and slots 8 bytes off a 16-byte boundary bind the same)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def _ptxas() -> bool:
    spec = importlib.util.find_spec("triton")
    root = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return root.is_file() and os.access(root, os.X_OK)


@pytest.mark.skipif(not _ptxas(), reason="this Triton has no NVIDIA backend with ptxas")
def test_every_kernel_builds_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # a real build, not a cached one
    script = Path(__file__).with_name("kernel_compile.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--arch", "90", "--specialisations"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert len(lines) == 44 and all(line.startswith("ok   sm_90") for line in lines), proc.stdout
    assert all("0 B local" in line for line in lines), "a kernel spills registers to local memory:\n" + proc.stdout
    # the CPU's bits on the GPU: float32 rounded at every operation, as the eager CPU merge does
    assert all("0 f32 fma, 0 approximate f32 divisions" in line for line in lines), proc.stdout
    for line in lines:
        registers = int(re.search(r"(\d+) registers", line).group(1))
        assert registers <= 128, line
        if "thresholds" in line or "edges" in line:  # a program per tensor: a few histogram rows, 2 x 64 entries
            continue
        # the bulk of each input in 16-byte vectors: at least one 128-bit load per input the kernel reads (the
        # radix histogram's first case reads two of its three agents)
        k = int(re.search(r"K=(\d+)", line).group(1))
        wide = int(re.search(r"(\d+) x 128-bit", line).group(1))
        assert wide >= (k if line.count("radix histogram") else k + 1), line
    specs = [line for line in proc.stdout.splitlines() if line.startswith("spec ")]
    assert len(specs) == 44 and all(line.startswith("spec same") for line in specs), proc.stdout
