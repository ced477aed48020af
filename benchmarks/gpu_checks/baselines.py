"""What the library's device merges are measured against in the same run: the obvious whole-tensor torch
implementations of RAM and TIES (:func:`plain_ram`, :func:`plain_ties`: a tensor at a time, float32, no chunks,
no checks), timed on the same inputs as x the copy floor. (mergekit's own ``ties`` / ``ram`` are not run here:
mergekit lives in an environment of its own, ``benchmarks/mergekit_env.sh``.)"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import bench_merge
from gpu_checks.runner import Outcome

__all__ = ["plain_ram", "plain_ties", "check_baseline"]


def plain_ram(base: Tensor, agents: list[Tensor]) -> Tensor:
    """RAM in fifteen lines: the mean over the agents that changed an entry, the base where none did."""
    b = base.float()
    deltas = torch.stack([a.float() - b for a in agents])
    count = (deltas != 0).sum(0)
    mean = deltas.sum(0) / count.clamp(min=1)
    return (b + mean).to(base.dtype)


def plain_ties(base: Tensor, agents: list[Tensor], density: float = 0.2) -> Tensor:
    """TIES in fifteen lines: each τ trimmed to its top-density magnitudes (``topk``), the sign of Σ τ elected, the
    mean of the agreeing entries."""
    b = base.float()
    deltas = torch.stack([a.float() - b for a in agents]).flatten(1)
    k = max(1, int(density * deltas.shape[1]))
    threshold = deltas.abs().topk(k, dim=1).values[:, -1:]
    deltas = deltas * (deltas.abs() >= threshold)
    sign = torch.where(deltas.sum(0) >= 0, 1.0, -1.0)
    agree = (deltas.sign() == sign) & (deltas != 0)
    mean = (deltas * agree).sum(0) / agree.sum(0).clamp(min=1)
    return (b + mean.view(base.shape)).to(base.dtype)


def _merge_all(setup: Any, fn: Any) -> dict[str, Tensor]:
    base = dict(setup.base.named_parameters())
    agents = [dict(a.named_parameters()) for a in setup.agents]
    with torch.no_grad():
        return {k: fn(p.detach(), [a[k].detach() for a in agents]) for k, p in base.items()}


def check_baseline(setup: Any, label: str, out: Outcome) -> None:
    """Time one baseline over the whole model (best of the setup's runs) as x the floor of the library's method
    with the same name (``RAM`` or ``TIES``), and its extra peak memory against the output."""
    fn = {"plain RAM": plain_ram, "plain TIES": plain_ties}[label]
    dev = setup.device
    if dev.type == "cuda":
        bench_merge.sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    _merge_all(setup, fn)
    bench_merge.sync(dev)
    extra = torch.cuda.max_memory_allocated(dev) - before if dev.type == "cuda" else None
    times, _, _ = bench_merge.timed(lambda: _merge_all(setup, fn), setup.reps, dev)
    floor = setup.floor_seconds("RAM" if "RAM" in label else "TIES")
    best = min(times)
    out.result.update(
        seconds=best,
        times=times,
        x_floor=best / floor if floor else None,
        extra_peak_bytes=extra,
        extra_over_output=None if extra is None else extra / setup.model_bytes,
    )
