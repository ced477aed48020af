"""The registry of merge methods, keyed by name: register one, look one up, build its config from options."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from ..errors import ConfigError, MethodExistsError, UnknownMethodError
from .base import Combine, MergeMethod

__all__ = ["register_method", "get_method", "available_methods", "make_config", "method_of_config"]

_REGISTRY: dict[str, MergeMethod] = {}


def _load_builtins() -> None:
    """Register the built-in families (their modules import torch) before the registry answers: importing
    :mod:`ram_live.methods.builtins` runs once, and a thread that asks meanwhile waits for it (the import lock); a
    family that fails to import raises its own error, at every ask."""
    importlib.import_module("ram_live.methods.builtins")


def register_method(
    name: str,
    config_cls: type,
    combine: Combine | None = None,
    **hooks: Any,
) -> Any:
    """Register a merge method under ``name``; usable as a decorator on ``combine``.

    Args:
        name: the method's name (``merge(..., method=name)``).
        config_cls: its options, a dataclass.
        combine: ``combine(deltas[K, C], ctx, config) -> τ*[C]``.
        **hooks: the other fields of :class:`~ram_live.methods.MergeMethod` (``setup``, ``prepare``,
            ``accumulator``, ``kernels``, ``record``, ``overflow_bound``, ...).

    Returns:
        ``combine`` (registered), or, without it, a decorator that registers the function it decorates.

    Raises:
        MethodExistsError: the name is taken (the built-in names too).
        ConfigError: ``config_cls`` is not a dataclass.

    Example:
        >>> @register_method("median", MedianConfig)                     # doctest: +SKIP
        ... def median(deltas, ctx, config):
        ...     return deltas.median(dim=0).values
    """

    _load_builtins()

    def _register(fn: Combine) -> Combine:
        if name in _REGISTRY:
            raise MethodExistsError(f"a merge method named {name!r} is already registered")
        if not dataclasses.is_dataclass(config_cls):
            raise ConfigError(f"config_cls of {name!r} must be a dataclass, got {config_cls!r}")
        _REGISTRY[name] = MergeMethod(name=name, config_cls=config_cls, combine=fn, **hooks)
        return fn

    return _register(combine) if combine is not None else _register


def get_method(name: str) -> MergeMethod:
    """The method registered under a name.

    Args:
        name: the method's name.

    Returns:
        Its :class:`~ram_live.methods.MergeMethod`.

    Raises:
        UnknownMethodError: no method of that name (the message lists the available ones).

    >>> get_method("ties").name
    'ties'
    """
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownMethodError(f"unknown merge method {name!r}; available: {', '.join(sorted(_REGISTRY))}") from None


def available_methods() -> list[str]:
    """Returns:
    The registered methods' names, sorted (the built-in ones and yours).

    >>> "ram_plus" in available_methods()
    True
    """
    _load_builtins()
    return sorted(_REGISTRY)


def make_config(name: str, config: Any = None, **options: Any) -> Any:
    """Build ``name``'s config from keyword options (over ``config``'s where given), naming any unknown option."""
    method = get_method(name)
    if method.configure is not None:
        return method.configure(name, config, options)
    if config is not None and not isinstance(config, method.config_cls):
        raise ConfigError(f"method {name!r} takes a {method.config_cls.__name__}, got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(method.config_cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for method {name!r}; "
            f"its options are: {', '.join(sorted(known))}"
        )
    if config is not None and not options:
        return config
    try:
        return dataclasses.replace(config, **options) if config is not None else method.config_cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid options for method {name!r}: {exc}") from exc


def method_of_config(config: Any) -> str:
    """The method name a config runs as (``merge(models, base, config=config)``): its ``method`` attribute where
    it has one (:class:`~ram_live.methods.ram.config.RamConfig`), else the one method registered with its class.

    Raises:
        ConfigError: no method, or several, take that config class.
    """
    _load_builtins()
    own = getattr(config, "method", None)
    if isinstance(own, str) and own in _REGISTRY:
        return own
    names = [n for n, m in _REGISTRY.items() if isinstance(config, m.config_cls)]
    exact = [n for n in names if type(config) is _REGISTRY[n].config_cls]
    if len(exact) == 1 or len(names) == 1:
        return (exact or names)[0]
    raise ConfigError(
        f"no single merge method takes a {type(config).__name__} "
        f"({', '.join(names) or 'none registered'}): pass method= too"
    )
