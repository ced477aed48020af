"""``search`` over LoRA / PEFT adapters: the agents are adapter folders (a folder with ``adapter_config.json``),
or the named adapters of a live ``PeftModel``, merged into the base weights as :mod:`ram_live.peft` merges them.

Spellings, as the adapter entry points take them:

- folders: ``search(["runs/code", "runs/tool"], base=base, evaluate=...)`` (named after their folders) or
  ``search({"code": "runs/code", ...}, base=base, ...)``; the winner is re-made bit for bit by
  ``ram_merge_adapter_files(folders, base=base, into_base=True, **result.best)``;
- a live model: ``search(peft_model, adapters=["code", "tool"], evaluate=...)`` (``adapters=None``: all of them;
  no ``base=``: the model's own base, a plain copy of it made once); re-made by
  ``ram_merge_adapters(peft_model, ["code", "tool"], into_base=True, **result.best)``.

The evaluation gets the merged base model, as ``search`` hands it for full models: a module for a module base (and
for a live model), a state dict for a state-dict or path base. Each adapter is the agent "base + ΔW_t"
(:class:`~ram_live.peft.deltas.BasePlusDeltaSource`) with ΔW_t sparsified by the candidate's activity rule
(``sparsify=``, as :func:`~ram_live.peft.ram_merge_adapter_files` takes it: a candidate without it has
``"auto"``, TopK(0.5) for the RAM family and no rule for the baselines); the sources are made once per rule, and a
rule hands the RAM family ``eps=0`` (every kept entry counts), as ``prepare_merge`` does. The RAM side also
searches the rule's density (the ``sparsify`` move, :data:`ADAPTER_SPACE`).

The re-factored adapter's output rank is searched too (the ``rank`` move, :func:`rank_values`: the agents' own rank
and twice it, at most a targeted layer's full rank): a candidate with ``rank=k`` is the merge re-factored into a
rank-k adapter (``ram_merge_adapter_files(folders, out=..., **result.best)`` makes it; evaluated as the base with
that adapter's B'A' folded in), one without it the exact merge into the base weights. An :class:`AdapterAgents`
with ``svd`` (a LoRA callback's adapter output) re-factors every candidate: without ``rank``, at ``svd``'s.

Not searched: per-agent weights in the shared mean (``shared_weights``, ``importance=``: the adapter entry points
take no importances, so such a winner could not be re-made).

``parallel=N`` scores candidates in N workers as for full models (:mod:`~ram_live.selection.parallel`): each builds
its own :class:`AdapterMerger` from the :class:`AdapterAgents` read once here (the factors and the base go to the
workers as full models' tensors do), so the trials, the winner and the table are those of ``parallel=1``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..engine.stream import DEFAULT_CHUNK_NUMEL
from ..errors import ConfigError, UnsupportedInputError
from ..io.sources import as_source
from ..methods import Activity
from ..peft.deltas import AdapterDeltas, BasePlusDeltaSource
from ..peft.factors import AdapterSet, check_consistent
from ..peft.sparsify import RAM_FAMILY, SparsifyRule, sparsify_rule
from ..peft.svd_options import SvdOptions
from .space import Family
from .target import Merger

__all__ = [
    "ADAPTER_SPACE",
    "ADAPTER_RAM_PLUS_GRID",
    "AdapterAgents",
    "AdapterMerger",
    "adapter_agents",
    "adapter_space",
    "check_families",
    "rank_values",
]

#: The RAM+ grid of an adapter search: the paper's default first, plain RAM (λ = 1), small r (λ > 1 measured to lose
#: on LoRA deltas: docs/peft.md, benchmarks/quality.md), the conflict-aware shared region last; with the default
#: rule, TopK(0.5). Six points: a screen of ``budget=60`` takes them all, and the arm's refinement starts with the
#: density.
ADAPTER_RAM_PLUS_GRID = [
    {"r": 0.1, "alpha": 2.0},
    {"r": 0.0, "alpha": 2.0},
    {"r": 0.25, "alpha": 2.0},
    {"r": 0.1, "alpha": math.inf},
    {"r": 0.5, "alpha": math.inf},
    {"r": 0.1, "alpha": 2.0, "shared": "sign"},
]
#: The default space of an adapter search: the RAM+ grid above, the ``sparsify`` move (the activity rule's density),
#: the λ ascent (``lambdas``, in place of ``shared_weights``, whose importances the adapter entry points do not
#: take), leave-one-out, the shared-region moves (the ``eps`` moves hardly change what a rule keeps: it decides what
#: is active), the re-factored output's rank (``rank``: :func:`rank_values`); the baselines as in the default space.
ADAPTER_SPACE: dict[str, Any] = {
    "ram_plus": ADAPTER_RAM_PLUS_GRID,
    "sparsify": None,
    "lambdas": None,
    "leave_one_out": None,
    "activity": [{"shared": "sign"}, {"shared": "mean"}],
    "rank": None,
    "task_arithmetic": None,
    "ties": None,
    "dare_ties": None,
    "ta_weights": None,
}
#: The activity rule's spelling in the agents' own reports (what a merge counts is the merge's own rule).
_REPORTED = Activity("abs", 1e-5)


@dataclass
class AdapterAgents:
    """The adapters of a search: their factors, and the base the merges go into (a live model: a plain copy of its
    base, made once). ``svd``: every candidate is re-factored into an adapter with these options (its ``rank``
    option, if any, replacing theirs), as a LoRA callback saves its generalist; None: only candidates with
    ``rank`` are. Given as ``search``'s ``models`` (no ``base=``), the adapters are searched as they are."""

    adapters: AdapterSet
    base: Any
    live: bool
    svd: SvdOptions | None = None


