"""Progress reporting for long merges and searches: a tiny protocol, and terminal bars that need no extra
package."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

__all__ = ["ProgressHook", "SearchProgress", "TerminalProgress"]


class ProgressHook(Protocol):
    def start(self, stage: str, total: int, total_bytes: int) -> None:
        """A stage begins: ``total`` tensors, ``total_bytes`` bytes of inputs to read."""

    def update(self, key: str, nbytes: int) -> None:
        """One tensor done, ``nbytes`` bytes read."""

    def close(self) -> None:
        """The stage ended."""


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


class TerminalProgress:
    """``[merge] 120/291 tensors  1.2 GB/2.9 GB  410.3 MB/s  model.layers.9.mlp.up_proj.weight`` on stderr,
    redrawn at most ``fps`` times a second on a terminal; elsewhere (logs, CI) one line per stage."""

    def __init__(self, stream: TextIO | None = None, fps: float = 8.0) -> None:
        self.stream = stream or sys.stderr
        self.interval = 1.0 / fps
        self._last = 0.0
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())

    def start(self, stage: str, total: int, total_bytes: int) -> None:
        self.stage, self.total, self.total_bytes = stage, total, total_bytes
        self.done, self.bytes, self.t0 = 0, 0, time.perf_counter()

    def update(self, key: str, nbytes: int) -> None:
        self.done += 1
        self.bytes += nbytes
        now = time.perf_counter()
        if self.live and (now - self._last >= self.interval or self.done == self.total):
            self._last = now
            rate = self.bytes / max(now - self.t0, 1e-9)
            line = (
                f"[{self.stage}] {self.done}/{self.total} tensors  {_human(self.bytes)}/{_human(self.total_bytes)}"
                f"  {_human(rate)}/s  {key}"
            )
            self.stream.write("\r" + line[:200] + "\x1b[K")
            self.stream.flush()

    def close(self) -> None:
        elapsed = time.perf_counter() - self.t0
        rate = self.bytes / max(elapsed, 1e-9)
        line = (
            f"[{self.stage}] {self.done}/{self.total} tensors, {_human(self.bytes)} in {elapsed:.1f} s "
            f"({_human(rate)}/s)"
        )
        self.stream.write(("\r" + line + "\x1b[K" if self.live else line) + "\n")
        self.stream.flush()


class SearchProgress:
    """A search's line on stderr, redrawn as each candidate is scored, on a terminal only (elsewhere silent):
    ``[search] 12 scored  spent 4.31x/20x (388/1800 prompts)  best 0.583 (#N)  3.1 s/candidate  #N ...``.
    ``spent``: the budget used, in candidates, or in full evaluations' worth of prompts (and prompts) for a
    budget like ``"20x"``. ``live``: draw even when ``stream`` is not a terminal (None: only on a terminal)."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)()) if live is None else bool(live)

    def begin(self, budget: float, in_prompts: bool, prompts: int) -> None:
        """A search begins with ``budget`` (candidates, or full evaluations when ``in_prompts``), ``prompts``
        prompts an evaluation (0: not known)."""
        self.budget, self.in_prompts, self.prompts = budget, in_prompts, prompts
        self.count, self.t0, self.drawn = 0, time.perf_counter(), False

    def trial(self, index: int, label: str, spent: float, best: float | None, best_index: int | None) -> None:
        """Candidate ``index`` (``label``) scored; ``spent`` of the budget used; the best complete score so far."""
        self.count += 1
        if not self.live:
            return
        per = (time.perf_counter() - self.t0) / self.count
        if self.in_prompts:
            cost = f"spent {spent:.3g}x/{self.budget:g}x"
            if self.prompts:
                cost += f" ({round(spent * self.prompts)}/{round(self.budget * self.prompts)} prompts)"
        else:
            cost = f"spent {spent:g}/{self.budget:g} candidates"
        shown = "best -" if best is None else f"best {best:.4g} (#{best_index})"
        line = f"[search] {self.count} scored  {cost}  {shown}  {per:.3g} s/candidate  #{index} {label}"
        self.stream.write("\r" + line[:200] + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    def end(self) -> None:
        """The search ended: the line stays, with the time taken."""
        if self.live and self.drawn:
            self.stream.write(
                f"\r[search] {self.count} candidates scored in {time.perf_counter() - self.t0:.1f} s\x1b[K\n"
            )
            self.stream.flush()
