"""Kernel time apart from wall time: one run under ``torch.profiler`` gives the GPU's busy time (the sum of its
kernels' and copies' device time) and the kernels by time, so that a merge that misses its target says whether the
GPU's work (the kernels) or the host (launches, Python, syncs: the wall time the GPU sat idle) missed it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["busy_time", "kernel_table", "verdict"]

#: Kernels listed per row (the slowest first).
TOP = 4


def kernel_table(events: Any) -> dict[str, Any]:
    """``{"kernel_s", "launches", "top": [[name, seconds, calls], ...]}`` from a profiler's ``key_averages()``:
    the device-side events (kernels, memcpy, memset) only."""
    rows = []
    for evt in events:
        if str(getattr(evt, "device_type", "")).split(".")[-1] != "CUDA":
            continue
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0.0)
        rows.append((evt.key, us / 1e6, int(evt.count)))
    rows.sort(key=lambda r: -r[1])
    return {
        "kernel_s": sum(r[1] for r in rows),
        "launches": sum(r[2] for r in rows),
        "top": [[name[:80], round(s, 6), n] for name, s, n in rows[:TOP]],
    }


def busy_time(fn: Callable[[], Any], device: torch.device) -> dict[str, Any] | None:
    """One run of ``fn`` under the profiler (CUDA activity): :func:`kernel_table` of it, or None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize(device)
    del out
    return kernel_table(prof.key_averages())


def verdict(wall_s: float, kernel_s: float | None, floor_s: float | None, target: float) -> str:
    """ "met" where the wall time is within ``target`` x the floor; else "kernel" where the GPU's busy time alone
    misses it (the kernels are too slow), "host" where the GPU's time fits and the wall time does not (launches and
    Python between them), "unknown" without a kernel time or a floor."""
    if floor_s is None:
        return "unknown"
    if wall_s <= target * floor_s:
        return "met"
    if kernel_s is None:
        return "unknown"
    return "kernel" if kernel_s > target * floor_s else "host"
