"""A merge is auxiliary to the run it watches: once training has started, a snapshot, merge, evaluation, search or
save that fails is a :class:`~ram_live.errors.MergeFailedWarning` and a count (``ram/errors``), and the next
merge tries again (``on_error="warn"``, the default); ``on_error="raise"`` fails fast. Under ``torch.distributed``
the ranks agree on each failure (:func:`agreeing`), so no rank is left waiting in a collective the others left.

>>> with schedule.guard("RAMCallback('coder')", "merge", step) as outcome:          # doctest: +SKIP
...     callback.merge_now(trainer, module)
>>> outcome.failed                                                                   # doctest: +SKIP
False
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError, MergeFailedWarning
from ..io.distributed import RemoteRankError
from ..option_checks import shown

__all__ = ["ON_ERROR", "Outcome", "agreeing", "check_on_error", "error_line", "guarded"]

#: the values of the callbacks' ``on_error`` option (RAMSchedule's, verl's ``ram.on_error``); the first is the default
ON_ERROR = ("warn", "raise")


def check_on_error(value: Any, where: str = "on_error") -> str:
    """The ``on_error`` option, checked.

    Args:
        value: ``"warn"`` or ``"raise"``.
        where: the option's name as the user spells it (``ram.on_error`` in verl).

    Returns:
        ``value``.

    Raises:
        ConfigError: any other value.
    """
    if not isinstance(value, str) or value not in ON_ERROR:
        raise ConfigError(
            f"{where} must be 'warn' (a failing merge after training started is a warning and a count, training "
            f"goes on) or 'raise' (it ends training), got {shown(value)}"
        )
    return value


def error_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of an exception on one line, cut at ``limit`` characters."""
    flat = " ".join(str(exc).split())
    flat = flat if len(flat) <= limit else flat[: limit - 3] + "..."
    return f"{type(exc).__name__}: {flat}" if flat else type(exc).__name__


#: what :func:`agreeing` sums besides the failure flag: nothing
_NOTHING = torch.zeros(0, dtype=torch.float64)


@contextlib.contextmanager
def agreeing(collective: Any, what: str) -> Iterator[None]:
    """Every rank leaves the block together, failed or not: a failure on one rank is raised on every rank (its own
    error where it happened, :class:`~ram_live.io.distributed.RemoteRankError` on the others). One all-reduce of
    one integer after the block (which also orders the ranks as a barrier would); nothing in one process.

    Args:
        collective: the ranks' :class:`~ram_live.store.Collective`.
        what: what the block does, named in the other ranks' error (``"writing the snapshot of step 4"``).

    Raises:
        RemoteRankError: the block raised on another rank.
    """
    if collective.world_size <= 1:
        yield
        return
    try:
        yield
    except Exception as exc:
        agreed_sum(collective, _NOTHING, exc, what)  # raises exc
        raise
    agreed_sum(collective, _NOTHING, None, what)


def agreed_sum(collective: Any, values: torch.Tensor, failure: BaseException | None, what: str) -> torch.Tensor:
    """``values`` summed over the ranks, with each rank's failure: raised on every rank when any rank failed (its own
    error there, :class:`RemoteRankError` elsewhere). ``values`` (float64) may hold anything on a failed rank.

    Raises:
        RemoteRankError: another rank failed (``what`` names what it did).
    """
    values = torch.zeros_like(values, dtype=torch.float64) if failure is not None else values.double()
    packed = torch.cat([values, torch.tensor([1.0 if failure is not None else 0.0], dtype=torch.float64)])
    total = collective.all_reduce_sum_(packed)
    if failure is not None:
        raise failure
    if float(total[-1]) > 0:
        raise RemoteRankError(f"rank {collective.rank}: another rank failed {what} (its error is raised there)")
    return total[:-1]


@dataclass
class Outcome:
    """What a :func:`guarded` block came to: ``failed`` and the error's one line (``error``)."""

    failed: bool = False
    error: str | None = None


@contextlib.contextmanager
def guarded(schedule: Any, owner: str, what: str, step: int) -> Iterator[Outcome]:
    """Run the block; under ``schedule.on_error == "warn"`` an ``Exception`` it raises (not ``KeyboardInterrupt`` or
    ``SystemExit``) becomes one :class:`~ram_live.errors.MergeFailedWarning` naming ``owner`` (its agent), ``what``
    failed, the step and the error's one line, ``schedule.errors`` counts it, and the block's :class:`Outcome`
    says so; CUDA's out-of-memory frees the cached memory first. Under ``"raise"`` the error propagates.

    Args:
        schedule: the :class:`~ram_live.RAMSchedule` (its ``on_error``, ``errors``, ``last_error``, ``collective``).
        owner: the callback, e.g. ``RAMCallback('coder')``.
        what: ``"snapshot"``, ``"merge"``, ...: the failed job as the warning names it.
        step: the training step.

    Yields:
        The block's :class:`Outcome`.

    Warns:
        MergeFailedWarning: the block failed (on rank 0, and on every rank whose own error it was).
    """
    outcome = Outcome()
    if schedule.on_error == "raise":
        yield outcome
        return
    try:
        yield outcome
    except Exception as exc:
        line = error_line(exc)
        own = not isinstance(exc, RemoteRankError)
        oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
        exc.__traceback__ = None  # its frames hold the merge's tensors: let them go before warning
        del exc
        if oom:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        schedule.errors += 1
        schedule.last_error = {"step": int(step), "what": what, "error": line}
        outcome.failed, outcome.error = True, line
        if own or schedule.collective.rank == 0:
            warnings.warn(
                MergeFailedWarning(
                    f"{owner}: the {what} at step {step} failed ({line}); training goes on and the next merge tries "
                    f"again (ram/errors = {schedule.errors}; on_error='raise' ends training instead)",
                    step=int(step),
                    agent=getattr(schedule, "agent", None),
                    what=what,
                    error=line,
                ),
                stacklevel=3,
            )
