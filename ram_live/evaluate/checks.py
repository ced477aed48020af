"""The checks :mod:`ram_live.evaluate` runs on what users hand it: reward functions' returns, reward weights,
modules on the meta device. Each returns the checked value or raises a library error naming the culprit."""

from __future__ import annotations

import decimal
import math
import numbers
import reprlib
from collections.abc import Mapping, Set
from itertools import chain, islice
from typing import Any, Callable

from ..errors import ConfigError, EvaluationError

__all__ = ["finite_float", "reward_list", "weight_list", "meta_tensor", "short", "one_line"]

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlong, _REPR.maxlevel = 60, 60, 40, 3


def short(value: Any) -> str:
    """A one-line repr of ``value`` of at most about 80 characters (bounded depth: safe on deep nesting)."""
    text = _REPR.repr(value).replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs collapsed), cut at ``limit`` characters: an exception's message inside
    one of ours."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def finite_float(value: Any) -> float:
    """``value`` as a float if it is one finite real number: an int, a float, a numpy scalar, a ``Fraction``, a
    ``Decimal`` or a 0-d array/tensor. Raises ValueError with the reason otherwise (bools are not numbers)."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        try:
            value = value.item()  # a 0-d numpy array or torch tensor
        except Exception as exc:  # a meta tensor
            raise ValueError(f"not a number ({type(exc).__name__}: {one_line(exc, 100)})") from None
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise ValueError("not a number")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError("too large for a float") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # a signalling NaN, a broken __float__
        raise ValueError(f"not a number ({one_line(exc, 100)})") from None
    if not math.isfinite(number):
        try:  # NaN or ±inf itself, or a finite Decimal / long double beyond float's range
            infinite = bool(value != value) or abs(value) == math.inf
        except Exception:
            infinite = True
        raise ValueError("not finite" if infinite else "too large for a float")
    return number


def _not_a_sequence(value: Any) -> str | None:
    """Why ``value`` is not a flat, ordered sequence of values (None when it is one)."""
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} (a mapping, not one value per prompt in the prompts' order)"
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return f"a {type(value).__name__} {short(value)}"
    if isinstance(value, Set):
        return f"a {type(value).__name__} (unordered)"
    ndim = getattr(value, "ndim", None)
    if isinstance(ndim, int) and ndim != 1:
        return f"a {ndim}-D {type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}"
    if not hasattr(value, "__iter__"):
        return f"a {type(value).__name__} {short(value)}"
    return None


def _is_array(value: Any) -> bool:
    """A 1-D numpy array or tensor (or anything else with ``ndim == 1`` and ``tolist``)."""
    return getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None))


def reward_list(
    out: Any, name: str, n: int, where: Callable[[int], tuple[int, str]] | None = None, unit: str = "prompts"
) -> list[float | None]:
    """A reward function's return as one float (or None: not applicable) per row.

    Accepted: a list, tuple, 1-D numpy array or tensor, or any other iterable of numbers or None. Raises
    :class:`EvaluationError` naming the function (and the prompt, for a bad value).

    Args:
        out: what the function returned. name: the function's name. n: the rows it was called on.
        where: row ``j``'s prompt index and its name in messages (default ``(j, "prompt j")``).
        unit: what the rows are, in messages (``"prompts"``, or ``"completions"`` with k samples a prompt).
    """
    where = where or (lambda j: (j, f"prompt {j}"))
    why = _not_a_sequence(out)
    if why is not None:
        raise EvaluationError(
            f"reward function {name!r} returned {why}, not a sequence of rewards (one number per "
            f"{unit[:-1]}, {n} {unit})",
            function=name,
        )
    values: list[Any] = []
    try:
        if _is_array(out):
            values = list(out.tolist())  # plain numbers at once
        else:
            for v in islice(out, n + 1):  # a generator raises here; one endless stops after n + 1
                values.append(v)
    except Exception as exc:
        at = where(len(values)) if len(values) < n else None
        raise EvaluationError(
            f"reward function {name!r} returned an iterable that raised {type(exc).__name__} "
            f"while its rewards were read{f' at {at[1]}' if at else ''}: {one_line(exc)}",
            function=name,
            index=at[0] if at else None,
        ) from exc
    if len(values) != n:
        count = len(values) if len(values) < n or _is_array(out) else f"more than {n}"
        raise EvaluationError(
            f"reward function {name!r} returned {count} rewards for {n} {unit} (one per {unit[:-1]} is needed)",
            function=name,
        )
    checked: list[float | None] = []
    for j, v in enumerate(values):
        if v is None:
            checked.append(None)
            continue
        try:
            checked.append(finite_float(v))
        except ValueError as exc:
            index, label = where(j)
            raise EvaluationError(
                f"reward function {name!r} returned {short(v)} for {label}: {exc}; a reward "
                "must be a finite number (or None: not applicable)",
                function=name,
                index=index,
            ) from None
    return checked


def weight_list(reward_weights: Any, n: int) -> list[float]:
    """``reward_weights`` as ``n`` floats: a list, tuple or 1-D array of finite numbers, else :class:`ConfigError`
    naming ``reward_weights``."""
    expected = f"rewards: reward_weights must be {n} finite numbers (one per reward function)"
    why = _not_a_sequence(reward_weights)
    if why is None and not _is_array(reward_weights) and not hasattr(reward_weights, "__getitem__"):
        why = f"a {type(reward_weights).__name__} (an iterator: give a list)"
    if why is not None:
        raise ConfigError(f"{expected} in a list, got {why}")
    try:
        values = list(reward_weights.tolist() if _is_array(reward_weights) else reward_weights)
    except Exception as exc:
        raise ConfigError(f"{expected}; reading reward_weights raised {type(exc).__name__}: {one_line(exc)}") from exc
    if len(values) != n:
        raise ConfigError(f"{expected}, got {len(values)}: {short(reward_weights)}")
    out = []
    for i, w in enumerate(values):
        try:
            out.append(finite_float(w))
        except ValueError as exc:
            raise ConfigError(f"{expected}; reward_weights[{i}] is {short(w)}: {exc}") from None
    return out


def meta_tensor(module: Any) -> str | None:
    """The name of the first parameter or buffer of ``module`` on the meta device that no accelerate hook loads
    (an offloaded model's weights are on meta, put in place by its hooks): None when there is none."""
    hooked: list[str] = []
    for prefix, sub in module.named_modules():
        if getattr(sub, "_hf_hook", None) is not None:
            hooked.append(prefix)
        own = chain(sub.named_parameters(recurse=False), sub.named_buffers(recurse=False))
        for name, tensor in own:
            if getattr(tensor, "is_meta", False) and not any(
                h == "" or prefix == h or prefix.startswith(h + ".") for h in hooked
            ):
                return f"{prefix}.{name}" if prefix else name
    return None
