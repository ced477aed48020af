"""Merge methods: one small config dataclass each, and a registry keyed by name.

A method is a stateless ``combine(deltas[K, C], ctx, config) -> τ*[C]`` plus optional hooks the engine calls:
``setup`` once per merge (e.g. RAM+'s global λ from the statistics pass), ``prepare`` once per tensor (TIES
thresholds, DARE generators, tensor-local λ), ``record`` (what it reports), and what it declares about itself:
``kernels`` (its fast paths, :class:`MethodKernels`) and ``overflow_bound``. One module per family:
:mod:`.linear`, :mod:`.task_arithmetic`, :mod:`.ties`, :mod:`.dare`; RAM is a room of its own, :mod:`.ram` (its
config, λ, reference rule and fast paths); :mod:`.base` and :mod:`.registry` hold the machinery and
:mod:`ram_live.option_checks` the option checks. The names below load on first use (the built-in families
register when the registry is first asked), so ``ram_live.methods.ram.config`` imports no torch. Register your own:

>>> @register_method("median", MedianConfig)                     # doctest: +SKIP
... def median(deltas, ctx, config):
...     return deltas.median(dim=0).values
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {  # public name -> the module it comes from, imported on first use
    "Activity": "ram_live.types",
    "RamStatistics": "ram_live.types",
    **{
        n: "ram_live.methods.base"
        for n in (
            "RunContext",
            "TensorContext",
            "TensorView",
            "Combine",
            "MergeMethod",
            "MethodKernels",
            "agent_densities",
        )
    },
    **{
        n: "ram_live.methods.registry"
        for n in ("register_method", "get_method", "available_methods", "make_config", "method_of_config", "_REGISTRY")
    },
    "LinearConfig": "ram_live.methods.linear",
    "TaskArithmeticConfig": "ram_live.methods.task_arithmetic",
    "TiesConfig": "ram_live.methods.ties",
    "ties_elect": "ram_live.methods.ties",
    "ties_prepare": "ram_live.methods.ties",
    "DareLinearConfig": "ram_live.methods.dare",
    "DareTiesConfig": "ram_live.methods.dare",
    "dare_generator": "ram_live.methods.dare",
    "RamConfig": "ram_live.methods.ram.config",
    "RAM_METHODS": "ram_live.methods.ram.rules",
}

__all__ = [n for n in _EXPORTS if not n.startswith("_")]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ram_live.methods' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
