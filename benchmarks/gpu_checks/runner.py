"""Runs each check under a global time budget: every exception is caught (its traceback kept for the JSON), a
check that cannot start before the budget is spent is reported as skipped, and the script goes on. ``on_update``
is called before each check starts (its status "running") and after it ends, so that the report can be written
as it goes: a run stopped midway still says what passed and which check it was in."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RUNNING", "Outcome", "Runner", "Skip"]

STATUSES = ("pass", "fail", "error", "skipped")
#: A check's status while it runs (what a report written midway shows for the check a stop cut short).
RUNNING = "running"


class Skip(Exception):
    """Raised by a check that does not apply here (e.g. no CUDA device): reported as skipped with its reason."""


@dataclass
class Outcome:
    """One check's result. ``status``: "pass" (every exact / tolerance condition held), "fail" (one did not:
    ``problems`` says which), "error" (it raised: ``traceback``) or "skipped" (``reason``). ``targets``: speed and
    memory targets, reported apart (True / False, None where they do not apply, e.g. on CPU)."""

    name: str
    status: str = "pass"
    seconds: float = 0.0
    result: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    targets: dict[str, bool | None] = field(default_factory=dict)
    reason: str = ""
    traceback: str = ""

    def require(self, ok: bool, problem: str) -> bool:
        """Record ``problem`` (and fail the check) unless ``ok``; returns ``ok``."""
        if not ok:
            self.problems.append(problem)
        return ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "result": self.result,
            "problems": self.problems,
            "targets": self.targets,
            "reason": self.reason,
            "traceback": self.traceback,
        }


class Runner:
    """Runs checks in order while ``budget_s`` lasts (measured from construction)."""

    def __init__(self, budget_s: float, on_update: Callable[[Runner], None] | None = None) -> None:
        self.budget_s = budget_s
        self.t0 = time.perf_counter()
        self.outcomes: dict[str, Outcome] = {}
        self.on_update = on_update

    def _updated(self) -> None:
        if self.on_update is not None:
            self.on_update(self)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        """Seconds of the budget still to spend."""
        return self.budget_s - self.elapsed()

    def run(self, name: str, fn: Callable[[Outcome], None], needs_s: float = 0.0) -> Outcome:
        """Run ``fn(outcome)``; it fills ``outcome.result`` and calls ``outcome.require``. Skipped when fewer than
        ``needs_s`` seconds of the budget are left."""
        out = Outcome(name, status=RUNNING)
        self.outcomes[name] = out
        if self.left() < needs_s:
            out.status, out.reason = (
                "skipped",
                (
                    f"time budget: {self.left():.0f} s left of {self.budget_s:.0f} s, "
                    f"this check needs about {needs_s:.0f} s"
                ),
            )
            self._updated()
            return out
        self._updated()
        t0 = time.perf_counter()
        try:
            fn(out)
            out.status = "fail" if out.problems else "pass"
        except Skip as exc:
            out.status, out.reason = "skipped", str(exc)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # stopped: say where, then stop
                out.status, out.reason = "error", f"stopped during this check ({type(exc).__name__})"
                out.seconds = time.perf_counter() - t0
                self._updated()
                raise
            out.status, out.reason, out.traceback = "error", f"{type(exc).__name__}: {exc}", traceback.format_exc()
        out.seconds = time.perf_counter() - t0
        self._updated()
        return out

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for o in self.outcomes.values():
            counts[o.status] = counts.get(o.status, 0) + 1  # (RUNNING only while a check runs)
        return counts
