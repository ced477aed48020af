"""The value checks of the ``ram.*`` keys of a verl run: each raises a ``ConfigError`` naming the key."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ram_live.errors import ConfigError

__all__ = ["check_choice", "check_int", "check_number"]


def check_choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"ram.{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"ram.{name} must be an integer >= {minimum} (or null where optional); got {value!r}")


def check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"ram.{name} must be a finite number >= 0; got {value!r}")
