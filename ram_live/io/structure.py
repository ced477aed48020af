"""A module's structure copied as ``copy.deepcopy`` copies it, without deepcopy's generic walk of every module
(:func:`structure_copy`), and its state dict's tensors read without ``state_dict``'s (:func:`state_tensors`): a merge
that returns a new module does both per merge, and the generic walks over a transformer's hundreds of submodules
cost the host more than a GPU takes to merge the weights."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

from torch import Tensor, nn

__all__ = ["structure_copy", "state_tensors"]

_ATOMIC = frozenset((type(None), int, float, bool, str, bytes, complex, range))
_EMPTY_CONTAINERS = frozenset((dict, OrderedDict, set, list))
#: What nn.Module.__getstate__ leaves out of a copy.
_NOT_COPIED = "_compiled_call_impl"
_COPY_HOOKS = ("__deepcopy__", "__reduce_ex__", "__reduce__", "__getstate__", "__setstate__")
_OWN_COPY: dict[type, bool] = {}
#: ``nn.Module``'s own ``state_dict`` and what it calls, as imported: a class, a module object or a patch of
#: ``nn.Module`` itself that replaces one makes ``state_dict`` give something of its own.
_STATE_DICT, _SAVE, _EXTRA = nn.Module.state_dict, nn.Module._save_to_state_dict, nn.Module.get_extra_state


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


def state_tensors(module: nn.Module) -> tuple[dict[str, Tensor], frozenset[str]]:
    """``module.state_dict(keep_vars=True)``'s tensors, in its order (the parameters and buffers themselves), and
    which of those names are buffers (not a parameter's name). Read from the modules' own dicts where no module of
    the tree changes what ``state_dict`` gives (a class overriding it, ``_save_to_state_dict`` or
    ``get_extra_state``, a module object given its own, or a state-dict hook, as FSDP's): then through
    ``state_dict`` itself.

    Args:
        module: the module to read.

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> tensors, buffers = state_tensors(bn)
        >>> list(tensors) == list(bn.state_dict()) and sorted(buffers)
        ['num_batches_tracked', 'running_mean', 'running_var']
    """
    tensors: dict[str, Tensor] = {}
    buffers: set[str] = set()
    if _walk(module, "", tensors, buffers):
        return tensors, frozenset(buffers)
    tensors = {k: v for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, Tensor)}
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    return tensors, frozenset(k for k in tensors if k not in params)


def _walk(module: nn.Module, prefix: str, tensors: dict[str, Tensor], buffers: set[str]) -> bool:
    """``state_dict``'s order: a module's parameters, its persistent buffers, then its children (shared ones under
    every name); False at the first module whose state ``state_dict`` must produce."""
    cls, own = type(module), module.__dict__
    if (
        cls.state_dict is not _STATE_DICT
        or cls._save_to_state_dict is not _SAVE
        or cls.get_extra_state is not _EXTRA
        or "state_dict" in own
        or "_save_to_state_dict" in own
        or module._state_dict_hooks
        or own.get("_state_dict_pre_hooks")
    ):
        return False
    for name, param in module._parameters.items():
        if param is not None:
            tensors[prefix + name] = param
    skipped = module._non_persistent_buffers_set
    for name, buf in module._buffers.items():
        if buf is not None and name not in skipped:
            tensors[prefix + name] = buf
            buffers.add(prefix + name)
    for name, child in module._modules.items():
        if child is not None and not _walk(child, f"{prefix}{name}.", tensors, buffers):
            return False
    return True
