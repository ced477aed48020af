"""RAM in one room: Reinforced Agent Merging (paper Eq. 7; ``shared/ram-spec.md``) and everything that computes it.

- :mod:`.config`: :class:`RamConfig`, the method, with its λ rule as a value; :mod:`.rules`: the λ rules
  (``Unit``, ``RhoClip``, ``RhoSoft``, ``Given``); both torch-free.
- :mod:`.lambdas`: ρ from the counts and λ from the rule.
- :mod:`.reference`: the rule as the spec reads, on a ``[K, C]`` chunk (:func:`~.reference.ram_combine`); every
  path below is within float32 rounding of it, and the fast paths give the accumulator's bits
  (``tests/test_ram_paths.py``).
- the fast paths, declared to the engine by :func:`.method.ram_kernels`: :mod:`.accumulators` (eager, one agent at
  a time), :mod:`.compiled` (``torch.compile``), :mod:`.native` and :mod:`.native_weighted` (C kernels of
  ``csrc/ram.c`` and ``csrc/ram_weighted.c``), :mod:`.single_read` (RAM+ with global ρ in one read), :mod:`.fast`
  (which runs a tensor, and their runners).
- :mod:`.method`: the registration of ``ram``, ``ram_plus`` and ``ram_plus_soft`` with the engine's hooks.

Adding a λ rule is a class in :mod:`.rules` (and, for a short name of its own, an entry of its ``RULES``). The
names below load on first use.

>>> from ram_live.methods.ram import RamConfig, RhoClip
>>> RamConfig(lam=RhoClip(r=0.2, alpha=1.0)).method
'ram_plus'
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "RamConfig": ".config",
    **{n: ".rules" for n in ("Unit", "RhoClip", "RhoSoft", "Given", "RAM_METHODS", "RULES")},
    **{n: ".lambdas" for n in ("rho", "ram_lambda", "given_lambdas", "lambda_bound", "lambdas_from_counts")},
    **{n: ".reference" for n in ("ram_combine", "elect", "importance_weights", "overlap_counts")},
    "RamAccumulator": ".accumulators",
    "WeightedRamAccumulator": ".accumulators",
    "ram_kernels": ".method",
    "ram_fused_": ".compiled",
    "ram_fused_weighted_": ".compiled",
    **{n: ".method" for n in ("ram_activity", "check_importance", "configure_ram", "ram_overflow_bound")},
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ram_live.methods.ram' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
