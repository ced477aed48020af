"""RAM's one config, :class:`RamConfig`, with its λ rule as a value: :class:`Unit` (RAM), :class:`RhoClip`
(RAM+), :class:`RhoSoft` (RAM+s) or :class:`Given` (λ per agent).

The config is the method: ``merge(models, base, config=RamConfig(lam=RhoClip(r=0.2, alpha=1.0)))``. The short
names ``method="ram" | "ram_plus" | "ram_plus_soft"`` build the same config from flat keywords
(``merge(models, base, method="ram_plus", r=0.2, alpha=1.0)``, the search's ``result.best``), and
:meth:`RamConfig.flat` gives them back. Every entry point that runs RAM (``merge``, ``ram_merge``,
``RAMSchedule(ram=...)``, the callbacks, verl's ``ram.*`` keys, the ``ram-live`` flags, mergekit YAML) takes it.

A λ rule is a frozen dataclass with ``method`` (its short name, or None), ``uses_rho`` (whether it needs the
overlap ratio ρ), ``value(rho)`` and ``bound()``; adding one is a class here and an entry of :data:`RULES`.
This module imports no torch (``ram-live --help`` reads the fields' help).

>>> RamConfig.from_flat("ram_plus", r=0.2, alpha=1.0) == RamConfig(lam=RhoClip(r=0.2, alpha=1.0))
True
>>> RamConfig(lam=RhoSoft(r=0.2)).flat()
('ram_plus_soft', {'r': 0.2})
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from ...errors import ConfigError
from ...option_checks import check_choice, check_lambdas, check_names, check_range

__all__ = [
    "FLAT_NAMES",
    "Given",
    "Lam",
    "RAM_METHODS",
    "RULES",
    "RamConfig",
    "RhoClip",
    "RhoSoft",
    "Unit",
    "flat_fields",
]


def _json_mapping(text: str) -> Any:
    """A ``--lambdas`` value: a JSON object ``{"agent": λ, ...}``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f'lambdas must be a JSON object {{"agent": lambda, ...}}, got {text!r} ({exc})') from None


def _names(text: str) -> tuple[str, ...]:
    """An ``--exclude`` value: agent names separated by commas."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _option(
    default: Any,
    help: str,
    *,
    choices: tuple[Any, ...] | None = None,
    parse: Callable[[str], Any] = str,
    metavar: str | None = None,
) -> Any:
    """A field; ``help``, ``choices``, ``parse`` (text -> value) and ``metavar`` are read by the CLI's flags."""
    return field(default=default, metadata={"help": help, "choices": choices, "parse": parse, "metavar": metavar})


# ----------------------------------------------------------------------------------------------- λ rules


@dataclass(frozen=True)
class Unit:
    """RAM (paper Eq. 7): λ = 1, unique entries kept as they are."""

    method: ClassVar[str | None] = "ram"
    uses_rho: ClassVar[bool] = False

    def value(self, rho: float) -> float:
        """λ_t for an agent whose overlap ratio is ``rho``: 1."""
        return 1.0

    def bound(self) -> float:
        """The largest |λ| the rule gives."""
        return 1.0


@dataclass(frozen=True)
class RhoClip:
    """RAM+: λ_t = 1 + r · clip(ρ_t, 0, alpha) (paper: r = 0.1, α = 2). ``alpha=math.inf``: no clip; an agent
    with ρ_t = +∞ (no unique entry) then gets 1.0 (nothing to scale). The authors' script is ``r=0.2,
    alpha=1.0``; mergekit's ``ramplus_tl`` is ``RhoClip(r=0.1, alpha=0.2)`` with ``rho_scope="tensor"``."""

    r: float = _option(
        0.1, "RAM+ rescaling strength r in lambda = 1 + r * clip(rho, 0, alpha) (default 0.1)", parse=float
    )
    alpha: float = _option(2.0, "RAM+ clip of rho, alpha; inf: no clip (default 2.0)", parse=float)
    method: ClassVar[str | None] = "ram_plus"
    uses_rho: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("r", self.r, 0.0)
        if self.alpha != math.inf:  # inf: uncapped
            check_range("alpha", self.alpha, 0.0)

    def value(self, rho: float) -> float:
        """λ_t for an agent whose overlap ratio is ``rho``."""
        if math.isinf(self.alpha) and math.isinf(rho):
            return 1.0
        return 1.0 + self.r * min(max(rho, 0.0), self.alpha)

    def bound(self) -> float:
        """The largest |λ| the rule gives (``math.inf`` uncapped)."""
        return 1.0 + self.r * self.alpha


