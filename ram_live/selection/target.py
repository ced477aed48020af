"""One reused output for every candidate of a search, and the merger that writes each candidate into it.

A module base gets one scratch module of its structure (allocated once, as a plain merge would); a state-dict or
path base one set of output tensors, handed out in a new dict per candidate. Each candidate's merge overwrites
every entry, reading the inputs where they are (the base is never written). Whatever the evaluation does to what
it was handed (rebinding a dict's entries, deleting keys, replacing or converting a module's parameters), the next
candidate is evaluated on its own merge: a dict is never handed out twice, and a scratch module whose tensors are
no longer the ones the merge writes is rebuilt. RAM-family counts are taken once per activity rule and reused
through ``statistics=``.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from itertools import chain, repeat
from typing import Any, Mapping

import torch
from torch import Tensor, nn

from ..api import Model, Models, input_sources
from ..engine.plan import PlanCache
from ..engine.reader import on_current
from ..engine.run import run_merge
from ..types import DEVICE_OF, DTYPE_OF, SHAPE_OF, MergeInfo
from ..errors import ConfigError
from ..importance import resolve_importance
from .. import functional as F
from ..methods import RamStatistics, agent_densities, get_method, make_config, ties_prepare
from ..io.sinks import ModuleSink
from ..io.structure import state_tensors
from ..io.sources import TensorSpec

__all__ = ["ModuleTarget", "DictTarget", "Merger"]


class ModuleTarget:
    """A :class:`~ram_live.io.sinks.ModuleSink` whose structural copy of the base is made once and written again by
    every merge (buffers are copied from the base each time, so an evaluation that changes them changes
    nothing for the next candidate).

    Before each merge the scratch module is checked: if the evaluation replaced, removed, moved or converted any
    of its tensors (``module.weight = nn.Parameter(...)``, ``module.half()``, ``module.to("cuda")``), or added or
    removed a hook or a submodule, a new scratch copy is made, so no candidate is scored on tensors the merge did
    not write. Otherwise training flags are reset to the base's, non-persistent buffers are copied from the base
    and gradients are cleared: nothing an evaluation leaves behind reaches the next candidate."""

    revisable = True
    holds_outputs = True

    def __init__(self, base: nn.Module) -> None:
        self._base = base
        self._sink = ModuleSink(base, inplace=False)
        self._scratch: _Scratch | None = None

    def begin(self, plan: Any, specs: Mapping[str, TensorSpec]) -> None:
        scratch = self._scratch
        if scratch is None or self._sink.module is None or not scratch.intact() or not scratch.reset():
            self._sink.begin(plan, specs)
            self._scratch = _Scratch(self._sink.module, self._base)
            self._scratch.reset()

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        return self._sink.destination(key, spec)

    def commit(self, key: str) -> None:
        pass

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        self._sink.copy_from_base(key, tensor)

    def alias(self, alias: str, canonical: str) -> None:
        self._sink.alias(alias, canonical)

    def finish(self) -> nn.Module:
        return self._sink.finish()

    def abort(self) -> None:
        pass  # the scratch module stays: the next candidate overwrites it


_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


def _structure(module: nn.Module) -> tuple[Any, ...]:
    """What of one module must not change between merges: its class, its submodules (the objects), how many
    parameters and buffers it holds, which buffers are non-persistent, and how many hooks of each kind it has."""
    own = module.__dict__
    hooks = tuple(map(len, map(own.get, _HOOKS, repeat(()))))
    return (type(module), *module._modules.values(), len(module._parameters), len(module._buffers), hooks,
            len(module._non_persistent_buffers_set))  # fmt: skip


_HELD = operator.attrgetter("_parameters", "_buffers", "_modules")


class _Scratch:
    """A scratch module as a merge left it: each module's :func:`_structure` and the dicts that hold its
    parameters, buffers and submodules (the objects), and each parameter's and buffer's object, address, storage
    size, dtype, device, shape and strides (``.data =``, ``.half()``, ``.to()`` and a freed storage change one of
    them), taken once, so that :meth:`intact` and :meth:`reset` walk flat lists rather than the module tree."""

    def __init__(self, module: nn.Module, base: nn.Module) -> None:
        self.base = base
        self.pairs = list(zip(module.modules(), base.modules()))
        self.modules = [m for m, _ in self.pairs]
        self.structures = list(map(_structure, self.modules))
        self.dicts = list(chain.from_iterable(map(_HELD, self.modules)))
        held = [
            (d, name)
            for m in self.modules
            for d in (m._parameters, m._buffers)
            for name, t in d.items()
            if t is not None
        ]
        self.holders, self.names = [d for d, _ in held], [name for _, name in held]
        self.tensors = list(map(dict.get, self.holders, self.names))
        self.layout = _layouts(self.tensors)
        self.parameters = list(module.parameters())
        base_buffers = dict(base.named_buffers())
        persistent = set(state_tensors(module)[0])
        self.buffers = [  # the persistent ones are copied by the merge
            (buf, name) for name, buf in module.named_buffers() if name in base_buffers and name not in persistent
        ]

    def intact(self) -> bool:
        """Whether every module, parameter and buffer is as the merge left it."""
        return (
            list(map(_structure, self.modules)) == self.structures
            and all(map(operator.is_, chain.from_iterable(map(_HELD, self.modules)), self.dicts))
            and all(map(operator.is_, map(dict.get, self.holders, self.names), self.tensors))
            and _layouts(self.tensors) == self.layout
        )

    def reset(self) -> bool:
        """Training flags as the base's now, non-persistent buffers copied from the base's now, no gradients; False
        where a base's buffer is no longer of its scratch twin's shape, dtype or device (a new scratch is made)."""
        for m, b in self.pairs:
            if m.training != b.training:
                m.training = b.training
        with torch.no_grad():
            for buf, name in self.buffers:
                try:
                    source = self.base.get_buffer(name)
                except AttributeError:  # the base dropped it since: the scratch keeps what it has
                    continue
                if source.shape != buf.shape or source.dtype != buf.dtype or source.device != buf.device:
                    return False
                buf.copy_(source)
        for p in self.parameters:
            if p.grad is not None:
                p.grad = None
        return True


def _layouts(tensors: list[Tensor]) -> list[list[Any]]:
    """Each tensor's address, storage size, dtype, device, shape and strides (a property at a time over them all)."""
    return [
        list(map(Tensor.data_ptr, tensors)),
        list(map(_storage_bytes, tensors)),
        list(map(DTYPE_OF, tensors)),
        list(map(DEVICE_OF, tensors)),
        list(map(SHAPE_OF, tensors)),
        list(map(Tensor.stride, tensors)),
    ]


