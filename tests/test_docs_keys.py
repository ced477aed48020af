"""docs/callbacks.md's "Every logged key" names every key the code logs: each of TRL's layout in full, the objective
of every layout, each merge key and the search's per-task key of every layout."""

from __future__ import annotations

from pathlib import Path

from ram_live.integrations.metrics import LAYOUTS, search_task_key
from ram_live.training.tensors import MergeResult

DOC = Path(__file__).resolve().parent.parent / "docs" / "callbacks.md"
NAMES = {"task": "<task>", "metric": "<metric>", "func": "<fn>"}


def _section() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index("## Every logged key") :]


def test_every_trl_key_and_every_objective_is_listed_with_a_definition():
    section = _section()
    for kind, templates in LAYOUTS["trl"].items():
        for template in templates:
            key = "ram/" + template.format(**NAMES)
            row = next((line for line in section.splitlines() if f"`{key}`" in line), None)
            assert row is not None, f"{kind}: {key} not in docs/callbacks.md's key list"
            assert row.count("|") >= 3 and row.rsplit("|", 2)[-2].strip(), f"{key} has no definition"
    for layout, keys in LAYOUTS.items():
        for template in keys["objective"]:
            assert f"`ram/{template.format(**NAMES)}`" in section, layout
        assert f"`ram/search/{search_task_key('<task>', '<metric>', layout)}`" in section, layout
    assert "`ram/search/eval/<task>`" in section


def test_every_merge_key_is_listed():
    import torch

    result = MergeResult(
        3, {"w": torch.zeros(1)}, {"coder": 3}, {"coder": 1.2}, {"coder": 0.5}, {"coder": 0.1}, 1.0, "ram_plus"
    )
    section = _section()
    for key in result.metrics():
        shown = key.replace("coder", "<agent>")
        assert f"`{shown}`" in section, shown