@dataclass(frozen=True)
class RhoSoft:
    """RAM+s: λ_t = 1 + r · ρ_t / (1 + ρ_t) = 1 + r · shared_t / active_t (paper App. E)."""

    r: float = 0.1
    method: ClassVar[str | None] = "ram_plus_soft"
    uses_rho: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_range("r", self.r, 0.0)

    def value(self, rho: float) -> float:
        """λ_t for an agent whose overlap ratio is ``rho``."""
        return 1.0 + self.r * (1.0 if math.isinf(rho) else rho / (1.0 + rho))

    def bound(self) -> float:
        """The largest |λ| the rule gives."""
        return 1.0 + self.r


@dataclass(frozen=True)
class Given:
    """λ_t given for **every** merged agent, ``{agent: λ_t}``: ρ is not counted (no statistics pass). Names not
    among the merged agents, and merged agents left out, are :class:`ConfigError` at merge time. λ_t = 1 for
    every agent is plain RAM, bit for bit; any finite λ is taken (λ > 1 extrapolates τ_t)."""

    lambdas: Mapping[str, float] = _option(
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
        """Not defined: λ is per agent name (:func:`ram_live.methods.given_lambdas`)."""
        raise ConfigError("Given λ is per agent name, not a function of ρ")

    def bound(self) -> float:
        """The largest |λ| given (at least 1: shared entries are a mean)."""
        return max([1.0] + [abs(v) for v in self.lambdas.values()])


Lam = Union[Unit, RhoClip, RhoSoft, Given]
#: The short method names and the rule each builds (``method="ram_plus"`` is ``RhoClip``).
RULES: dict[str, type] = {"ram": Unit, "ram_plus": RhoClip, "ram_plus_soft": RhoSoft}
#: The RAM family's short method names.
RAM_METHODS = tuple(RULES)


# ----------------------------------------------------------------------------------------------- the config


@dataclass(frozen=True, kw_only=True)
class RamConfig:
    """A RAM-family merge (paper Eq. 7): the mean over the active agents where ≥ 2 updated an entry, the one
    agent's τ times λ_t where one did, the base where none did.

    Args:
        lam: the λ rule (default ``RhoClip()``, RAM+ with the paper's r = 0.1, α = 2; ``Unit()``: plain RAM).
        shared: ``"mean"`` (the paper) or ``"sign"`` (the mean over the active agents whose τ has the sign of the
            mean: conflict-aware, docs/methods.md; where all agree, RAM's bits).
        activity, eps: ``"abs"`` (|τ| > eps, the paper) or ``"changed"`` (the stored value differs).
        rho_scope: ρ over the whole model (``"global"``, the paper) or per tensor (``"tensor"``, mergekit's
            ``ramplus_tl``); only with a rule that uses ρ.
        exclude: agents to leave out, as if not passed; at least one must remain.

    Raises:
        ConfigError: an invalid value, naming it.

    >>> RamConfig(lam=Unit()).method, RamConfig().lam
    ('ram', RhoClip(r=0.1, alpha=2.0))
    """

    lam: Lam = field(default_factory=RhoClip)
    shared: str = _option(
        "mean",
        "entries two or more agents updated: 'mean' (the paper's RAM: the mean over those "
        "agents) or 'sign' (the mean over those of them whose update has the sign of that "
        "mean: conflict-aware, docs/methods.md); default mean",
        choices=("mean", "sign"),
    )
    activity: str = _option(
        "abs",
        "activity rule: 'abs' (|delta| > eps) or 'changed' (the stored value differs, "
        "compared in the narrower dtype); default abs",
        choices=("abs", "changed"),
    )
    eps: float = _option(
        1e-5, "an entry counts as updated when |agent - base| > EPS (activity 'abs'; default 1e-5)", parse=float
    )
    rho_scope: str = _option(
        "global",
        "rho per agent over the whole model ('global', the paper) or per tensor "
        "('tensor', mergekit's ramplus_tl); default global",
        choices=("global", "tensor"),
    )
    exclude: tuple[str, ...] = _option(
        (),
        "agents to leave out of the merge, as if they were not passed "
        "(comma-separated names); at least one must remain",
        parse=_names,
        metavar="NAMES",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.lam, (Unit, RhoClip, RhoSoft, Given)) and not callable(getattr(self.lam, "value", 0)):
            raise ConfigError(
                f"lam must be Unit(), RhoClip(...), RhoSoft(...) or Given({{agent: λ}}), got {self.lam!r}"
            )
        check_choice("shared", self.shared, ("mean", "sign"))
        check_choice("activity", self.activity, ("abs", "changed"))
        check_range("eps", self.eps, 0.0)
        check_choice("rho_scope", self.rho_scope, ("global", "tensor"))
        if self.rho_scope == "tensor" and not self.lam.uses_rho:
            raise ConfigError(f"rho_scope='tensor' needs a λ rule that uses ρ (RhoClip, RhoSoft), not {self.lam!r}")
        object.__setattr__(self, "exclude", check_names("exclude", self.exclude))

    @property
    def method(self) -> str:
        """The short name this config runs as (given λ: ``"ram"``; a rule of your own: ``"ram_plus"`` if it
        uses ρ, else ``"ram"``; all three names run the same hooks)."""
        return self.lam.method or ("ram_plus" if self.lam.uses_rho else "ram")

    def agrees(self, method: str) -> bool:
        """Whether the short name ``method`` may run this config (given λ: every RAM name)."""
        return method in RULES and (self.lam.method is None or self.lam.method == method)

    # ------------------------------------------------------------------------------------------- flat spelling

    @staticmethod
    def flat_names(method: str) -> tuple[str, ...]:
        """The flat keywords short name ``method`` takes (``merge(method=..., **options)``)."""
        check_choice("RAM method", method, RAM_METHODS)
        rule = tuple(f.name for f in dataclasses.fields(RULES[method]))
        scope = ("rho_scope",) if RULES[method].uses_rho else ()
        return ("eps", "activity", *rule, *scope, "lambdas", "exclude", "shared")

    @classmethod
    def from_flat(cls, method: str, **options: Any) -> RamConfig:
        """The config of ``merge(method=method, **options)``: the rule of ``method`` with its keywords (``r``,
        ``alpha``), or ``Given(lambdas)`` where ``lambdas`` is given (the rule's keywords are checked, unused).

        Raises:
            ConfigError: an unknown name or an invalid value, naming it.
        """
        known = cls.flat_names(method)
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(map(repr, unknown))} for method {method!r}; "
                f"its options are: {', '.join(sorted(known))}"
            )
        rule_keys = {f.name for f in dataclasses.fields(RULES[method])}
        lam = RULES[method](**{k: v for k, v in options.items() if k in rule_keys})
        lambdas = options.get("lambdas")
        if lambdas is not None:
            lam = Given(lambdas)
        rest = {k: v for k, v in options.items() if k not in rule_keys and k != "lambdas"}
        if rest.get("rho_scope") == "tensor" and lambdas is not None:
            rest.pop("rho_scope")  # unused with given λ, as r and alpha
        return cls(lam=lam, **rest)

    @classmethod
    def from_dict(
        cls,
        values: RamConfig | Mapping[str, Any] | None,
        *,
        where: str = "",
        prefix: str = "",
        method_key: str = "method",
    ) -> RamConfig:
        """A config from a flat mapping ``{method_key: short name, option: value, ...}`` (:meth:`to_dict`'s
        output, verl's ``ram`` group with ``method_key="variant"``), a :class:`RamConfig` (as it is) or None
        (the default ``RamConfig()``). ``prefix`` goes before option names in errors (``"ram."``).

        Raises:
            ConfigError: not a mapping, an unknown key or an invalid value, naming it and ``where``.
        """
        if values is None:
            return cls()
        if isinstance(values, RamConfig):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"{where + ': ' if where else ''}the RAM config must be a RamConfig or a mapping "
                f"{{{method_key!r}: ..., option: value}}, got {type(values).__name__}"
            )
        options = dict(values)
        method = options.pop(method_key, "ram_plus")
        try:
            if method not in RULES:
                raise ConfigError(f"{method_key} must be one of {', '.join(map(repr, RAM_METHODS))}, got {method!r}")
            return cls.from_flat(method, **options)
        except ConfigError as exc:
            raise ConfigError(f"{where + ': ' if where else ''}{prefix}{exc}") from None

    def flat(self, defaults: bool = False) -> tuple[str, dict[str, Any]]:
        """``(method, options)`` with ``merge(models, base, method, **options)`` this merge (given λ as
        ``("ram", {"lambdas": ...})``); ``defaults``: every keyword of the method, those at their defaults too
        (records), else those only that differ from them."""
        options: dict[str, Any] = {}
        if not isinstance(self.lam, (Unit, RhoClip, RhoSoft, Given)):
            raise ConfigError(f"{self.lam!r} has no flat spelling (method name and keywords): pass the config")
        if isinstance(self.lam, Given):
            options["lambdas"] = dict(self.lam.lambdas)
        else:
            options.update(dataclasses.asdict(self.lam))
        names = self.flat_names(self.method)
        for f in dataclasses.fields(self):
            if f.name != "lam" and (getattr(self, f.name) != f.default or defaults and f.name in names):
                options[f.name] = getattr(self, f.name)
        default = RULES[self.method]() if self.lam.method and not defaults else None
        for k in list(options):
            if default is not None and k in options and getattr(default, k, object()) == options[k]:
                del options[k]
        if "exclude" in options:
            options["exclude"] = list(options["exclude"])
        return self.method, options

    def record(self) -> dict[str, Any]:
        """Every keyword with its value, ``{"method": ..., option: value}`` (:meth:`flat` with ``defaults``), for
        reports and JSON output; a rule of your own as ``"lam": {"rule": its class name, field: value}``."""
        if isinstance(self.lam, (Unit, RhoClip, RhoSoft, Given)):
            method, options = self.flat(defaults=True)
            return {"method": method, **options}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "lam"}
        lam = dataclasses.asdict(self.lam) if dataclasses.is_dataclass(self.lam) else {}
        return {"method": self.method, "lam": {"rule": type(self.lam).__name__, **lam}, **fields}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able ``{"method": ..., option: value}`` (:meth:`flat`), read back by :meth:`from_dict`."""
        method, options = self.flat()
        return {"method": method, **options}


#: The flat keywords, in the order the CLI lists them: the rules' parameters, then the config's fields.
FLAT_NAMES = tuple(dict.fromkeys(f.name for rule in RULES.values() for f in dataclasses.fields(rule))) + (
    "eps",
    "activity",
    "rho_scope",
    "lambdas",
    "exclude",
    "shared",
)


def flat_fields() -> Iterator[dataclasses.Field]:
    """The flat keywords' fields (:data:`FLAT_NAMES`, from the rules and the config; a parameter's first
    declaration with CLI help wins), with their CLI help."""
    fields: dict[str, dataclasses.Field] = {}
    for cls in (Given, *RULES.values(), RamConfig):
        for f in dataclasses.fields(cls):
            if f.name not in fields or "help" not in fields[f.name].metadata:
                fields[f.name] = f
    return (fields[name] for name in FLAT_NAMES)
