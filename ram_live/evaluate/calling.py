"""Calling the reward functions as TRL's ``GRPOTrainer._calculate_rewards`` does.

Each function gets ``prompts``, ``completions``, ``completion_ids``, every other prompt column as a keyword list,
and TRL's extras: ``trainer_state`` (``Rewards.trainer_state``, None unless set: there is no trainer at
evaluation), ``log_extra(column, values)`` and ``log_metric(name, value)`` (accepted and dropped). A function
without ``**kwargs`` gets only the arguments it names. Synchronous functions run first, in order; ``async def``
functions (or callables whose ``__call__`` is async) then run concurrently with ``asyncio.gather``, as TRL runs
them; a function that returns an awaitable is awaited with them. A function that raises (``asyncio.CancelledError``
too) is an :class:`~ram_live.errors.EvaluationError` naming it, the cause chained.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from ..errors import EvaluationError
from .checks import one_line, reward_list

__all__ = ["Batch", "call_rewards", "is_async_callable", "accepted", "FAILURES"]

#: What a user's function may raise that becomes an :class:`EvaluationError`: any exception, and
#: ``asyncio.CancelledError`` (a ``BaseException``: an async reward, or a client inside one, that cancels itself);
#: ``KeyboardInterrupt`` and ``SystemExit`` pass through.
FAILURES = (Exception, asyncio.CancelledError)


@dataclass
class Batch:
    """What the reward functions are called on: one row per completion (prompt-major, k per prompt).

    ``prompt_of[j]``/``sample_of[j]``: row ``j``'s prompt index (in the whole prompt set) and sample number."""

    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]] | None
    columns: dict[str, list[Any]]
    prompt_of: list[int]
    sample_of: list[int]
    samples: int = 1
    trainer_state: Any = None

    def kwargs(self, rows: Sequence[int]) -> dict[str, Any]:
        ids = self.completion_ids
        return {
            "prompts": [self.prompts[j] for j in rows],
            "completions": [self.completions[j] for j in rows],
            "completion_ids": None if ids is None else [ids[j] for j in rows],
            **{k: [v[j] for j in rows] for k, v in self.columns.items()},
            "trainer_state": self.trainer_state,
            "log_extra": _dropped,
            "log_metric": _dropped,
        }

    def where(self, j: int) -> tuple[int, str]:
        """Row ``j``'s prompt index and how messages name it."""
        i = self.prompt_of[j]
        return i, f"prompt {i}" + (f" (sample {self.sample_of[j]})" if self.samples > 1 else "")


def _dropped(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra`` / ``log_metric``: nothing is logged at evaluation."""


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine: an ``async def`` (through ``functools.partial``) or a callable
    whose ``__call__`` is one (TRL's rule)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` as ``fn`` takes them: all of them with ``**kwargs``, else the ones it names."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in names}


def call_rewards(funcs: Sequence[Callable[..., Any]], names: Sequence[str], batch: Batch) -> list[list[float | None]]:
    """Every function's rewards on every row of ``batch`` (one list per function), checked.

    Raises:
        EvaluationError: a function raised (naming it and the first row that raises on its own) or returned
            something that is not one finite number (or None) per row."""
    n = len(batch.completions)
    rows = list(range(n))
    outs: list[Any] = [None] * len(funcs)
    errors: dict[int, BaseException] = {}
    pending: dict[int, Awaitable[Any]] = {}
    for f, fn in enumerate(funcs):
        if is_async_callable(fn):
            continue
        try:
            out = fn(**accepted(fn, batch.kwargs(rows)))
        except FAILURES as exc:
            errors[f] = exc
            continue
        if inspect.isawaitable(out):
            pending[f] = out
        else:
            outs[f] = out
    for f, fn in enumerate(funcs):
        if is_async_callable(fn):
            try:
                pending[f] = fn(**accepted(fn, batch.kwargs(rows)))
            except FAILURES as exc:  # raised before its coroutine was made
                errors[f] = exc
    if pending:
        for f, result in zip(pending, _gather(list(pending.values()))):
            if isinstance(result, BaseException):
                errors[f] = result
            else:
                outs[f] = result
    table = []
    for f, fn in enumerate(funcs):
        if f in errors:
            _raise(fn, names[f], batch, errors[f])
        table.append(
            reward_list(
                outs[f], names[f], n, where=batch.where, unit="prompts" if batch.samples == 1 else "completions"
            )
        )
    return table


def _raise(fn: Callable[..., Any], name: str, batch: Batch, exc: BaseException) -> None:
    j = _first_failing(fn, batch)
    if j is None:
        index, where = None, f"prompts {min(batch.prompt_of)}..{max(batch.prompt_of)}"
    else:
        index, where = batch.where(j)
    detail = one_line(exc)
    raise EvaluationError(
        f"reward function {name!r} raised {type(exc).__name__} on {where}" + (f": {detail}" if detail else ""),
        function=name,
        index=index,
    ) from exc


def _first_failing(fn: Callable[..., Any], batch: Batch) -> int | None:
    """The first row whose call raises on its own (None if none does)."""
    for j in range(len(batch.completions)):
        try:
            out = fn(**accepted(fn, batch.kwargs([j])))
            if inspect.isawaitable(out):
                (result,) = _gather([out])
                if isinstance(result, BaseException):
                    raise result
        except FAILURES:
            return j
    return None


def _gather(awaitables: list[Awaitable[Any]]) -> list[Any]:
    """Run ``awaitables`` concurrently to completion; each one's result or exception. Inside a running event
    loop (a notebook, an async trainer) they run on a fresh loop in a worker thread."""

    async def main() -> list[Any]:
        return await asyncio.gather(*awaitables, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()
