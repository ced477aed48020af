"""The value checks of options, torch-free (``ram-live --help`` and :mod:`ram_live.options` import no torch):
each raises :class:`~ram_live.errors.ConfigError` naming the option."""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping
from typing import Any, Sequence

from .errors import ConfigError

__all__ = ["FLOAT32_MAX", "Lambdas", "check_choice", "check_finite", "check_lambdas", "check_names", "check_range"]

#: Options are applied to float32 task vectors: a value beyond float32's range is as useless as ±Inf.
FLOAT32_MAX = 3.4028234663852886e38


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """:class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def check_finite(name: str, value: Any) -> None:
    """:class:`ConfigError` unless ``value`` is a real number within float32's range."""
    if not (isinstance(value, numbers.Real) and abs(value) <= FLOAT32_MAX):
        raise ConfigError(f"{name} must be a finite number (|x| <= {FLOAT32_MAX:.4g}), got {value!r}")


def check_range(name: str, value: float, low: float, high: float = math.inf) -> None:
    """:class:`ConfigError` unless ``low <= value <= high`` (and finite)."""
    check_finite(name, value)
    if not low <= value <= high:
        bounds = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be {bounds}, got {value!r}")


def check_names(option: str, names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of agent names; :class:`ConfigError` for a string or non-string entries."""
    if isinstance(names, str) or not isinstance(names, Collection) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{option} must be a sequence of agent names, got {names!r}")
    return tuple(names)


class Lambdas(dict):
    """``{agent: λ}`` held by a frozen config: a dict (JSON, ``==``, ``isinstance(x, dict)`` as before) that hashes
    by its items, so configs and :class:`~ram_live.RamOptions` holding one hash (search caches, sets). Do not edit
    it in place: the config's hash would change."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


def check_lambdas(lambdas: Any) -> Lambdas:
    """``lambdas`` as a fresh ``{agent: float}`` (so that later edits of the caller's mapping change nothing)."""
    if not isinstance(lambdas, Mapping):
        raise ConfigError(f"lambdas must be a mapping {{agent name: λ}}, got {type(lambdas).__name__}")
    out = Lambdas()
    for name, value in lambdas.items():
        if not isinstance(name, str):
            raise ConfigError(f"lambdas: agent names must be strings, got {name!r}")
        check_finite(f"lambdas[{name!r}]", value)
        out[name] = float(value)
    return out
