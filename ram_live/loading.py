"""Callables named by a dotted path in a config (``"pkg.module:fn"`` or ``"pkg.module.fn"``), torch-free."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .errors import ConfigError

__all__ = ["load_callable"]


def load_callable(value: Any, option: str) -> Callable[..., Any]:
    """``value`` itself when callable, else the function its path names.

    Args:
        value: a callable, or ``"pkg.module:fn"`` / ``"pkg.module.fn"``.
        option: how errors name the option (``"ram.evaluate"``).

    >>> load_callable("math:sqrt", "evaluate")(4.0)
    2.0
    """
    if callable(value):
        return value
    module, _, name = value.partition(":") if ":" in value else value.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{option}={value!r}: cannot load it ({exc})") from None
    if not callable(fn):
        raise ConfigError(f"{option}={value!r} is not callable")
    return fn
