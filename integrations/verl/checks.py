"""The value checks of the ``ram.*`` keys of a verl run: each raises a ``ConfigError`` naming the key."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ram_live.errors import ConfigError

__all__ = ["check_choice", "check_device", "check_int", "check_number", "integer_value", "preflight"]


def check_choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"ram.{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"ram.{name} must be an integer >= {minimum} (or null where optional); got {value!r}")


def check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"ram.{name} must be a finite number >= 0; got {value!r}")


def integer_value(name: str, value: Any, minimum: int) -> int:
    """``value`` as an ``int`` >= ``minimum``: an integer, or its decimal digits as a string (a command line's
    ``"4"``); a float (``2.7``, and ``2.0`` too: no silent truncation), a bool or other text is refused.

    Args:
        name: the key after ``ram.`` (``"rewards.batch_size"``), named in the error.
        value: the value given.
        minimum: the smallest value allowed.

    Returns:
        The integer.

    Raises:
        ConfigError: naming ``ram.<name>`` and the value.
    """
    number = value
    text = value.strip() if isinstance(value, str) else ""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if digits.isascii() and digits.isdigit() and len(digits) <= 18:  # ASCII digits, one sign, no huge text
        number = int(text)
    if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
        raise ConfigError(f"ram.{name} must be an integer >= {minimum}; got {value!r}")
    return number


def check_device(name: str, value: Any) -> str:
    """``value`` if it names a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ...); whether the
    device exists is known only where the evaluation runs (a Ray actor on a GPU node), not at start-up.

    Args:
        name: the key after ``ram.`` (``"rewards.device"``), named in the error.
        value: the value given.

    Returns:
        The device string, as given.

    Raises:
        ConfigError: naming ``ram.<name>``: not a string, or no device torch knows.
    """
    import torch

    if not isinstance(value, str):
        raise ConfigError(f"ram.{name} must be a device name such as 'cpu' or 'cuda:0'; got {value!r}")
    try:
        torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"ram.{name}={value!r} is not a device ('cpu', 'cuda', 'cuda:0', ...): {exc}") from None
    return value


def preflight(opts: Any) -> None:
    """Before training, what the merges' options allow checking (:mod:`ram_live.training.preflight`): ``ram.search``
    as :func:`ram_live.search` checks it (with the plain evaluation verl's search hands it), ``merged_dir`` written
    to.

    Raises:
        ConfigError: naming the agent and "pre-flight".
    """
    from pathlib import Path

    from ram_live.training.preflight import check_merged_dir_writable, check_search

    try:
        if opts.search is not None:
            check_search(opts.search, None, plain=True)
        if opts.merge_every is not None and opts.merged_dir:
            check_merged_dir_writable(Path(opts.merged_dir), opts.agent)
    except ConfigError as exc:
        raise ConfigError(f"ram ({opts.agent!r}): pre-flight (before training): {exc}") from exc
