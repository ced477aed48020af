"""RAM's options, declared once: :class:`RamOptions`.

Every entry point of the RAM family takes one — :func:`ram_live.ram_merge` (``options=``),
:class:`ram_live.RAMSchedule` and the Lightning / transformers callbacks (``ram=``), verl's ``ram`` config group
(its ``+ram.variant=...`` keys) and the ``ram-live`` command's RAM flags (built from the fields below, with their
help) — and the old keyword spellings (``ram_merge(..., variant="ram", r=0.2)``) are funnelled into it.

This module imports no torch (``ram-live --help`` reads the fields) and no method: the fields and their checks
are declared here once, in :class:`RamFields` and :class:`RamPlusFields`, which the method configs
:class:`~ram_live.methods.RamConfig` / :class:`~ram_live.methods.RamPlusConfig` inherit.

>>> opts = RamOptions(variant="ram_plus", r=0.2, alpha=1.0)          # doctest: +SKIP
>>> ram_merge(agents, base=base_model, options=opts)                 # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .option_checks import check_choice, check_lambdas, check_names, check_range

__all__ = ["HoldsRamOptions", "RAM_VARIANTS", "RamFields", "RamOptions", "RamPlusFields", "choices"]


def _json_mapping(text: str) -> Any:
    """A ``--lambdas`` value: a JSON object ``{"agent": λ, ...}``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"lambdas must be a JSON object {{\"agent\": lambda, ...}}, got {text!r} ({exc})") from None


def _names(text: str) -> tuple[str, ...]:
    """An ``--exclude`` value: agent names separated by commas."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _option(default: Any, help: str, *, choices: tuple[Any, ...] | None = None, parse: Callable[[str], Any] = str,
            metavar: str | None = None, kw_only: bool = False) -> Any:
    """A field of :class:`RamOptions`; ``help``, ``choices``, ``parse`` (text -> value) and ``metavar`` are read by
    the command line's flags."""
    return field(default=default, kw_only=kw_only,
                 metadata={"help": help, "choices": choices, "parse": parse, "metavar": metavar})


#: The RAM family's method names (``ram_merge``'s ``variant``).
RAM_VARIANTS = ("ram", "ram_plus", "ram_plus_soft")


@dataclass(frozen=True)
class RamFields:
    """The fields of plain RAM's config, declared once (:class:`~ram_live.methods.RamConfig` adds the checks)."""

    eps: float = _option(1e-5, "an entry counts as updated when |agent - base| > EPS (activity 'abs'; default "
                               "1e-5)", parse=float)
    activity: str = _option("abs", "activity rule: 'abs' (|delta| > eps) or 'changed' (the stored value differs, "
                                   "compared in the narrower dtype); default abs", choices=("abs", "changed"))
    lambdas: Mapping[str, float] | None = _option(
        None, "the factor on the entries each agent alone updated, for every merged agent, instead of the "
              "rho-derived lambda (r and alpha unused), as JSON: {\"coder\": 2.0, \"tools\": 0.5}",
        parse=_json_mapping, metavar="JSON", kw_only=True)
    exclude: tuple[str, ...] = _option((), "agents to leave out of the merge, as if they were not passed "
                                           "(comma-separated names); at least one must remain",
                                       parse=_names, metavar="NAMES", kw_only=True)
    shared: str = _option("mean", "entries two or more agents updated: 'mean' (the paper's RAM: the mean over those "
                                  "agents) or 'sign' (the mean over those of them whose update has the sign of that "
                                  "mean: conflict-aware, docs/methods.md); default mean",
                          choices=("mean", "sign"), kw_only=True)

    def __post_init__(self) -> None:
        check_range("eps", self.eps, 0.0)
        check_choice("activity", self.activity, choices(RamFields, "activity"))
        check_choice("shared", self.shared, choices(RamFields, "shared"))
        if self.lambdas is not None:
            object.__setattr__(self, "lambdas", check_lambdas(self.lambdas))  # a fresh {agent: float}
        object.__setattr__(self, "exclude", check_names("exclude", self.exclude))


