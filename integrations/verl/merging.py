"""The latest snapshot of every agent merged into ``merged_dir/<agent>/global_step_<N>`` (a Hugging Face folder
with ``ram_merge.json``; ``global_step_<N>-v1``, ... where the name is taken: nothing is replaced), evaluated, this
run's old merges pruned; the ``ram/*`` merge metrics, with ρ and λ from :func:`~ram_live.methods.ram.lambdas.rho` /
:func:`~ram_live.methods.ram.lambdas.ram_lambda` (the merge's own formula). Agents that changed no entry are
named in one warning and in ``ram_merge.json`` (``"unchanged"``)."""

from __future__ import annotations

import json
import math
import re
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import torch
from torch import Tensor

from ram_live.errors import ConfigError
from ram_live.methods import Activity
from ram_live.methods.ram.config import RamConfig
from ram_live.methods.ram.rules import Given
from ram_live.methods.ram.lambdas import rho as rho_of
from ram_live.engine.unchanged import quiet_unchanged, unchanged_agents, warn_unchanged
from ram_live.store import SnapshotStore, ram_statistics

from .._common import agent_folder, place_new
from .common import VerlIntegrationError, copy_side_files
from .config import RAMVerlOptions

__all__ = ["MergeHost", "merge_latest", "prune_merged"]


class MergeHost(Protocol):
    """What the merge reads of :class:`~ram_live.integrations.verl.core.RAMVerl`."""

    opts: RAMVerlOptions
    store: SnapshotStore
    base_dir: Path | None
    evaluate: Callable[..., Mapping[str, Any]] | None
    evaluations: Any  # .evaluation.Evaluations: ``evaluate``, ``search``, ``confirm`` (here or in a Ray actor)
    run: str | None  # this agent's run in the store (its own snapshots are taken from it)

    def out_dtype(self) -> torch.dtype | None: ...


def _merged_keys(snap: Any) -> list[str]:
    base = snap.base_source()
    aliases = base.aliases()
    return [k for k in base.keys() if k not in aliases and base.spec(k).dtype.is_floating_point]


def _float(value: Any) -> float:
    if isinstance(value, Tensor):
        return float(value.detach().float().mean().item())
    return float(value)


def _counts(
    snaps: dict[str, Any], info: Any, o: Any, agents: dict[str, Any] | None = None, ram: RamConfig | None = None
) -> tuple[list[int], list[int], int]:
    """Per agent the active and unique entries and the entries merged: the merge's own counts when it took
    global ones, else a statistics pass with its activity rule (on ``agents``, the merged sources, when given)."""
    names = list(snaps)
    ram = ram or o.ram
    if info.statistics is not None and ram.rho_scope == "global":
        total = sum(snaps[names[0]].base_source().spec(k).numel for k in _merged_keys(snaps[names[0]]))
        return info.statistics.active.tolist(), info.statistics.unique.tolist(), total
    stats = ram_statistics(
        next(iter(snaps.values())).base_source(), list((agents or snaps).values()), Activity(ram.activity, ram.eps)
    )  # type: ignore[arg-type]
    return stats["active"].tolist(), stats["unique"].tolist(), stats["total"]


def _lora_merge(snaps: dict[str, Any], o: RAMVerlOptions) -> tuple[dict[str, Any] | None, Any, RamConfig, Any]:
    """``(agents, base, config, rule)`` of the merge: LoRA snapshots under ``ram.sparsify`` as the agents
    "base + sparsified ΔW" with ``eps=0`` (:func:`.lora.sparsified_agents`), else ``(None, None, o.ram, None)``."""
    from .lora import is_lora_snapshot, sparsified_agents

    rule = o.lora_rule()
    lora = [n for n, s in snaps.items() if is_lora_snapshot(s)]
    if rule is None or not lora:
        return None, None, o.ram, None
    if len(lora) != len(snaps):
        raise VerlIntegrationError(
            f"ram.sparsify={o.sparsify!r} applies to LoRA snapshots, and the store mixes LoRA agents "
            f"({', '.join(lora)}) with full-weight ones ({', '.join(n for n in snaps if n not in lora)}); set "
            "ram.agents to merge one kind, or ram.sparsify=null"
        )
    agents, base = sparsified_agents(snaps, rule, Activity(o.ram.activity, o.ram.eps))  # type: ignore[arg-type]
    return agents, base, replace(o.ram, eps=0.0), rule


def stored_importance(snaps: Mapping[str, Any], o: RAMVerlOptions) -> str | None:
    """The merges' ``importance=``: ``"stored"`` under ``ram.importance=adam`` for full-weight snapshots that carry
    importances (every one must: a ConfigError names the agents without); None (plain RAM) under
    ``ram.importance=null``, for LoRA snapshots, and where no snapshot carries any (checkpoints saved without the
    optimizer's state: the snapshot step logged it once per agent)."""
    from .lora import is_lora_snapshot

    if o.importance != "adam" or any(is_lora_snapshot(s) for s in snaps.values()):
        return None
    if all(getattr(s, "importance", None) is None for s in snaps.values()):
        return None
    return "stored"


