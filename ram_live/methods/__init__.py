"""Merge methods: one small config dataclass each, and a registry keyed by name.

A method is a stateless ``combine(deltas[K, C], ctx, config) -> τ*[C]`` plus optional hooks the engine calls:
``setup`` once per merge (e.g. RAM+'s global λ from the statistics pass), ``prepare`` once per tensor (TIES
thresholds, DARE generators, tensor-local λ), and what it declares about itself: ``kernels`` (the engine's fast
kernels it may run, :class:`MethodKernels`) and ``overflow_bound``. One module per family: :mod:`.linear`,
:mod:`.task_arithmetic`, :mod:`.ties`, :mod:`.dare`, :mod:`.ram`; :mod:`.base` and :mod:`.registry` hold the
machinery, :mod:`ram_live.option_checks` the option checks and :mod:`ram_live.ram_config` RAM's one config.
Register your own:

>>> @register_method("median", MedianConfig)                     # doctest: +SKIP
... def median(deltas, ctx, config):
...     return deltas.median(dim=0).values
"""

from __future__ import annotations

from ..types import Activity, RamStatistics
from .base import Combine, MergeMethod, MethodKernels, RunContext, TensorContext, TensorView
from .registry import _REGISTRY  # noqa: F401 - tests add and drop throwaway methods in it
from .registry import available_methods, get_method, make_config, method_of_config, register_method
from .linear import LinearConfig
from .task_arithmetic import TaskArithmeticConfig
from .ties import TiesConfig, ties_elect, ties_prepare
from .dare import DareLinearConfig, DareTiesConfig, dare_generator
from .ram import (RAM_METHODS, RamConfig, check_importance, configure_ram, given_lambdas, lambda_bound,
                  lambdas_from_counts, ram_activity, ram_kernels, ram_overflow_bound)
from .base import agent_densities

__all__ = [
    "Activity",
    "RamStatistics",
    "RunContext",
    "TensorContext",
    "TensorView",
    "Combine",
    "MergeMethod",
    "MethodKernels",
    "register_method",
    "get_method",
    "available_methods",
    "make_config",
    "LinearConfig",
    "TaskArithmeticConfig",
    "TiesConfig",
    "DareLinearConfig",
    "DareTiesConfig",
    "RamConfig",
    "RAM_METHODS",
    "configure_ram",
    "method_of_config",
    "check_importance",
    "dare_generator",
    "given_lambdas",
    "lambda_bound",
    "lambdas_from_counts",
    "ram_activity",
    "ram_kernels",
    "ram_overflow_bound",
    "agent_densities",
    "ties_elect",
    "ties_prepare",
]
