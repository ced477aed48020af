"""The README is a front page: its Quickstart runs as copied, it stays short, and no relative link is broken."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def first_python_block(text: str) -> str:
    match = re.search(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)
    assert match, "README.md has no ```python block"
    return match.group(1)


def links(text: str) -> list[str]:
    """Link targets of a markdown text, outside code blocks and code spans."""
    return LINK.findall(INLINE_CODE.sub("", FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``_`` and ``-`` kept), spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: x, x-1, x-2, ...
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def test_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250: reference material goes to docs/)"


def test_readme_quickstart_runs_as_copied(tmp_path: Path) -> None:
    code = first_python_block(README.read_text(encoding="utf-8"))
    marker = "README quickstart finished"
    script = tmp_path / "quickstart.py"
    script.write_text(code + f"\nprint({marker!r})\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"the README's Quickstart failed:\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout.splitlines()
    assert out and out[-1] == marker, proc.stdout
    # it printed the probe table: one row per agent, with its density
    for agent in ("coder", "tools", "memory"):
        assert any(line.split()[:1] == [agent] and "%" in line for line in out), proc.stdout


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest})")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: " + "; ".join(broken)


def test_link_checker_finds_links() -> None:
    """The checker is not vacuous: it sees links, skips code, and slugs headings as GitHub does."""
    text = "[a](docs/x.md) `[b](no.md)` [c](https://e.org)\n```\n[d](code.md)\n```\n![img](p.png)"
    assert links(text) == ["docs/x.md", "https://e.org", "p.png"]
    assert (
        slug("`python benchmarks/bench_lora.py` — LoRA adapters (runs A and B)")
        == "python-benchmarksbench_lorapy--lora-adapters-runs-a-and-b"
    )
    assert slug("The Lightning callback: `RAMCallback`") == "the-lightning-callback-ramcallback"