def _ram_record(config: RamConfig) -> dict[str, Any]:
    """RAM's config in ``ram_merge.json`` as the ``ram.*`` keys: ``variant`` and every keyword it takes."""
    method, options = config.flat(defaults=True)
    return {"variant": method, **options}


def merge_latest(ram: MergeHost, step: int) -> tuple[dict[str, float], Path]:
    """What :meth:`RAMVerl.merge` does (see there); returns the metrics and the merged folder."""
    from ram_live.api import merge, ram_merge

    o = ram.opts
    if not o.merged_dir:
        raise ConfigError("ram.merged_dir is not set")
    t0 = time.perf_counter()
    root = agent_folder(Path(o.merged_dir), o.agent)
    root.mkdir(parents=True, exist_ok=True)
    building = root / f".global_step_{step}.building-{uuid.uuid4().hex[:8]}"
    names = list(o.agents) if o.agents is not None else ram.store.agents()
    # every agent's latest, and this run's own snapshot even where a newer run of the agent began (opened once)
    snaps = {a: ram.store.latest(a, run=ram.run if a == o.agent else None) for a in names}
    if not snaps:
        raise VerlIntegrationError(f"{ram.store.root}: no snapshot to merge")
    searched = result = agents = rule = None
    used = o.ram
    try:
        with quiet_unchanged():  # an agent that changed nothing is named once, below, whatever the method
            if o.search is not None:  # the merge ram_live.search picks (integrations/verl/search.py)
                from .search import search_merge

                searched, result = search_merge(ram, snaps, step, root, importance=stored_importance(snaps, o))
                _, info = merge(snaps, out=building, dtype=ram.out_dtype(), return_info=True, **result.best)
            else:
                agents, base, used, rule = _lora_merge(snaps, o)
                _, info = ram_merge(
                    agents or snaps,
                    base,
                    out=building,
                    dtype=ram.out_dtype(),
                    config=used,
                    return_info=True,
                    importance=None if agents else stored_importance(snaps, o),
                )
        names = list(snaps)
        active, unique, total = _counts(snaps, info, o, agents, used)
        unchanged = unchanged_agents(names, active)
        rho = {n: rho_of(float(u), float(a)) for n, a, u in zip(names, active, unique)}
        given = isinstance(used.lam, Given)
        lambdas = {} if searched or given else {n: used.lam.value(rho[n]) for n in names}
        if info.lambdas is not None and (used.rho_scope == "global" or given):
            lambdas.update(info.lambdas)
        density = {n: a / total if total else 0.0 for n, a in zip(names, active)}
        if ram.base_dir is not None:
            copy_side_files(ram.base_dir, building)
        record = {
            "step": step,
            "agents": {n: s.step for n, s in snaps.items()},
            **_ram_record(used),
            "sparsify": str(rule) if rule is not None else None,
            "lambda": lambdas,
            "rho": {n: (v if math.isfinite(v) else None) for n, v in rho.items()},
            "density": density,
            "unchanged": unchanged,
            "weights": o.weights,
            "store": str(ram.store.root),
        }
        if searched is not None:
            from ram_live.training.search_record import save_record

            record.update(variant=searched["best"]["method"], search=searched)
            save_record(building / "ram_search.json", searched, result, durable=False)
        provenance = building / "ram_merge.json"  # the library's record of the merge (inputs, checksums, version)
        library = json.loads(provenance.read_text()) if provenance.is_file() else {}
        provenance.write_text(json.dumps({**library, **record}, indent=1))
        final = place_new(building, root, f"global_step_{step}")  # a taken name (a resumed run): -v1, ...
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    warn_unchanged(unchanged, f"RAMVerl({o.agent!r}), merge of step {step}: ", force=True)
    if o.keep_merged is not None:
        prune_merged(root, o.keep_merged)
    metrics: dict[str, float] = {"ram/agents": float(len(snaps)), "ram/merge_seconds": time.perf_counter() - t0}
    for n, s in snaps.items():
        metrics[f"ram/{n}/snapshot_step"] = float(s.step)
        metrics[f"ram/{n}/density"] = density[n]
        metrics[f"ram/{n}/rho"] = rho[n]
        if n in lambdas:
            metrics[f"ram/{n}/lambda"] = lambdas[n]
    if searched is not None:
        from ram_live.training.search import search_metrics

        metrics.update(search_metrics(searched, layout="verl"))
    if ram.evaluate is not None:
        scores = ram.evaluate(str(final), step=step) or {}
        for k, v in scores.items():
            metrics[k if k.startswith("ram/") else f"ram/{k}"] = _float(v)
    return metrics, final


_MERGED = re.compile(r"global_step_(\d+)(?:-v(\d+))?")


def prune_merged(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` merged folders under ``root`` (this agent's folder of ``merged_dir``):
    ``global_step_<N>`` and its versions ``global_step_<N>-v<k>``, ordered by step, then version."""
    found = []
    for p in root.iterdir():
        match = _MERGED.fullmatch(p.name)
        if match and p.is_dir():
            found.append((int(match[1]), int(match[2] or 0), p))
    for _, _, p in sorted(found)[: max(0, len(found) - keep)]:
        shutil.rmtree(p, ignore_errors=True)