def rank_values(adapters: AdapterSet) -> list[int]:
    """The ``rank`` move's default values: the agents' largest rank r and 2r, each at most the largest full rank
    min(out, in) of a targeted layer (a larger k re-factors no layer differently), without repeats."""
    full = max(min(adapters.module(m).shape) for m in adapters.order)
    r = adapters.max_rank()
    return sorted({min(k, full) for k in (r, 2 * r)})


def _is_peft_model(obj: Any) -> bool:
    return isinstance(obj, nn.Module) and hasattr(obj, "peft_config")


def _is_adapter_folder(obj: Any) -> bool:
    return isinstance(obj, (str, os.PathLike)) and (Path(obj) / "adapter_config.json").is_file()


def adapter_agents(models: Any, base: Any, adapters: Sequence[str] | None) -> AdapterAgents | None:
    """``search``'s agents as adapters (read and checked), or None when they are full models.

    Args:
        models: ``search``'s ``models``: a live ``PeftModel``, adapter folders (a list, or a mapping name → folder),
            or full models.
        base: ``search``'s ``base``: needed with folders, refused with a live model (its own base is merged into).
        adapters: the live model's adapters to merge (None: all of them); refused otherwise.

    Raises:
        ConfigError: ``adapters=`` without a live model, ``base=`` with one, folders without ``base=``.
        UnsupportedInputError: adapters mixed with full models, a ``PeftModel`` among the agents.
        InputMismatchError, UnsupportedAdapterError, UnsupportedInputError, ConfigError: as
            :func:`~ram_live.peft.ram_merge_adapter_files` raises them (another base, adapters that disagree on a
            module, LoRA variants, a damaged ``adapter_config.json`` or ``adapter_model.safetensors``), naming the
            adapter and the file.
    """
    if isinstance(models, AdapterAgents):
        if base is not None or adapters is not None:
            raise ConfigError(
                "search(AdapterAgents(...), ...) holds its base and adapters: leave base= and adapters= out"
            )
        check_consistent(models.adapters)
        return models
    if _is_peft_model(models):
        if base is not None:
            raise ConfigError("search(peft_model, ...) merges into the model's own base: leave base= out")
        return _live(models, adapters)
    if adapters is not None:
        raise ConfigError(
            "adapters= names the adapters of a live PeftModel (search(peft_model, adapters=[...])); "
            "adapter folders are given as models=, a list or a mapping name → folder"
        )
    if isinstance(models, Mapping):
        named = [(str(k), v) for k, v in models.items()]
    elif isinstance(models, (list, tuple)):
        named = [(str(m) if isinstance(m, (str, os.PathLike)) else f"agent_{i}", m) for i, m in enumerate(models)]
    else:
        return None
    peft_models = [n for n, m in named if _is_peft_model(m)]
    if peft_models:
        raise UnsupportedInputError(
            f"agent {peft_models[0]!r} is a PeftModel: search its adapters with "
            "search(peft_model, adapters=[...]), or pass adapter folders"
        )
    folders = [n for n, m in named if _is_adapter_folder(m)]
    if not folders:
        return None
    full = [n for n, m in named if not _is_adapter_folder(m)]
    if full:
        raise UnsupportedInputError(
            f"agent {full[0]!r} is a full model and agent {folders[0]!r} a PEFT adapter "
            "folder (adapter_config.json): search adapters or full models, not a mix"
        )
    if base is None:
        raise ConfigError(
            "a search over adapter folders needs base= (the model the adapters were trained on: a "
            "module, a state dict or a checkpoint path)"
        )
    from ..peft.folders import read_folders
    from ..peft.merge_files import _check_base

    adapter_set, _ = read_folders(models, "cpu")
    check_consistent(adapter_set)
    _check_base(adapter_set, base)
    return AdapterAgents(adapter_set, base, live=False)