@dataclass(frozen=True)
class RamPlusFields(RamFields):
    """The fields RAM+ adds, declared once (:class:`~ram_live.methods.RamPlusConfig` adds the checks)."""

    r: float = _option(0.1, "RAM+ rescaling strength r in lambda = 1 + r * clip(rho, 0, alpha) (default 0.1)",
                       parse=float)
    alpha: float = _option(2.0, "RAM+ clip of rho, alpha; inf: no clip (default 2.0)", parse=float)
    rho_scope: str = _option("global", "rho per agent over the whole model ('global', the paper) or per tensor "
                                       "('tensor', mergekit's ramplus_tl); default global",
                             choices=("global", "tensor"))

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("r", self.r, 0.0)
        if self.alpha != math.inf:  # inf: uncapped
            check_range("alpha", self.alpha, 0.0)
        check_choice("rho_scope", self.rho_scope, choices(RamPlusFields, "rho_scope"))


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The values field ``name`` of ``cls`` takes (its declared ``choices``)."""
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["choices"]


@dataclass(frozen=True, kw_only=True)
class RamOptions(RamPlusFields):
    """The options of a RAM-family merge (paper Eq. 7 and its RAM+ / RAM+s variants): ``variant`` and the fields
    of :class:`~ram_live.methods.RamPlusConfig` (declared once, in :class:`RamFields` / :class:`RamPlusFields`).

    The authors' script is ``r=0.2, alpha=1.0``; mergekit's ``ramplus_tl`` is ``r=0.1, alpha=0.2,
    rho_scope="tensor"``. Options a variant does not use (``r``, ``alpha``, ``rho_scope`` for ``"ram"``; ``alpha``
    for ``"ram_plus_soft"``) are checked all the same. Invalid values are :class:`~ram_live.errors.ConfigError`
    naming the option.

    Args:
        variant, r, alpha, eps, activity, rho_scope, lambdas, exclude, shared: see each field's help
            (``RamOptions.help()``).

    Example:
        >>> opts = RamOptions(r=0.2, alpha=1.0)                              # doctest: +SKIP
        >>> merge(agents, base_model, opts.variant, **opts.method_options())   # the same merge  # doctest: +SKIP
        >>> RamOptions.of({"variant": "ram"}, eps=0.0).to_dict()["eps"]     # doctest: +SKIP
        0.0
    """

    variant: str = _option("ram_plus", "RAM variant: 'ram' (lambda = 1), 'ram_plus' (lambda_t = 1 + r * clip(rho_t, "
                           "0, alpha)) or 'ram_plus_soft' (lambda_t = 1 + r * rho_t / (1 + rho_t))",
                           choices=RAM_VARIANTS)

    def __post_init__(self) -> None:
        check_choice("variant", self.variant, RAM_VARIANTS)
        super().__post_init__()

    # ------------------------------------------------------------------------------------------- building

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def help(cls) -> dict[str, str]:
        """``{option: its help text}``."""
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}

    @classmethod
    def check_names(cls, names: Any, where: str = "", prefix: str = "", others: Sequence[str] = ()) -> None:
        """:class:`ConfigError` naming the names that are neither an option nor among ``others`` (the other
        options of ``where``, who was given them)."""
        unknown = sorted(set(names) - set(cls.names()) - set(others))
        if unknown:
            head = f"{where}: unknown option(s)" if where else "unknown RAM option(s)"
            own = f"its options are: {', '.join(others)}; and RAM's" if others else "the RAM options are"
            raise ConfigError(f"{head} {', '.join(repr(prefix + u) for u in unknown)}; {own}: "
                              f"{', '.join(prefix + n for n in cls.names())}")

    @classmethod
    def from_mapping(cls, values: RamOptions | Mapping[str, Any] | None, *, where: str = "",
                     prefix: str = "") -> RamOptions:
        """Options from a mapping of field values (e.g. verl's ``ram`` group, :meth:`to_dict`'s output) or a
        :class:`RamOptions` (returned as it is). ``prefix``: put before option names in errors (``"ram."``)."""
        if values is None:
            return cls()
        if isinstance(values, RamOptions):
            return values
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where + ': ' if where else ''}RAM options must be a RamOptions or a mapping of "
                              f"its fields, got {type(values).__name__}")
        cls.check_names(values, where, prefix)
        try:
            return cls(**values)
        except ConfigError as exc:
            if not prefix:
                raise
            raise ConfigError(f"{prefix}{exc}") from None

    @classmethod
    def of(cls, options: RamOptions | Mapping[str, Any] | None = None, /, *, where: str = "",
           **overrides: Any) -> RamOptions:
        """``options`` (a :class:`RamOptions`, a mapping of its fields, or None: the defaults) with the keyword
        ``overrides`` (the old spellings, ``variant="ram", r=0.2``) put over it, checked; unknown names are
        :class:`ConfigError` naming them and ``where`` (e.g. ``"RAMSchedule"``)."""
        cls.check_names(overrides, where)
        base = cls.from_mapping(options, where=where)
        return dataclasses.replace(base, **overrides) if overrides else base

    # ------------------------------------------------------------------------------------------- using

    def as_kwargs(self) -> dict[str, Any]:
        """Every option as keyword arguments: ``ram_merge(models, base, **opts.as_kwargs())``."""
        return {name: getattr(self, name) for name in self.names()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able values (``lambdas`` a dict, ``exclude`` a list), for logs, records and checkpoints;
        :meth:`from_mapping` reads them back."""
        out = self.as_kwargs()
        out["lambdas"] = dict(self.lambdas) if self.lambdas is not None else None
        out["exclude"] = list(self.exclude)
        return out

    def method_options(self) -> dict[str, Any]:
        """The options the variant's method config declares (:class:`RamFields` for ``"ram"``, those of
        :class:`RamPlusFields` for RAM+ and RAM+s), for ``merge(method=opts.variant, **opts.method_options())``."""
        declared = {f.name for f in dataclasses.fields(RamFields if self.variant == "ram" else RamPlusFields)}
        return {k: v for k, v in self.as_kwargs().items() if k in declared}


class HoldsRamOptions:
    """Mixin of objects that hold a :class:`RamOptions` as ``self.ram`` (``RAMSchedule``, verl's options):
    ``obj.variant``, ``obj.r``, ... read it, and setting them is an error (set ``obj.ram``, which is checked)."""

    def __getattr__(self, name: str) -> Any:
        if name in RamOptions.names() and "ram" in self.__dict__:
            return getattr(self.__dict__["ram"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RamOptions.names():
            raise AttributeError(f"{type(self).__name__}.{name} is read from .ram: set .ram = "
                                 f"dataclasses.replace(.ram, {name}=...)")
        if name == "ram":
            value = RamOptions.from_mapping(value, where=type(self).__name__)
        super().__setattr__(name, value)
