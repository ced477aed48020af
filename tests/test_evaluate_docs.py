"""docs/evaluate.md's ten-line path (the README's snippet) runs as copied on tiny saved Llama folders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import evaluate_helpers as h
from evaluate_helpers import ANSWERS, PROMPTS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "evaluate.md"


def first_python_block(text: str) -> str:
    match = re.search(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
    if match is None:
        raise AssertionError("docs/evaluate.md has no ```python block")
    return match.group(1)


def test_the_snippet_is_short():
    assert len(first_python_block(PAGE.read_text(encoding="utf-8")).strip().splitlines()) <= 15


def test_the_snippet_runs_as_copied(tmp_path):
    tok, base = h.tokenizer(), h.model(0)
    base.save_pretrained(tmp_path / "ckpt" / "base")
    tok.save_pretrained(tmp_path / "ckpt" / "base")
    for i, name in enumerate(["coder", "tools"]):
        g = torch.Generator().manual_seed(10 + i)
        agent = h.model(0)
        with torch.no_grad():
            for p in agent.parameters():
                p.add_((torch.rand(p.shape, generator=g) < 0.3) * torch.randn(p.shape, generator=g) * 0.5)
        agent.save_pretrained(tmp_path / "ckpt" / name)
    with open(tmp_path / "held_out.jsonl", "w") as f:
        for p, a in zip(PROMPTS, ANSWERS):
            f.write(json.dumps({"prompt": p, "answer": a}) + "\n")
    code = first_python_block(PAGE.read_text(encoding="utf-8"))
    script = tmp_path / "snippet.py"
    script.write_text(code + "\nprint('snippet finished')\n", encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, f"docs/evaluate.md's snippet failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.stdout.splitlines()[-1] == "snippet finished" and "best:" in proc.stdout
    saved = tmp_path / "generalist"
    assert (saved / "config.json").is_file() and (saved / "tokenizer.json").is_file()
    assert h.transformers.AutoModelForCausalLM.from_pretrained(saved).config.vocab_size == len(h.VOCAB)


def test_the_readme_shows_the_snippet_that_runs():
    """The README's ten-line path is docs/evaluate.md's, which the test above runs as copied."""
    snippet = first_python_block(PAGE.read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python[ \t]*\n(.*?)^```[ \t]*$", readme, re.S | re.M)
    assert snippet in blocks
