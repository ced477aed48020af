"""Progress reporting for long merges and searches: a tiny protocol, and reporters that need no extra package.

On a terminal a line is redrawn in place; elsewhere (a SLURM or Ray job's log, CI) progress is written as plain
lines at a modest rate (every few candidates or a quarter of the tensors, the next one done :data:`LOG_INTERVAL`
seconds or more after the last line, and the end) through :mod:`logging`, logger ``ram_live.progress`` at INFO, so
that it can be routed or silenced like any log: a level above INFO on that logger or on ``ram_live`` silences it
(the root's level does not: it is on by default); with no handler configured anywhere the lines go to stderr,
timestamped. A search says when it starts; the pace is checked as each candidate is scored, so a candidate slower
than the interval gives its line when it ends. Under ``torch.distributed`` only rank 0 reports (every rank of a
DDP job runs the same search, and their stderr usually shares one log): the others stay quiet unless given a
stream of their own.

>>> import logging
>>> logging.getLogger("ram_live.progress").setLevel(logging.WARNING)   # no progress lines   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Callable, Protocol, TextIO

__all__ = ["LOG_INTERVAL", "LOGGER", "ProgressHook", "SearchProgress", "TerminalProgress"]

#: Seconds after a progress line off a terminal from which the next step done writes another (also every few steps).
LOG_INTERVAL = 30.0
#: The logger progress lines off a terminal go through.
LOGGER = "ram_live.progress"

Clock = Callable[[], float]


class ProgressHook(Protocol):
    def start(self, stage: str, total: int, total_bytes: int) -> None:
        """A stage begins: ``total`` tensors, ``total_bytes`` bytes of inputs to read."""

    def update(self, key: str, nbytes: int) -> None:
        """One tensor done, ``nbytes`` bytes read."""

    def close(self) -> None:
        """The stage ended."""


class _Stderr(logging.Handler):
    """Where progress lines go when no logging handler is configured: the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # a closed stream: progress is never worth an error
            self.handleError(record)


_FALLBACK = _Stderr()
_FALLBACK.setFormatter(logging.Formatter("%(asctime)s ram_live %(message)s", "%Y-%m-%d %H:%M:%S"))


def _enabled(logger: logging.Logger) -> bool:
    """Whether INFO passes ``logger``: the level set on it or on a parent below the root (``ram_live``) decides;
    none set, INFO passes whatever the root's level (progress is on by default, the root's WARNING included)."""
    if logger.manager.disable >= logging.INFO:
        return False
    node: logging.Logger | None = logger
    while node is not None and node.parent is not None:  # the root is not asked
        if node.level != logging.NOTSET:
            return node.level <= logging.INFO
        node = node.parent if node.propagate else None
    return True


def log_line(message: str) -> None:
    """Write one progress line at INFO through the ``ram_live.progress`` logger (a level above INFO on it or on
    ``ram_live`` silences it; the root's level does not); with no handler configured (``logging.basicConfig`` not
    called, none added), on stderr."""
    logger = logging.getLogger(LOGGER)
    if not _enabled(logger):
        return
    record = logger.makeRecord(LOGGER, logging.INFO, __file__, 0, message, None, None)
    if logger.hasHandlers():
        logger.handle(record)  # the handlers up the hierarchy, each with its own level
    else:
        _FALLBACK.handle(record)


