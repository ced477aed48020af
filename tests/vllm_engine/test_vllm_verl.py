"""verl's ``+ram.rewards.generate=vllm`` (and ``dtype``): checked at start-up, and the evaluation of a merged folder
through vLLM logs what the Hugging Face path logs (ram_live.integrations.verl.rewards; verl itself is not needed for a
TRL-style ``reward``). In a process of its own: it starts its own engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ram_live.errors import ConfigError
from ram_live.integrations.verl.rewards import check_rewards
from vllm_helpers import PROMPTS

SCRIPT = """
import json, sys
from ram_live.integrations.verl.rewards import check_rewards, rewards_evaluation
base = sys.argv[1]
out = {}
for engine in ("hf", "vllm"):
    values = check_rewards({"prompts": "held_out.jsonl", "reward": "my_reward:count_a", "max_new_tokens": "8",
                            "generate": engine, "dtype": "float32"})
    out[engine] = rewards_evaluation(values, base)(base)
print(json.dumps(out))
"""


def test_rewards_generate_is_checked_at_start_up(tmp_path):
    prompts = [{"prompt": p} for p in PROMPTS]
    assert check_rewards({"prompts": prompts, "generate": "vllm", "dtype": "bfloat16"})["generate"] == "vllm"
    with pytest.raises(ConfigError, match="ram.rewards.generate must be one of hf, vllm; got 'sglang'"):
        check_rewards({"prompts": prompts, "generate": "sglang"})
    with pytest.raises(ConfigError, match="ram.rewards.dtype: rewards: dtype must be a floating torch dtype"):
        check_rewards({"prompts": prompts, "dtype": "int8"})


def test_a_merged_folder_scores_and_logs_as_through_hugging_face(base_dir, tmp_path):
    (tmp_path / "my_reward.py").write_text(
        "def count_a(completions, **kw):\n    return [float(c.count('a')) + 0.1 * len(c) for c in completions]\n"
    )
    (tmp_path / "held_out.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "data_source": f"task{i % 2}"}) + "\n" for i, p in enumerate(PROMPTS))
    )
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(base_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["vllm"] == out["hf"]
    assert "ram/val-core/task0/reward/mean@1" in out["hf"]
