"""One reused output for every candidate of a search, and the merger that writes each candidate into it.

A module base gets one scratch module of its structure (allocated once, as a plain merge would); a state-dict or
path base one dict of output tensors. Each candidate's merge overwrites every entry of it, reading the inputs
where they are (the base is never written). RAM-family counts are taken once per activity rule and reused through
``statistics=``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from ..api import Model, Models, input_sources
from ..engine import MergeInfo, run_merge
from ..errors import ConfigError
from .. import functional as F
from ..methods import RamStatistics, agent_densities, get_method, make_config, ties_prepare
from ..io.sinks import ModuleSink
from ..io.sources import TensorSpec

__all__ = ["ModuleTarget", "DictTarget", "Merger"]


class ModuleTarget:
    """A :class:`~ram_live.io.sinks.ModuleSink` whose structural copy of the base is made once and written again by
    every merge (buffers are copied from the base each time, so an evaluation that changes them changes
    nothing for the next candidate)."""

    revisable = True

    def __init__(self, base: nn.Module) -> None:
        self._sink = ModuleSink(base, inplace=False)
        self._begun = False

    def begin(self, plan: Any, specs: Mapping[str, TensorSpec]) -> None:
        if not self._begun:
            self._sink.begin(plan, specs)
            self._begun = True

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        return self._sink.destination(key, spec)

    def commit(self, key: str) -> None:
        pass

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        self._sink.copy_from_base(key, tensor)

    def alias(self, alias: str, canonical: str) -> None:
        pass

    def finish(self) -> nn.Module:
        return self._sink.finish()

    def abort(self) -> None:
        pass  # the scratch module stays: the next candidate overwrites it


class DictTarget:
    """One dict of output tensors (the base's keys, shapes, dtypes; on ``device`` or the base's), allocated at
    the first merge and overwritten by each; :meth:`finish` returns the same dict object every time."""

    revisable = True

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.out: dict[str, Tensor] = {}
        self._result: dict[str, Tensor] | None = None
        self.order: tuple[str, ...] = ()

    def begin(self, plan: Any, specs: Mapping[str, TensorSpec]) -> None:
        self.order = plan.keys

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        if key not in self.out:
            self.out[key] = torch.empty(spec.shape, dtype=spec.dtype, device=self.device or spec.device)
        return self.out[key]

    def commit(self, key: str) -> None:
        pass

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        if key in self.out:
            self.out[key].copy_(tensor)
        else:
            self.out[key] = tensor.to(device=self.device or tensor.device, copy=True)

    def alias(self, alias: str, canonical: str) -> None:
        self.out[alias] = self.out[canonical]

    def finish(self) -> dict[str, Tensor]:
        if self._result is None:
            self._result = {k: self.out[k] for k in self.order}
        return self._result

    def abort(self) -> None:
        pass


class Merger:
    """Sources opened once, one reused target, and the RAM counts per (activity rule, excluded agents).

    ``merge(candidate)`` → ``(merged, info, seconds)``; ``merged`` is the same object every call."""

    def __init__(self, models: Models, base: Model | None, *, device: str | torch.device | None = None,
                 workers: int | None = None) -> None:
        self.agents, self.base_src = input_sources(models, base)
        self.names = tuple(a.name for a in self.agents)
        try:
            self.device = torch.device(device) if device is not None else None
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"device={device!r}: {exc}") from None
        self.workers = workers
        self.target: Any = ModuleTarget(base) if isinstance(base, nn.Module) else DictTarget(self.device)
        self.statistics: dict[Any, RamStatistics] = {}
        self.statistics_passes = 0
        #: TIES' trim thresholds, (agent, tensor, density) -> threshold: one float per agent and tensor for each
        #: density tried (they depend on nothing else: not on scale, weights or the sign election).
        self.thresholds: dict[tuple[str, str, float], float | None] = {}
        self._ties: Any = None

    def counts(self, activity: Any, exclude: tuple[str, ...] = ()) -> RamStatistics | None:
        """The counts taken so far for this activity rule and these excluded agents, if any."""
        return self.statistics.get((activity, exclude))

    def merge(self, candidate: Mapping[str, Any]) -> tuple[Any, MergeInfo, float]:
        options = {k: v for k, v in candidate.items() if k not in ("method", "importance")}
        importance = candidate.get("importance")
        aux = None
        if importance is not None and importance is not False:
            from ..importance import importance_sources

            aux = {"importance": importance_sources(importance, list(self.names))}
        method = self._cached(get_method(candidate["method"]))
        config = make_config(candidate["method"], **options)
        key = (method.activity(config), tuple(getattr(config, "exclude", ())))
        reuse = self.statistics.get(key) if method.needs_statistics(config) else None
        t0 = time.perf_counter()
        info = run_merge(self.base_src, self.agents, method, config, self.target, device=self.device,
                         workers=self.workers, statistics=reuse, auxiliary=aux)
        merged = self.target.finish()
        seconds = time.perf_counter() - t0
        if reuse is None and method.needs_statistics(config) and info.statistics is not None:
            self.statistics[key] = info.statistics
            self.statistics_passes += 1
        return merged, info, seconds

    def _cached(self, method: Any) -> Any:
        """TIES with its thresholds taken from :attr:`thresholds` (computed as TIES' own ``prepare`` computes
        them, once per agent, tensor and density); other methods as they are."""
        if method.prepare is not ties_prepare:
            return method
        if self._ties is None:
            cache = self.thresholds

            def prepare(config: Any, view: Any, weights: Any) -> list[float | None]:
                densities = agent_densities(config, view.agents)
                out = []
                for t, agent in enumerate(view.agents):
                    key = (agent, view.key, densities[t])
                    if key not in cache:
                        cache[key] = F.magnitude_threshold(view.delta(t), densities[t])
                    out.append(cache[key])
                return out

            self._ties = dataclasses.replace(method, prepare=prepare)
        return self._ties
