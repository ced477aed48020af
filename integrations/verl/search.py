"""``ram.search`` for verl: each merge is the one :func:`ram_live.search` picks with the user's held-out evaluation.

The evaluation is verl's kind, ``fn(merged_dir: str, step: int) -> dict | float`` (``ram.search.evaluate``, else
``ram.evaluate`` / ``ram.rewards``): this process writes each candidate to one reused folder under
``merged_dir/<agent>`` (weights in the merged dtype, the base's config and tokenizer files) and evaluates it there
with one call: in this process, or inside a Ray job in the evaluation actor (:mod:`.remote`), which reads the folder
by path. The winner is merged into ``merged_dir/<agent>/global_step_<N>`` as without search; its ``ram_merge.json``
gains ``"search"`` (the chosen options: ``ram_live.merge(..., **record["best"])``) and ``ram_search.json`` holds
every candidate's score. The candidates are scored one at a time (``ram_live.search``'s ``parallel=`` is not
used here).

>>> +ram.search.budget=60 +ram.search.metric=acc +ram.search.evaluate=my_pkg.evals:held_out   # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

import torch

from ram_live.training.search import SearchSetting, record_of

from .common import copy_side_files

__all__ = ["search_merge"]


def search_merge(
    ram: Any, snaps: Mapping[str, Any], step: int, root: Path, importance: str | None = None
) -> tuple[dict[str, Any], Any]:
    """Run the search of ``ram.opts.search`` over ``snaps`` (the store's latest snapshots) on the store's base
    (``importance``: ``"stored"`` adds the snapshots' stored importances as a variant); returns the record (with
    ``"best"``) and the :class:`~ram_live.selection.SearchResult`."""
    from safetensors.torch import save_file

    from ram_live.selection import search

    setting: SearchSetting = ram.opts.search
    fn = ram.evaluations.search  # here, or in the Ray actor (integrations/verl/evaluation.py): one call a candidate
    confirm = ram.evaluations.confirm
    dtype = ram.out_dtype()
    candidate = root / f".search_step_{step}-{uuid.uuid4().hex[:8]}"

    def write(merged: Any) -> str:
        candidate.mkdir(parents=True, exist_ok=True)
        tensors = {
            k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
            for k, v in (merged if isinstance(merged, Mapping) else merged.state_dict()).items()
        }
        save_file(tensors, str(candidate / "model.safetensors"))
        if ram.base_dir is not None:
            copy_side_files(ram.base_dir, candidate, keep_existing=True)
        return str(candidate)

    def wrap(evaluate: Any) -> Any:
        return lambda merged: setting.score(evaluate(write(merged), step=step))

    base = next(iter(snaps.values())).base_source()
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            result = search(
                dict(snaps),
                base=base,
                evaluate=wrap(fn),
                confirm=wrap(confirm) if confirm is not None else None,
                importance=importance,
                **setting.search_options(ram.opts.agent, step, getattr(ram, "run", None), inputs=(dict(snaps), base)),
            )
    finally:
        shutil.rmtree(candidate, ignore_errors=True)
    return record_of(setting, result, step=step, seconds=time.perf_counter() - t0), result
