"""Every public entry point documents, Google style (as PEFT and torchao write them), what it takes (``Args:``),
what it gives back (``Returns:``) and the library's errors it raises (``Raises:``).

Public entry points: every function or class in the ``__all__`` of ``ram_live`` (lazily exported),
``ram_live.integrations.lightning`` / ``.transformers`` / ``.verl``, ``ram_live.evaluate`` and ``ram_live.peft``,
and the public methods of those classes and of the classes their entry points hand out (the store's snapshots,
search results, the probe report, ...: :data:`HANDED_OUT`).

The rules, checked with :mod:`inspect` (a heuristic, kept simple and honest):

- ``Args:`` when the callable takes a parameter other than ``self`` / ``cls`` (for a class: its ``__init__``;
  the class docstring or ``__init__``'s may hold it; a dataclass may say ``Attributes:`` instead, as its fields
  are its parameters).
- ``Returns:`` (or ``Yields:`` for a generator or context manager) when it is a function or method whose return
  annotation is not ``None`` (annotated ``-> None``: exempt; not annotated: required). Classes are exempt: a
  constructor returns the instance.
- ``Raises:`` when its own source text contains ``raise `` (a bare re-raise ``raise`` alone on a line does not
  count) or calls one of the library's check helpers (:data:`CHECKS`: they raise :class:`ram_live.ConfigError`).
  Errors raised further down the call stack are not seen: the heuristic under-asks, never over-asks.

Exempt: exception and warning classes (raised by the library, not called), properties (documented as
attributes) and ``__init__`` of an exempt class. No entry point is skipped or pending.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

MODULES = [
    "ram_live",
    "ram_live.integrations.lightning",
    "ram_live.integrations.transformers",
    "ram_live.integrations.verl",
    "ram_live.evaluate",
    "ram_live.peft",
]

#: classes that entry points hand out and whose public methods users call (module, name)
HANDED_OUT = [
    ("ram_live.store", "StoreBase"),
    ("ram_live.store", "SnapshotInfo"),
    ("ram_live.store", "VerifyReport"),
    ("ram_live.training.search", "SearchSetting"),
]

#: helpers whose call means the caller raises a ConfigError on a bad option
CHECKS = re.compile(r"\b(check_[a-z_]+|_check[a-z_]*|parse_[a-z_]+|load_callable)\(")


def _is_exempt_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseException)


def _public_names() -> Iterator[tuple[str, Any]]:
    for name in MODULES:
        module = pytest.importorskip(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{name}.{attr}", obj
    for name, attr in HANDED_OUT:
        yield f"{name}.{attr}", getattr(importlib.import_module(name), attr)


def _methods(qual: str, cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods ``cls`` defines or inherits from the library (not from object, torch or Lightning);
    a framework's hook that the class overrides (Lightning's ``on_train_start``, transformers'
    ``on_step_end``, ...) is the framework's to document."""
    foreign = {a for k in cls.__mro__ if not k.__module__.startswith("ram_live") for a in vars(k)}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("ram_live"):
            continue
        for attr, raw in vars(klass).items():
            if attr.startswith("_") or isinstance(raw, property) or attr in foreign:
                continue
            fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
            if inspect.isfunction(fn):
                yield f"{qual}.{attr}", fn


def entry_points() -> dict[str, Any]:
    """Qualified name -> function or class (a skipped class's methods are skipped with it)."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for qual, obj in _public_names():
        if _is_exempt_class(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        out[qual] = obj
        if inspect.isclass(obj):
            for mqual, fn in _methods(qual, obj):
                out.setdefault(mqual, fn)
    return out


def _takes_parameters(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(p not in ("self", "cls") for p in params)


def _source(fn: Any) -> str:
    with contextlib.suppress(OSError, TypeError):
        return inspect.getsource(fn)
    return ""


def _raises(fn: Any) -> bool:
    src = _source(fn)
    body = src.split('"""', 2)[-1] if src.count('"""') >= 2 else src  # the code after the docstring
    return bool(re.search(r"\braise [A-Za-z_]", body) or CHECKS.search(body))


def _returns_something(fn: Any) -> bool:
    ann = inspect.signature(fn).return_annotation
    return ann not in (None, "None", type(None))


def missing_sections(qual: str, obj: Any) -> list[str]:
    """The sections ``obj``'s docstring lacks under the rules above."""
    missing = []
    if inspect.isclass(obj):
        init = obj.__init__
        doc = (obj.__doc__ or "") + "\n" + (init.__doc__ or "" if init is not object.__init__ else "")
        takes = init is not object.__init__ and _takes_parameters(init)
        args_ok = "Args:" in doc or (dataclasses.is_dataclass(obj) and "Attributes:" in doc)
        if takes and not args_ok:
            missing.append("Args:")
        if init is not object.__init__ and _raises(init) and "Raises:" not in doc:
            missing.append("Raises:")
        return missing
    doc = inspect.getdoc(obj) or ""
    if _takes_parameters(obj) and "Args:" not in doc:
        missing.append("Args:")
    if _returns_something(obj) and "Returns:" not in doc and "Yields:" not in doc:
        missing.append("Returns:")
    if _raises(obj) and "Raises:" not in doc:
        missing.append("Raises:")
    return missing


def test_every_public_entry_point_has_its_sections() -> None:
    points = entry_points()
    assert len(points) > 50  # the walk found the entry points (not an import that silently found none)
    gaps = {qual: m for qual, obj in sorted(points.items()) if (m := missing_sections(qual, obj))}
    assert not gaps, "docstring sections missing:\n" + "\n".join(f"  {q}: {', '.join(m)}" for q, m in gaps.items())


def test_the_rules_see_a_missing_section() -> None:
    """The check itself: each rule fires on a docstring without its section."""

    def documented(x: int) -> int:
        """Double.

        Args:
            x: a number.

        Returns:
            Twice ``x``.

        Raises:
            ValueError: when ``x`` is negative.
        """
        if x < 0:
            raise ValueError(x)
        return 2 * x

    def undocumented(x: int) -> int:
        """Double."""
        if x < 0:
            raise ValueError(x)
        return 2 * x

    def quiet(x: int) -> None:
        """Nothing to return, nothing raised.

        Args:
            x: ignored.
        """

    assert missing_sections("documented", documented) == []
    assert missing_sections("undocumented", undocumented) == ["Args:", "Returns:", "Raises:"]
    assert missing_sections("quiet", quiet) == []