def _other_rank() -> bool:
    """Whether this process is a rank other than 0 of an initialized ``torch.distributed`` group (not imported here:
    a process that never loaded it has no group)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)
    except Exception:  # a backend that cannot say: report as a single process does
        return False


class _Pace:
    """When a plain line is due: the first step, every ``every`` steps, ``interval`` seconds since the last line."""

    def __init__(self, every: int, interval: float, clock: Clock) -> None:
        self.every, self.interval, self.clock = max(1, every), interval, clock
        self.last = -math.inf

    def due(self, count: int) -> bool:
        now = self.clock()
        if count == 1 or count % self.every == 0 or now - self.last >= self.interval:
            self.last = now
            return True
        return False


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _is_terminal(stream: TextIO) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class _Lines:
    """Where a reporter writes: ``stream`` redrawn in place on a terminal, plain lines into it, or through
    :func:`log_line` (``to_log``: no stream was given)."""

    stream: TextIO
    to_log: bool

    def _plain(self, line: str) -> None:
        if self.to_log:
            log_line(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def _redraw(self, line: str, end: str = "") -> None:
        self.stream.write("\r" + line + "\x1b[K" + end)
        self.stream.flush()


class TerminalProgress(_Lines):
    """``[merge] 120/291 tensors  1.2 GB/2.9 GB  410.3 MB/s  model.layers.9.mlp.up_proj.weight``: redrawn at most
    ``fps`` times a second on a terminal; elsewhere plain lines (each quarter of the tensors, every ``interval``
    seconds, and the stage's end): into ``stream`` when one is given, else through :func:`log_line` (rank 0 only
    under ``torch.distributed``).

    Args:
        stream: where to write (None: stderr, or the log off a terminal; nothing on a rank other than 0).
        fps: redraws a second on a terminal.
        interval: the most seconds between two plain lines.
        clock: the time source (``time.monotonic``), for tests.
    """

    def __init__(
        self, stream: TextIO | None = None, fps: float = 8.0, interval: float = LOG_INTERVAL, clock: Clock | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.to_log = stream is None
        self.interval = 1.0 / fps
        self.log_interval = interval
        self.clock = clock or time.monotonic
        self._last = 0.0
        self.live = _is_terminal(self.stream)

    def start(self, stage: str, total: int, total_bytes: int) -> None:
        self.stage, self.total, self.total_bytes = stage, total, total_bytes
        self.done, self.bytes, self.t0 = 0, 0, self.clock()
        self.pace = _Pace(math.ceil(total / 4) if total else 1, self.log_interval, self.clock)
        self.silent = self.to_log and _other_rank()

    def update(self, key: str, nbytes: int) -> None:
        self.done += 1
        self.bytes += nbytes
        if self.silent:
            return
        if self.live:
            now = self.clock()
            if now - self._last >= self.interval or self.done == self.total:
                self._last = now
                self._redraw(self._line(key, now)[:200])
        elif self.done < self.total and self.pace.due(self.done):  # the last one: close() says it
            self._plain(self._line(key, self.clock()))

    def _line(self, key: str, now: float) -> str:
        rate = self.bytes / max(now - self.t0, 1e-9)
        return (
            f"[{self.stage}] {self.done}/{self.total} tensors  {_human(self.bytes)}/{_human(self.total_bytes)}"
            f"  {_human(rate)}/s  {key}"
        )

    def close(self) -> None:
        if getattr(self, "silent", False):
            return
        elapsed = self.clock() - self.t0
        rate = self.bytes / max(elapsed, 1e-9)
        line = (
            f"[{self.stage}] {self.done}/{self.total} tensors, {_human(self.bytes)} in {elapsed:.1f} s "
            f"({_human(rate)}/s)"
        )
        if self.live:
            self._redraw(line, "\n")
        else:
            self._plain(line)


class SearchProgress(_Lines):
    """A search's progress: ``[search] 12 scored  spent 4.31x/20x (388/1800 prompts)  best 0.583 (#N)  3.1
    s/candidate  #N ...``. ``spent``: the budget used, in candidates, or in full evaluations' worth of prompts (and
    prompts) for a budget like ``"20x"``. On a terminal the line is redrawn as each candidate is scored; elsewhere
    it is written as plain lines at a modest rate (the start, the first candidate, every ``every`` candidates, the
    first candidate scored ``interval`` seconds or more after the last line, and the end with the time taken): into
    ``stream`` when one is given, else through :func:`log_line` (logger ``ram_live.progress``; rank 0 only under
    ``torch.distributed``).

    Args:
        stream: where to write (None: stderr on a terminal, else the log; nothing on a rank other than 0).
        live: True: redraw the line on ``stream`` whatever it is; False: plain lines even on a terminal; None
            (default): redraw on a terminal only.
        every: a plain line every this many candidates (None: a tenth of a budget in candidates, at least 5).
        interval: the most seconds between two plain lines.
        clock: the time source (``time.monotonic``), for tests.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        live: bool | None = None,
        every: int | None = None,
        interval: float = LOG_INTERVAL,
        clock: Clock | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.to_log = stream is None
        self.live = _is_terminal(self.stream) if live is None else bool(live)
        self.every, self.interval = every, interval
        self.clock = clock or time.monotonic

    def begin(self, budget: float, in_prompts: bool, prompts: int) -> None:
        """A search begins with ``budget`` (candidates, or full evaluations when ``in_prompts``), ``prompts``
        prompts an evaluation (0: not known)."""
        self.budget, self.in_prompts, self.prompts = budget, in_prompts, prompts
        self.count, self.t0, self.drawn = 0, self.clock(), False
        every = self.every if self.every is not None else max(5, math.ceil(budget / 10))
        self.pace = _Pace(every, self.interval, self.clock)
        self.best: str = "best -"
        self.silent = self.to_log and _other_rank()
        if not self.live and not self.silent:  # a job's log shows the search began, before its first candidate
            unit = f"{budget:g}x" + (f" ({round(budget * prompts)} prompts)" if prompts else "")
            self._plain(f"[search] started: budget {unit if in_prompts else f'{budget:g} candidates'}")

    def trial(self, index: int, label: str, spent: float, best: float | None, best_index: int | None) -> None:
        """Candidate ``index`` (``label``) scored; ``spent`` of the budget used; the best complete score so far."""
        self.count += 1
        self.best = "best -" if best is None else f"best {best:.4g} (#{best_index})"
        if self.silent or not self.live and not self.pace.due(self.count):
            return
        per = (self.clock() - self.t0) / self.count
        if self.in_prompts:
            cost = f"spent {spent:.3g}x/{self.budget:g}x"
            if self.prompts:
                cost += f" ({round(spent * self.prompts)}/{round(self.budget * self.prompts)} prompts)"
        else:
            cost = f"spent {spent:g}/{self.budget:g} candidates"
        line = f"[search] {self.count} scored  {cost}  {self.best}  {per:.3g} s/candidate  #{index} {label}"
        if self.live:
            self._redraw(line[:200])
            self.drawn = True
        else:
            self._plain(line[:300])

    def end(self) -> None:
        """The search ended: the line stays (a last plain line off a terminal), with the time taken."""
        summary = f"[search] {self.count} candidates scored in {self.clock() - self.t0:.1f} s"
        if self.silent:
            return
        if self.live and self.drawn:
            self._redraw(summary, "\n")
        elif not self.live:
            self._plain(f"{summary}, {self.best}")
