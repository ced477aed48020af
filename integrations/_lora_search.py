"""``search=`` on a LoRA run (:class:`._peft_agent.LoraSchedule`): at each merge :func:`ram_live.search` over the
agents' latest adapters (:mod:`ram_live.selection.adapters`), each candidate evaluated in the live ``PeftModel``
with its merged weights in the targeted base layers and the live adapter's ``lora_B`` zeroed (restored bit for bit
after each), the winner merged as the run saves it: re-factored into an adapter (every candidate is re-factored as
the run's ``svd_options`` say, and the ``rank`` move tries the agents' rank and twice it) or, with
``into_base=True``, folded into the base weights (exact candidates, no ``rank``). Under DDP every rank runs the same
search on scores averaged over the ranks; rank 0 writes the record (``<store>/_search/<agent>/step_<N>.json``).

>>> tensors, info, factors, report, record = lora_search(schedule, model, adapters, step, evaluate)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..peft.factors import AdapterSet, weight_key
from ..selection.adapters import ADAPTER_SPACE, AdapterAgents
from ..store import LocalModel
from ..training.candidates import candidate_evaluation
from ..training.search import SearchSetting, record_of
from ..training.search_record import jsonable, save_record

__all__ = ["check_into_base_space", "lora_search"]


def check_into_base_space(setting: SearchSetting, who: str) -> None:
    """A ``ConfigError`` for a searched ``rank`` with ``into_base=True`` (the saved generalist is the exact merge
    folded into the base weights: no adapter is re-factored)."""
    from ..selection.space import parse_space

    if setting.space is None:
        return
    for family in parse_space(setting.space):
        if family.kind == "rank" or any("rank" in o for o in family.grid):
            raise ConfigError(
                f"{who}: search space entry {family.name!r} searches rank=, the re-factored adapter's rank; "
                "with into_base=True the generalist is folded into the base weights: leave rank out"
            )


def lora_search(
    schedule: Any, model: Any, adapters: AdapterSet, step: int, fallback: Callable[..., Any] | None
) -> tuple[dict[str, torch.Tensor], Any, dict[str, Any], Any, dict[str, Any]]:
    """The merge the adapter search picks among ``adapters`` (the picked snapshots' factors).

    Args:
        schedule: the :class:`._peft_agent.LoraSchedule` (its ``search`` setting, layers, collective, store).
        model: the live ``PeftModel`` the candidates are evaluated in.
        adapters: the agents' adapters.
        step: the training step (the record's name).
        fallback: the evaluation when the setting names none.

    Returns:
        The winner's tensors, MergeInfo, re-factored modules and report (:meth:`LoraSchedule.merge_with`), and the
        search's record (its ``best`` with the ``rank`` the adapter was re-factored to).

    Raises:
        ConfigError: a race (``fidelity``) without an evaluation scoring prompts one by one, or an invalid option.
        SearchError: an evaluation that raised or returned no finite number.
    """
    from ..selection import search

    setting: SearchSetting = schedule.search
    c = schedule.collective
    layers = {m: schedule._layers[m] for m in adapters.order}
    base = {weight_key(m): layer.get_base_layer().weight.detach().clone() for m, layer in layers.items()}
    live_tensors, zeros = {}, {}
    for m, layer in layers.items():
        live_tensors[weight_key(m)] = layer.get_base_layer().weight
        live_tensors[f"{m}.lora_B"] = schedule._factors[m].B
        zeros[f"{m}.lora_B"] = torch.zeros_like(schedule._factors[m].B)
    live = LocalModel.from_obj(live_tensors, name=schedule.agent)

    def wrap(fn: Callable[..., Any]) -> Callable[[Any], float]:  # the live adapter's lora_B zeroed meanwhile
        return candidate_evaluation(setting, fn, live, model, c, zeros)

    space = setting.space
    if space is None and schedule.into_base:
        space = {k: v for k, v in ADAPTER_SPACE.items() if k != "rank"}
    svd = None if schedule.into_base else schedule.svd_options
    confirm = setting.confirmation()
    t0 = time.perf_counter()
    result = search(
        AdapterAgents(adapters, base, live=False, svd=svd),
        evaluate=wrap(setting.evaluation(fallback)),
        confirm=wrap(confirm) if confirm is not None else None,
        **{**setting.search_options(schedule.agent, step, getattr(schedule, "run", None)), "space": space},
    )
    seconds = time.perf_counter() - t0
    best = dict(result.best)
    method, sparsify, rank = best.pop("method"), best.pop("sparsify", "auto"), best.pop("rank", None)
    record = record_of(setting, result, step=step, seconds=seconds)
    if svd is not None:
        svd = svd if rank is None else dataclasses.replace(svd, rank=rank)
        if svd.rank is None and svd.energy is None:
            svd = dataclasses.replace(svd, rank=adapters.max_rank())  # what make_refactorer takes
        if svd.rank is not None:
            record["best"]["rank"] = svd.rank
        record["svd_options"] = jsonable(dataclasses.asdict(svd))
    tensors, info, factors, report = schedule.merge_with(
        adapters, method, best, sparsify, svd if svd is not None else schedule.svd_options
    )
    path = Path(schedule.store.root) / "_search" / schedule.agent / f"step_{step}.json"
    record["file"] = str(path)
    if c.rank == 0:
        save_record(path, record, result, durable=schedule.durable)
    return tensors, info, factors, report, record
