"""A module's structure copied as ``copy.deepcopy`` copies it, without deepcopy's generic walk of every module
(:func:`structure_copy`): a merge that returns a new module builds one per merge, and deepcopy's reduce and
reconstruct of each of a transformer's hundreds of submodules costs the host more than a GPU takes to merge the
weights."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from torch import nn

__all__ = ["structure_copy"]

_ATOMIC = frozenset((type(None), int, float, bool, str, bytes, complex, range))
_EMPTY_CONTAINERS = frozenset((dict, OrderedDict, set, list))
#: What nn.Module.__getstate__ leaves out of a copy.
_NOT_COPIED = "_compiled_call_impl"
_COPY_HOOKS = ("__deepcopy__", "__reduce_ex__", "__reduce__", "__getstate__", "__setstate__")
_OWN_COPY: dict[type, bool] = {}


def structure_copy(module: nn.Module, memo: dict[int, Any] | None = None) -> nn.Module:
    """``copy.deepcopy(module, memo)``, the same result: every submodule a new object of its class with its
    ``__dict__`` copied (parameters and buffers through ``memo``, as deepcopy takes them; shared submodules,
    parameters and other values stay shared once), every other value deep-copied with the same ``memo``. A module
    whose class customises its copy (``__deepcopy__``, ``__reduce_ex__``, ``__getstate__``, ...) is deep-copied.

    Args:
        module: the module to copy.
        memo: deepcopy's memo, e.g. ``{id(param): new_param}`` to give the copy fresh parameters.

    Example:
        >>> lin = nn.Linear(2, 2)
        >>> twin = structure_copy(lin, {id(lin.weight): nn.Parameter(lin.weight.detach().clone())})
        >>> twin is not lin and twin.bias is not lin.bias and twin.bias.equal(lin.bias)
        True
    """
    return _copy(module, {} if memo is None else memo)


def _own_copy(cls: type) -> bool:
    """Whether ``cls`` customises copying below :class:`nn.Module` (deepcopy must run its hooks)."""
    own = _OWN_COPY.get(cls)
    if own is None:
        own = _OWN_COPY[cls] = any(
            name in vars(klass) for klass in cls.__mro__ if klass not in (nn.Module, object) for name in _COPY_HOOKS
        )
    return own


def _copy(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    done = memo.get(id(module))
    if done is not None:
        return done
    cls = type(module)
    if _own_copy(cls):
        return copy.deepcopy(module, memo)
    new = cls.__new__(cls)
    memo[id(module)] = new
    memo.setdefault(id(memo), []).append(module)  # as deepcopy keeps them: ids in memo stay valid while it lives
    state = module.__dict__
    out = state.copy()  # atomic values stay as they are
    for name, value in state.items():
        kind = type(value)  # not isinstance: some configs answer attribute reads (``__class__``) slowly
        if kind in _ATOMIC:
            continue
        if kind in _EMPTY_CONTAINERS and not value:
            out[name] = kind()
        elif name == "_modules":
            out[name] = kind((k, None if m is None else _copy(m, memo)) for k, m in value.items())
        elif name == "_parameters" or name == "_buffers":
            out[name] = kind((k, None if t is None else copy.deepcopy(t, memo)) for k, t in value.items())
        else:
            out[name] = copy.deepcopy(value, memo)
    out.pop(_NOT_COPIED, None)
    new.__dict__.update(out)  # nn.Module.__setstate__'s update (its defaults are there: a live module's state)
    return new
