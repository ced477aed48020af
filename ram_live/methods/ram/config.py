"""RAM's one config, :class:`RamConfig`, with its λ rule as a value (:mod:`.rules`: ``Unit`` (RAM), ``RhoClip``
(RAM+), ``RhoSoft`` (RAM+s) or ``Given`` (λ per agent)).

The config is the method: ``merge(models, base, config=RamConfig(lam=RhoClip(r=0.2, alpha=1.0)))``. The short
names ``method="ram" | "ram_plus" | "ram_plus_soft"`` build the same config from flat keywords
(``merge(models, base, method="ram_plus", r=0.2, alpha=1.0)``, the search's ``result.best``), and
:meth:`RamConfig.flat` gives them back. Every entry point that runs RAM (``merge``, ``ram_merge``,
``RAMSchedule(ram=...)``, the callbacks, verl's ``ram.*`` keys, the ``ram-live`` flags, mergekit YAML) takes it.

Adding a λ rule is a class in :mod:`.rules`. This module imports no torch (``ram-live --help`` reads the fields'
help).

>>> RamConfig.from_flat("ram_plus", r=0.2, alpha=1.0) == RamConfig(lam=RhoClip(r=0.2, alpha=1.0))
True
>>> RamConfig(lam=RhoSoft(r=0.2)).flat()
('ram_plus_soft', {'r': 0.2})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from ...option_checks import check_choice, check_names, check_range
from .rules import RAM_METHODS, RULES, Given, Lam, RhoClip, RhoSoft, Unit, option

__all__ = ["FLAT_NAMES", "RamConfig", "flat_fields"]


def _names(text: str) -> tuple[str, ...]:
    """An ``--exclude`` value: agent names separated by commas."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


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
    shared: str = option(
        "mean",
        "entries two or more agents updated: 'mean' (the paper's RAM: the mean over those "
        "agents) or 'sign' (the mean over those of them whose update has the sign of that "
        "mean: conflict-aware, docs/methods.md); default mean",
        choices=("mean", "sign"),
    )
    activity: str = option(
        "abs",
        "activity rule: 'abs' (|delta| > eps) or 'changed' (the stored value differs, "
        "compared in the narrower dtype); default abs",
        choices=("abs", "changed"),
    )
    eps: float = option(
        1e-5, "an entry counts as updated when |agent - base| > EPS (activity 'abs'; default 1e-5)", parse=float
    )
    rho_scope: str = option(
        "global",
        "rho per agent over the whole model ('global', the paper) or per tensor "
        "('tensor', mergekit's ramplus_tl); default global",
        choices=("global", "tensor"),
    )
    exclude: tuple[str, ...] = option(
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
        """Whether a short name may run this config.

        Args:
            method: ``"ram"``, ``"ram_plus"``, ``"ram_plus_soft"`` or another name.

        Returns:
            True where ``method`` is a RAM name and the λ rule's own (given λ: every RAM name).
        """
        return method in RULES and (self.lam.method is None or self.lam.method == method)

    # ------------------------------------------------------------------------------------------- flat spelling

    @staticmethod
    def flat_names(method: str) -> tuple[str, ...]:
        """The flat keywords a short name takes (``merge(method=..., **options)``).

        Args:
            method: a RAM short name.

        Returns:
            The keyword names, the rule's (``r``, ``alpha``) among them.

        Raises:
            ConfigError: ``method`` is not a RAM short name.
        """
        check_choice("RAM method", method, RAM_METHODS)
        rule = tuple(f.name for f in dataclasses.fields(RULES[method]))
        scope = ("rho_scope",) if RULES[method].uses_rho else ()
        return ("eps", "activity", *rule, *scope, "lambdas", "exclude", "shared")

    @classmethod
    def from_flat(cls, method: str, **options: Any) -> RamConfig:
        """The config of ``merge(method=method, **options)``: the rule of ``method`` with its keywords (``r``,
        ``alpha``), or ``Given(lambdas)`` where ``lambdas`` is given (the rule's keywords are checked, unused).

        Args:
            method: a RAM short name.
            **options: its flat keywords (:meth:`flat_names`).

        Returns:
            The :class:`RamConfig`.

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
        (the default ``RamConfig()``).

        Args:
            values: the mapping, a config, or None.
            where: who reads it, named in errors (``"RAMSchedule"``).
            prefix: goes before option names in errors (``"ram."``).
            method_key: the key that holds the short name.

        Returns:
            The :class:`RamConfig`.

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
        """This merge as a short name and flat keywords: ``merge(models, base, method, **options)``.

        Args:
            defaults: every keyword of the method, those at their defaults too (records); else only those that
                differ from them.

        Returns:
            ``(method, options)`` (given λ as ``("ram", {"lambdas": ...})``).

        Raises:
            ConfigError: a λ rule of your own, which has no flat spelling.
        """
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
        """Every keyword with its value, for reports and JSON output.

        Returns:
            ``{"method": ..., option: value}`` (:meth:`flat` with ``defaults``); a rule of your own as
            ``"lam": {"rule": its class name, field: value}``.
        """
        if isinstance(self.lam, (Unit, RhoClip, RhoSoft, Given)):
            method, options = self.flat(defaults=True)
            return {"method": method, **options}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "lam"}
        lam = dataclasses.asdict(self.lam) if dataclasses.is_dataclass(self.lam) else {}
        return {"method": self.method, "lam": {"rule": type(self.lam).__name__, **lam}, **fields}

    def to_dict(self) -> dict[str, Any]:
        """Returns:
        JSON-able ``{"method": ..., option: value}`` (:meth:`flat`), read back by :meth:`from_dict`.
        """
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