def _storage_bytes(t: Tensor) -> int:
    return t.untyped_storage().nbytes()


class DictTarget:
    """One set of output tensors (the base's keys, shapes, dtypes; on ``device`` or the base's), allocated at
    the first merge and overwritten by each; :meth:`finish` returns a new dict of them every time, so an
    evaluation that rebinds or deletes entries of the dict it was handed changes nothing for the next candidate."""

    revisable = True
    holds_outputs = True

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.here = device  # ``device`` as this merge resolves it (``cuda``: the current one)
        self.out: dict[str, Tensor] = {}
        self.order: tuple[str, ...] = ()

    def begin(self, plan: Any, specs: Mapping[str, TensorSpec]) -> None:
        self.order = plan.keys
        self.here = on_current(self.device) if self.device is not None else None

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        device = self.here or spec.device
        if not _fits(self.out.get(key), spec.shape, spec.dtype, device):
            self.out[key] = torch.empty(spec.shape, dtype=spec.dtype, device=device)
        return self.out[key]

    def commit(self, key: str) -> None:
        pass

    def copy_from_base(self, key: str, tensor: Tensor) -> None:
        device = self.here or tensor.device
        if _fits(self.out.get(key), tuple(tensor.shape), tensor.dtype, device):
            self.out[key].copy_(tensor)
        else:
            self.out[key] = tensor.to(device=device, copy=True)

    def alias(self, alias: str, canonical: str) -> None:
        self.out[alias] = self.out[canonical]

    def finish(self) -> dict[str, Tensor]:
        return {k: self.out[k] for k in self.order}

    def abort(self) -> None:
        pass


