"""Calling a device op (a ``torch.library`` custom op) per tensor (:func:`call_op`): in eager mode its
implementation is called directly, without the dispatcher's few tens of µs per call (which would cost a merge of
a 1.5 B model more host time than the GPU's own); wherever something must see the op as one op (torch.compile,
a tracer, FakeTensor or another dispatch or function mode, functorch, tensor subclasses such as FSDP's DTensor, an
autograd graph) it goes through the dispatcher as before."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["call_op", "dispatch_needed"]

_PLAIN = (Tensor, nn.Parameter)
#: torch's private checks of the modes and transforms on; a torch without one of them always dispatches.
_MODE_CHECKS = tuple(
    getattr(torch._C, name, None)
    for name in ("_len_torch_dispatch_stack", "_len_torch_function_stack", "_are_functorch_transforms_active")
)
_CHECKABLE = all(check is not None for check in _MODE_CHECKS)


def dispatch_needed(args: tuple[Any, ...]) -> bool:
    """Whether a call with ``args`` must go through torch's dispatcher: compiling or tracing, a dispatch or
    function mode on (FakeTensorMode, a profiler's or a checker's mode), functorch transforms, a tensor that is
    not a plain tensor (a subclass: DTensor, FakeTensor), or one that autograd records.

    Example:
        >>> dispatch_needed((torch.zeros(2), [torch.ones(2)], 1.0))
        False
    """
    if torch.compiler.is_compiling():  # first: torch.compile traces this function and must not look further
        return True
    if not _CHECKABLE or any(check() for check in _MODE_CHECKS):
        return True
    grad = torch.is_grad_enabled()
    for arg in args:
        for t in arg if isinstance(arg, (list, tuple)) else (arg,):
            if isinstance(t, Tensor) and (type(t) not in _PLAIN or (grad and t.requires_grad)):
                return True
    return False


@functools.cache
def _mutated(op: Any) -> tuple[int, ...]:
    """The positions of the arguments ``op`` writes (its schema's ``Tensor(a!)``)."""
    schema = op._opoverload._schema
    return tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)


def call_op(op: Any, *args: Any) -> None:
    """``op(*args)`` for a custom op (a ``torch.library.custom_op``) that returns nothing: its implementation
    called directly where :func:`dispatch_needed` says the dispatcher is not needed (the tensors it writes get
    their version counters bumped, as the dispatcher bumps them), else through the dispatcher.

    Args:
        op: the ``CustomOpDef`` that ``torch.library.custom_op`` returned.
        *args: its arguments, positionally.

    Example:
        >>> from ram_live.kernels.device import linear          # doctest: +SKIP
        >>> call_op(linear.linear_merge_, out, base, agents, weights, 1.0, [], [], invalid)  # doctest: +SKIP
    """
    impl = getattr(op, "_init_fn", None) if hasattr(op, "_opoverload") else None
    if (
        impl is None
        or any(key is not None for key in getattr(op, "_backend_fns", {None: impl}))
        or dispatch_needed(args)
    ):
        op(*args)
        return
    impl(*args)
    for i in _mutated(op):
        torch.autograd.graph.increment_version(args[i])  # a tensor, or a list of them
