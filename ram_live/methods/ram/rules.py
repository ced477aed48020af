"""RAM's λ rules, each a frozen dataclass: :class:`Unit` (RAM, λ = 1), :class:`RhoClip` (RAM+), :class:`RhoSoft`
(RAM+s) and :class:`Given` (λ per agent); :data:`RULES` maps the short method names to them.

A rule has ``method`` (its short name, or None), ``uses_rho`` (whether it needs the overlap ratio ρ), ``value(rho)``
and ``bound()``; adding one is a class here and, for a short name of its own, an entry of :data:`RULES`. This
module imports no torch (``ram-live --help`` reads the fields' help, declared with :func:`option`).

>>> RhoClip(r=0.1, alpha=2.0).value(5.0), Unit().bound()
(1.2, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from ...errors import ConfigError
from ...option_checks import check_lambdas, check_range, parse_json

__all__ = ["Given", "Lam", "RAM_METHODS", "RULES", "RhoClip", "RhoSoft", "Unit", "option"]


def _json_mapping(text: str) -> Any:
    """A ``--lambdas`` value: a JSON object ``{"agent": λ, ...}``."""
    return parse_json('lambdas (a JSON object {"agent": lambda, ...})', text)


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[Any, ...] | None = None,
    parse: Callable[[str], Any] = str,
    metavar: str | None = None,
) -> Any:
    """A field; ``help``, ``choices``, ``parse`` (text -> value) and ``metavar`` are read by the CLI's flags."""
    return field(default=default, metadata={"help": help, "choices": choices, "parse": parse, "metavar": metavar})


@dataclass(frozen=True)
class Unit:
    """RAM (paper Eq. 7): λ = 1, unique entries kept as they are.

    >>> Unit().value(3.0)
    1.0
    """

    method: ClassVar[str | None] = "ram"
    uses_rho: ClassVar[bool] = False

    def value(self, rho: float) -> float:
        """λ_t of an agent.

        Args:
            rho: the agent's overlap ratio ρ_t (unused).

        Returns:
            1.0.
        """
        return 1.0

    def bound(self) -> float:
        """Returns:
        The largest |λ| the rule gives: 1.0.
        """
        return 1.0


@dataclass(frozen=True)
class RhoClip:
    """RAM+: λ_t = 1 + r · clip(ρ_t, 0, alpha) (paper: r = 0.1, α = 2). ``alpha=math.inf``: no clip; an agent
    with ρ_t = +∞ (no unique entry) then gets 1.0 (nothing to scale). The authors' script is ``r=0.2,
    alpha=1.0``; mergekit's ``ramplus_tl`` is ``RhoClip(r=0.1, alpha=0.2)`` with ``rho_scope="tensor"``.

    Args:
        r: the rescaling strength (≥ 0).
        alpha: the clip of ρ (≥ 0, or ``math.inf``).

    Raises:
        ConfigError: r or alpha negative, NaN or not a number.

    >>> RhoClip(r=0.1, alpha=1.0).value(2.0)
    1.1
    """

    r: float = option(
        0.1, "RAM+ rescaling strength r in lambda = 1 + r * clip(rho, 0, alpha) (default 0.1)", parse=float
    )
    alpha: float = option(2.0, "RAM+ clip of rho, alpha; inf: no clip (default 2.0)", parse=float)
    method: ClassVar[str | None] = "ram_plus"
    uses_rho: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("r", self.r, 0.0)
        if self.alpha != math.inf:  # inf: uncapped
            check_range("alpha", self.alpha, 0.0)

    def value(self, rho: float) -> float:
        """λ_t of an agent.

        Args:
            rho: the agent's overlap ratio ρ_t = shared_t / unique_t (+∞ without unique entries).

        Returns:
            1 + r · clip(ρ_t, 0, alpha); 1.0 where alpha and ρ_t are both +∞.
        """
        if math.isinf(self.alpha) and math.isinf(rho):
            return 1.0
        return 1.0 + self.r * min(max(rho, 0.0), self.alpha)

    def bound(self) -> float:
        """Returns:
        The largest |λ| the rule gives, 1 + r · alpha (``math.inf`` uncapped).
        """
        return 1.0 + self.r * self.alpha


@dataclass(frozen=True)
class RhoSoft:
    """RAM+s: λ_t = 1 + r · ρ_t / (1 + ρ_t) = 1 + r · shared_t / active_t (paper App. E).

    Args:
        r: the rescaling strength (≥ 0).

    Raises:
        ConfigError: r negative, NaN or not a number.

    >>> RhoSoft(r=0.3).value(1.0)
    1.15
    """

    r: float = 0.1
    method: ClassVar[str | None] = "ram_plus_soft"
    uses_rho: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("r", self.r, 0.0)

    def value(self, rho: float) -> float:
        """λ_t of an agent.

        Args:
            rho: the agent's overlap ratio ρ_t (+∞ without unique entries).

        Returns:
            1 + r · ρ_t / (1 + ρ_t) (1 + r for ρ_t = +∞).
        """
        return 1.0 + self.r * (1.0 if math.isinf(rho) else rho / (1.0 + rho))

    def bound(self) -> float:
        """Returns:
        The largest |λ| the rule gives, 1 + r.
        """
        return 1.0 + self.r


@dataclass(frozen=True)
class Given:
    """λ_t given for **every** merged agent, ``{agent: λ_t}``: ρ is not counted (no statistics pass). Names not
    among the merged agents, and merged agents left out, are :class:`ConfigError` at merge time. λ_t = 1 for
    every agent is plain RAM, bit for bit; any finite λ is taken (λ > 1 extrapolates τ_t).

    Args:
        lambdas: ``{agent name: λ_t}``, finite numbers.

    Raises:
        ConfigError: not a mapping of names to finite numbers.

    >>> Given({"coder": 2.0, "tools": 0.5}).bound()
    2.0
    """

    lambdas: Mapping[str, float] = option(
        None,
        "the factor on the entries each agent alone updated, for every merged agent, instead of the "
        'rho-derived lambda (r and alpha unused), as JSON: {"coder": 2.0, "tools": 0.5}',
        parse=_json_mapping,
        metavar="JSON",
    )
    method: ClassVar[str | None] = None  # any RAM short name with ``lambdas=``
    uses_rho: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "lambdas", check_lambdas(self.lambdas))  # a fresh, hashable {agent: float}

    def value(self, rho: float) -> float:
        """Not defined: λ is per agent name (:func:`ram_live.methods.ram.lambdas.given_lambdas`).

        Args:
            rho: unused.

        Returns:
            Nothing: it always raises.

        Raises:
            ConfigError: always.
        """
        raise ConfigError("Given λ is per agent name, not a function of ρ")

    def bound(self) -> float:
        """Returns:
        The largest |λ| given (at least 1: shared entries are a mean).
        """
        return max([1.0] + [abs(v) for v in self.lambdas.values()])


Lam = Union[Unit, RhoClip, RhoSoft, Given]
#: The short method names and the rule each builds (``method="ram_plus"`` is ``RhoClip``).
RULES: dict[str, type] = {"ram": Unit, "ram_plus": RhoClip, "ram_plus_soft": RhoSoft}
#: The RAM family's short method names.
RAM_METHODS = tuple(RULES)