def _live(model: Any, adapters: Sequence[str] | None) -> AdapterAgents:
    """A live model's adapters, and a plain copy of its base (PEFT's ``unload`` on a deep copy, made once)."""
    from ..peft.live import read_live, tuner_of

    if adapters is not None and (isinstance(adapters, (str, bytes)) or not isinstance(adapters, Sequence)):
        raise ConfigError(f"adapters= must be a list of the model's adapter names, got {adapters!r:.80}")
    adapter_set = read_live(model, None if adapters is None else list(adapters))
    check_consistent(adapter_set)
    _, root = tuner_of(model)
    for name in adapter_set.order:
        merged = getattr(root.get_submodule(name), "merged_adapters", None)
        if merged:
            raise ConfigError(
                f"module {name!r} has adapters {merged} merged into its base weight; unmerge them "
                "(peft_model.unmerge_adapter()) before searching"
            )
    with torch.no_grad():
        plain = copy.deepcopy(model).unload()
    return AdapterAgents(adapter_set, plain, live=True)


def adapter_space(space: Any, importance: Any) -> Any:
    """``search``'s ``space`` for adapters (None: :data:`ADAPTER_SPACE`), after refusing importances, which an
    adapter search does not take.

    Args:
        space: as ``search`` takes it.
        importance: ``search``'s; refused unless None.

    Raises:
        ConfigError: ``importance`` given.
    """
    if importance is not None:
        raise ConfigError(
            "importance=: the adapter merges (ram_merge_adapter_files, ram_merge_adapters) take no "
            "importances, so a winner with them could not be re-made; leave it out for adapters"
        )
    return dict(ADAPTER_SPACE) if space is None else space


def check_families(families: list[Family], adapters: bool) -> None:
    """A ``ConfigError`` for a family or candidate the search's agents cannot take: ``sparsify`` (the activity
    rule of LoRA ΔW) and ``rank`` (the re-factored adapter's) over full models; importances (``shared_weights``,
    ``importance``) over adapters."""
    for family in families:
        where = f"space entry {family.name!r}"
        if not adapters and (family.kind == "rank" or any("rank" in o for o in family.grid)):
            raise ConfigError(
                f"{where}: rank= is the rank of a re-factored LoRA adapter; it applies to a search over "
                "adapters (PEFT adapter folders or a PeftModel), not over full models"
            )
        if not adapters and (family.kind == "sparsify" or any("sparsify" in o for o in family.grid)):
            raise ConfigError(
                f"{where}: sparsify= is the activity rule of LoRA adapters' ΔW; it applies to a search "
                "over adapters (PEFT adapter folders or a PeftModel), not over full models"
            )
        if adapters and (
            family.kind in ("shared_weights", "importance") or any("importance" in o for o in family.grid)
        ):
            raise ConfigError(
                f"{where}: the adapter merges take no importances (per-agent weights in the shared "
                "mean), so such a winner could not be re-made; use 'lambdas' for adapters"
            )


