"""One tensor merged into its flat output by the method's eager paths: its streaming accumulator
(:func:`merge_streaming`) or its stacked ``combine`` (:func:`merge_stacked`); a method's fast paths bring their own
runners (:class:`~ram_live.methods.base.MethodKernels`). Each raises :class:`~ram_live.errors.NonFiniteError`
naming the culprit where a written value is NaN/Inf. :func:`ram_live.engine.dispatch.merge_kernel` picks one."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from ..methods.base import MergeMethod, TensorContext
from . import threads
from .stream import DeltaStream, nonfinite

__all__ = ["merge_streaming", "merge_stacked"]


def merge_streaming(stream: DeltaStream, flat: Tensor, make_accumulator: Callable[[], Any], workers: int) -> None:
    """One agent at a time per chunk into an accumulator (RAM's:
    :class:`ram_live.methods.ram.accumulators.RamAccumulator`)."""

    def job(worker: int, n_workers: int) -> Tensor:
        accumulator = make_accumulator()
        bad = torch.zeros((), dtype=torch.int64, device=flat.device)
        for start, base_f, agents in stream.streamed(worker, n_workers):
            n = base_f.numel()
            accumulator.begin(n)
            for t, delta in agents:
                if stream.auxiliary:
                    accumulator.add(t, delta, **stream.auxiliary_rows(t, start, start + n, worker))
                else:
                    accumulator.add(t, delta)
            flat[start : start + n].copy_(accumulator.merged(base_f))
            bad += nonfinite(flat[start : start + n])  # NaN/Inf in any input reaches the output; one sync per tensor
        return bad

    if any(bool(b) for b in threads.in_workers(stream, workers, job)):
        stream.raise_nonfinite(0, stream.numel, flat)


def merge_stacked(
    stream: DeltaStream, flat: Tensor, method: MergeMethod, config: Any, state: Any, run_state: Any
) -> None:
    """The method's ``combine`` on ``[K, C]`` chunks; entries with τ* = 0 keep the base's exact bits."""
    bad = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start, base_f, deltas in stream:
        n = base_f.numel()
        aux = {
            name: torch.stack([h[start : start + n].to(deltas.device) for h in hs]).to(deltas.dtype)
            for name, hs in stream.auxiliary.items()
        } or None
        ctx = TensorContext(
            key=stream.key, agents=stream.agents, start=start, run_state=run_state, state=state, auxiliary=aux
        )
        tau = method.combine(deltas, ctx, config)
        changed = tau != 0
        merged = tau.add_(base_f)
        written = flat[start : start + n]
        written.copy_(torch.where(changed, merged, base_f))
        bad += nonfinite(written)
    if bool(bad):
        stream.raise_nonfinite(0, stream.numel, flat)
