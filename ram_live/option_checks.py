"""The value checks of every method's options, in one module and torch-free (``ram-live --help`` and
:mod:`ram_live.methods.ram.config` import no torch): each raises
:class:`~ram_live.errors.ConfigError` naming the option. :func:`finite_float` is the one rule for a number the
library is handed (a reward, a weight, an evaluation's score): it raises ValueError with the reason, and each caller
names the culprit in its own error."""

from __future__ import annotations

import decimal
import json
import math
import numbers
import reprlib
import sys
from collections.abc import Collection, Mapping
from typing import Any, Sequence

from .errors import ConfigError

__all__ = [
    "FLOAT32_MAX",
    "Lambdas",
    "check_choice",
    "check_densities",
    "check_finite",
    "check_lambdas",
    "check_names",
    "check_range",
    "check_seed",
    "check_weights",
    "finite_float",
    "parse_json",
    "shown",
]

#: Options are applied to float32 task vectors: a value beyond float32's range is as useless as ±Inf.
FLOAT32_MAX = 3.4028234663852886e38


def finite_float(value: Any, one_element: bool = False) -> float:
    """``value`` as a float if it is one finite real number: an int, a float, a numpy scalar, a ``Fraction``, a
    ``Decimal`` or a 0-d array or tensor (with ``one_element``, an array or tensor of any shape holding exactly one
    value too). Raises ValueError with the reason otherwise (bools are not numbers)."""
    ndim = getattr(value, "ndim", None)
    if isinstance(ndim, int) and callable(getattr(value, "item", None)) and (ndim == 0 or one_element):
        try:
            if ndim == 0 or math.prod(value.shape) == 1:
                value = value.item()  # a numpy array or scalar, or a torch tensor
        except Exception as exc:  # a meta tensor
            raise ValueError(f"not a number ({type(exc).__name__}: {_brief(exc)})") from None
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise ValueError("not a number")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError("too large for a float") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # a signalling NaN, a broken __float__
        raise ValueError(f"not a number ({_brief(exc)})") from None
    if not math.isfinite(number):
        try:  # NaN or ±inf itself, or a finite Decimal / long double beyond float's range
            infinite = bool(value != value) or abs(value) == math.inf
        except Exception:
            infinite = True
        raise ValueError("not finite" if infinite else "too large for a float")
    return number


class _Short(reprlib.Repr):
    """reprlib's bounded repr, safe on ints beyond ``int``'s string limit (their repr raises ValueError)."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"{'-' if x < 0 else ''}<an int of about {round(x.bit_length() * math.log10(2))} digits>"
        return super().repr_int(x, level)


_SHORT = _Short()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong, _SHORT.maxlevel = 60, 60, 40, 3


def shown(value: Any) -> str:
    """A one-line repr of ``value`` of at most about 80 characters, for an error message: safe on deep nesting,
    huge ints and objects whose ``repr`` raises."""
    try:
        text = _SHORT.repr(value).replace("\n", " ")
    except Exception:
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def parse_json(option: str, text: str, plain_text: bool = False) -> Any:
    """``text``, the JSON an option was given as (``--space``, ``--lambdas``, ``-O KEY=VALUE``), parsed.

    Args:
        option: the option, for the error.
        text: its value.
        plain_text: ``text`` itself where it is not JSON (``-O method=ties``).

    Raises:
        ConfigError: naming ``option``: not JSON (unless ``plain_text``), nested too deeply for Python's parser, or
            an int of more digits than Python converts.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if plain_text:
            return text
        raise ConfigError(f"{option} is not JSON: {_brief(exc)}; got {shown(text)}") from None
    except RecursionError:
        raise ConfigError(f"{option}: its JSON is nested too deeply to read") from None
    except ValueError:  # an int of more digits than Python converts
        raise ConfigError(f"{option}: holds an integer of more than {sys.get_int_max_str_digits()} digits") from None


def _repr(value: Any) -> str:
    """``repr(value)``, or :func:`shown` where that raises (an int beyond Python's string conversion limit)."""
    try:
        return repr(value)
    except Exception:
        return shown(value)


def _brief(exc: BaseException) -> str:
    """An exception's message on one line, cut short."""
    flat = " ".join(str(exc).split())
    return flat if len(flat) <= 100 else flat[:97] + "..."


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    """:class:`ConfigError` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {_repr(value)}")


def check_finite(name: str, value: Any) -> None:
    """:class:`ConfigError` unless ``value`` is a real number within float32's range."""
    if not (isinstance(value, numbers.Real) and abs(value) <= FLOAT32_MAX):
        raise ConfigError(f"{name} must be a finite number (|x| <= {FLOAT32_MAX:.4g}), got {_repr(value)}")


def check_range(name: str, value: float, low: float, high: float = math.inf) -> None:
    """:class:`ConfigError` unless ``low <= value <= high`` (and finite)."""
    check_finite(name, value)
    if not low <= value <= high:
        bounds = f">= {low}" if high == math.inf else f"in [{low}, {high}]"
        raise ConfigError(f"{name} must be {bounds}, got {_repr(value)}")


def check_seed(name: str, value: Any) -> int:
    """``value`` as a seed: an int (not a bool) from -2**63 to 2**64 - 1 (what a generator takes); else
    :class:`ConfigError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not -(2**63) <= value < 2**64:
        raise ConfigError(f"{name} must be an int from -2**63 to 2**64 - 1, got {shown(value)}")
    return int(value)


def check_names(option: str, names: Any) -> tuple[str, ...]:
    """``names`` as a tuple of agent names; :class:`ConfigError` for a string or non-string entries."""
    if isinstance(names, str) or not isinstance(names, Collection) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{option} must be a sequence of agent names, got {_repr(names)}")
    return tuple(names)


class Lambdas(dict):
    """``{agent: λ}`` held by a frozen config: a dict (JSON, ``==``, ``isinstance(x, dict)`` as before) that hashes
    by its items, so configs holding one hash (:class:`~ram_live.Given`) (search caches, sets). Do not edit
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
            raise ConfigError(f"lambdas: agent names must be strings, got {_repr(name)}")
        check_finite(f"lambdas[{name!r}]", value)
        out[name] = float(value)
    return out


def check_weights(weights: Sequence[float] | None) -> None:
    """``weights``: None, or finite numbers, one per agent (a tensor's ``tolist()``)."""
    if weights is None:
        return
    if isinstance(weights, (Mapping, str, bytes)) or not isinstance(weights, Collection):
        raise ConfigError(
            f"weights must be a sequence of numbers, one per agent in the agents' order, got {type(weights).__name__}"
        )
    for i, w in enumerate(weights.tolist() if callable(getattr(weights, "tolist", None)) else weights):
        check_finite(f"weights[{i}]", w)


def check_densities(densities: Sequence[float] | None, positive: bool) -> None:
    """``densities``: None, or numbers in [0, 1] (``positive``: > 0, as DARE rescales by 1/density)."""
    if densities is None:
        return
    if isinstance(densities, (Mapping, str, bytes)) or not isinstance(densities, Collection):
        raise ConfigError(f"densities must be a sequence of numbers, one per agent, got {type(densities).__name__}")
    for i, d in enumerate(densities):
        check_range(f"densities[{i}]", d, 0.0, 1.0)
        if positive and d == 0:
            raise ConfigError(f"densities[{i}] must be > 0 for DARE (survivors are rescaled by 1/density)")
