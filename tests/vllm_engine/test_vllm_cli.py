"""``ram-live search --generate vllm``: the command's search through vLLM (started from the --base folder, in
--eval-dtype) writes the same table and winner as the same command through Hugging Face generate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from safetensors.torch import save_file

from vllm_helpers import PROMPTS, agents, base_state

REWARD = """def count_a(completions, **kwargs):
    return [float(c.count("a")) + 0.1 * len(c) for c in completions]
"""


def test_search_generate_vllm_writes_the_hugging_face_path_s_table_and_winner(base_dir, tmp_path):
    (tmp_path / "my_reward.py").write_text(REWARD)
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    named = []
    for name, state in agents(base_state(base_dir)).items():
        save_file(state, tmp_path / f"{name}.safetensors")
        named.append(f"{name}={tmp_path / f'{name}.safetensors'}")
    found = {}
    for engine in ("hf", "vllm"):
        cmd = [sys.executable, "-m", "ram_live", "search", *named, "--base", str(base_dir)]
        cmd += ["--reward", "my_reward:count_a", "--prompts", "held_out.jsonl", "--max-new-tokens", "8"]
        cmd += ["--eval-dtype", "fp32", "--budget", "4", "--out", f"out_{engine}", "--quiet"]
        cmd += ["--generate", "vllm"] if engine == "vllm" else []
        env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}  # the engine's default
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((tmp_path / f"out_{engine}" / "search.json").read_text())
        found[engine] = [(t["method"], t["options"], t["score"]) for t in result["history"]]
    assert found["vllm"] == found["hf"]
    assert len({score for *_, score in found["hf"]}) > 1