class AdapterMerger(Merger):
    """The search's merger over adapters: the agents "base + ΔW_t" per activity rule (made once per rule, cached),
    the rule taken from each candidate's ``sparsify`` (``"auto"`` without it) and its RAM counts kept per rule.

    Args:
        agents: from :func:`adapter_agents`.
        device, workers: as for :class:`~ram_live.selection.target.Merger`.
    """

    dare_seed = False  # ram_merge_adapter_files takes seed= as the SVD's: DARE keeps its own seed, 0

    def __init__(
        self, agents: AdapterAgents, *, device: str | torch.device | None = None, workers: int | None = None
    ) -> None:
        self.adapters = agents.adapters
        self.live = agents.live
        self._by_rule: dict[SparsifyRule | None, list[BasePlusDeltaSource]] = {}
        self._rule: SparsifyRule | None = None
        self.svd = agents.svd
        super().__init__(agents, agents.base, device=device, workers=workers)

    def _sources(self, models: Any, base: Any) -> tuple[list[Any], Any]:
        self.base_src = as_source(base, "base")
        return self._agents(None), self.base_src

    def _agents(self, rule: SparsifyRule | None) -> list[BasePlusDeltaSource]:
        if rule not in self._by_rule:
            self._by_rule[rule] = [
                BasePlusDeltaSource(self.base_src, AdapterDeltas(name, self.adapters.factors[name], rule, _REPORTED))
                for name in self.adapters.names
            ]
        return self._by_rule[rule]

    def rule_of(self, candidate: Mapping[str, Any]) -> SparsifyRule | None:
        """The activity rule ``candidate`` merges with (``"auto"`` without ``sparsify``)."""
        return sparsify_rule(candidate.get("sparsify", "auto"), candidate["method"])

    def options_of(self, candidate: Mapping[str, Any]) -> dict[str, Any]:
        """As ``ram_merge_adapter_files`` makes the config: no ``sparsify``, no SVD options (``seed`` among them),
        and ``eps=0`` for the RAM family with a rule unless given."""
        options = super().options_of(candidate)
        options.pop("sparsify", None)
        SvdOptions.take(options)
        if candidate["method"] in RAM_FAMILY and self.rule_of(candidate) is not None:
            options.setdefault("eps", 0.0)
        return options

    def svd_of(self, candidate: Mapping[str, Any]) -> SvdOptions | None:
        """How ``candidate``'s merge is re-factored into an adapter (None: merged into the base exactly)."""
        if "rank" in candidate:
            return dataclasses.replace(self.svd or SvdOptions(), rank=candidate["rank"])
        return self.svd

    def default_rank(self) -> int | None:
        """The rank a candidate without ``rank`` is re-factored to (None: not re-factored, or by energy)."""
        if self.svd is None or self.svd.energy is not None and self.svd.rank is None:
            return None
        return self.svd.rank or self.adapters.max_rank()

    def count_key(self, candidate: Mapping[str, Any], config: Any = None) -> tuple[Any, ...]:
        """The counts' key with the activity rule (each rule's agents count differently) and, for a re-factored
        merge, its SVD options (its counts are taken in ΔW space)."""
        svd = self.svd_of(candidate)
        tail = () if svd is None else (str(svd),)
        return (*super().count_key(candidate, config), str(self.rule_of(candidate)), *tail)

    def agents_for(self, candidate: Mapping[str, Any]) -> list[Any]:
        return self._agents(self.rule_of(candidate))

    def merge(self, candidate: Mapping[str, Any]) -> tuple[Any, Any, float]:
        self._rule = self.rule_of(candidate)
        svd = self.svd_of(candidate)
        if svd is None:
            return super().merge(candidate)
        return self._refactored(candidate, svd)

    def _refactored(self, candidate: Mapping[str, Any], svd: SvdOptions) -> tuple[Any, Any, float]:
        """``candidate`` merged in ΔW space and re-factored, as ``ram_merge_adapter_files(..., out=...)`` makes the
        adapter; handed out as the base with the new adapter's B'A' folded into the targeted weights."""
        from ..engine.run import run_merge
        from ..methods import get_method, make_config
        from ..peft.factors import Factor
        from ..peft.merging import merge_in_delta_space, prepare_merge
        from ..peft.refactoring import make_refactorer
        from ..peft.report import AdapterMergeReport

        t0 = time.perf_counter()
        options = self.options_of(candidate)
        prep = prepare_merge(self.adapters, candidate["method"], options, candidate.get("sparsify", "auto"))
        refactorer = make_refactorer(self.adapters, AdapterMergeReport(self.adapters.names, "adapter"), svd)
        with torch.no_grad():
            info = merge_in_delta_space(
                self.adapters, prep, refactorer, device=self.device, chunk_numel=DEFAULT_CHUNK_NUMEL
            )
            key = self.count_key(candidate)
            if info.statistics is not None and key not in self.statistics:
                # counted as Merger.merge counts its own, so that a worker's pass counts once in the search
                self.statistics[key] = info.statistics
                self.statistics_passes += 1
            folded = {
                m: Factor(out.A, out.B, 1.0, self.adapters.module(m).kind, self.adapters.module(m).transpose)
                for m, out in refactorer.factors.items()
            }
            one = BasePlusDeltaSource(self.base_src, AdapterDeltas("re-factored", folded, None, _REPORTED))
            run_merge(
                self.base_src,
                [one],
                get_method("task_arithmetic"),
                make_config("task_arithmetic"),
                self.target,
                device=self.device,
                workers=self.workers,
            )
        return self.target.finish(), info, time.perf_counter() - t0

    def _cached(self, method: Any) -> Any:
        """TIES' cached thresholds hold for the unsparsified ΔW only (a baseline's own default)."""
        return method if self._rule is not None else super()._cached(method)
