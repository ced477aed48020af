"""Progress reporting for long merges: a tiny protocol, and a terminal bar that needs no extra package."""

from __future__ import annotations

import sys
import time
from typing import Protocol, TextIO

__all__ = ["ProgressHook", "TerminalProgress"]


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