def _fits(t: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> bool:
    """``t`` can be written as the output of this shape, dtype and device (an evaluation may have set ``.data``)."""
    if t is None or tuple(t.shape) != tuple(shape) or t.dtype != dtype or not t.is_contiguous() or t.requires_grad:
        return False
    if _storage_bytes(t) < (t.storage_offset() + t.numel()) * t.element_size():  # an evaluation freed or shrank it
        return False
    want = torch.device(device)
    return t.device.type == want.type and (want.index is None or t.device.index == want.index)


class Merger:
    """Sources opened once, one reused target, and the RAM counts per (activity rule, excluded agents).

    ``merge(candidate)`` → ``(merged, info, seconds)``; ``merged`` holds the same reused tensors every call (a
    module base: the same scratch module while the evaluation leaves its tensors in place)."""

    #: Whether DARE candidates carry the search's seed (an adapter search's entry points take ``seed=`` as the SVD's).
    dare_seed = True

    def __init__(
        self,
        models: Models,
        base: Model | None,
        *,
        device: str | torch.device | None = None,
        workers: int | None = None,
    ) -> None:
        self.agents, self.base_src = self._sources(models, base)
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
        self.plans = PlanCache()

    def _sources(self, models: Any, base: Any) -> tuple[list[Any], Any]:
        """The agents' and the base's sources (an adapter search: :mod:`ram_live.selection.adapters`)."""
        return input_sources(models, base)

    def options_of(self, candidate: Mapping[str, Any]) -> dict[str, Any]:
        """``candidate``'s options as its method's config is made of them (not its importances)."""
        return {k: v for k, v in candidate.items() if k not in ("method", "importance")}

    def count_key(self, candidate: Mapping[str, Any], config: Any = None) -> tuple[Any, ...]:
        """The key of the RAM counts ``candidate``'s merge takes: its activity rule and its excluded agents."""
        config = config if config is not None else make_config(candidate["method"], **self.options_of(candidate))
        return get_method(candidate["method"]).activity(config), tuple(getattr(config, "exclude", ()))

    def counts_of(self, candidate: Mapping[str, Any]) -> RamStatistics | None:
        """The counts taken so far that ``candidate``'s merge would take, if any."""
        return self.statistics.get(self.count_key(candidate))

    def agents_for(self, candidate: Mapping[str, Any]) -> list[Any]:
        """The agents' sources ``candidate`` is merged from."""
        return self.agents

    def counts(self, activity: Any, exclude: tuple[str, ...] = ()) -> RamStatistics | None:
        """The counts taken so far for this activity rule and these excluded agents, if any."""
        return self.statistics.get((activity, exclude))

    def merge(self, candidate: Mapping[str, Any]) -> tuple[Any, MergeInfo, float]:
        options = self.options_of(candidate)
        weights, _ = resolve_importance(candidate.get("importance"), self.agents, tuple(options.get("exclude", ())))
        aux = None if weights is None else {"importance": weights}
        method = self._cached(get_method(candidate["method"]))
        config = make_config(candidate["method"], **options)
        key = self.count_key(candidate, config)
        reuse = self.statistics.get(key) if method.needs_statistics(config) else None
        t0 = time.perf_counter()
        info = run_merge(
            self.base_src,
            self.agents_for(candidate),
            method,
            config,
            self.target,
            device=self.device,
            workers=self.workers,
            statistics=reuse,
            auxiliary=aux,
            plans=self.plans,
        )
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
