"""One tensor merged into its flat output by each kind of kernel: native CPU (:func:`merge_native`, with
importances :func:`merge_native_weighted`), compiled (:func:`merge_fused`), the method's streaming accumulator
(:func:`merge_streaming`) or its stacked ``combine`` (:func:`merge_stacked`). Each raises
:class:`~ram_live.errors.NonFiniteError` naming the culprit where a written value is NaN/Inf.
:func:`ram_live.engine.dispatch.merge_kernel` picks one."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from .. import functional as F
from ..methods import MergeMethod, TensorContext
from . import threads
from .compiling import build_key
from .stream import DeltaStream, nonfinite

__all__ = ["merge_native", "merge_native_weighted", "merge_fused", "merge_streaming", "merge_stacked"]


def merge_native(stream: DeltaStream, flat: Tensor, kernels: Any, lambdas: Tensor | None, eps: float,
                 workers: int, sign: bool = False) -> None:
    """The native RAM kernel over the stream's ranges, in threads (``sign``: RAM's ``shared="sign"``)."""
    def job(worker: int, n_workers: int) -> int:
        return threads.native_walk(stream, worker, n_workers, lambda start, end: kernels.merge(
            flat, stream.base, stream.tensors, lambdas, eps, start, end, sign=sign))

    if any(threads.in_native_workers(stream, workers, job)):
        stream.raise_nonfinite(0, stream.numel, flat)


def merge_native_weighted(stream: DeltaStream, flat: Tensor, kernels: Any, importances: list[Tensor],
                          lambdas: Tensor | None, eps: float, workers: int, sign: bool = False) -> None:
    """:func:`merge_native` with importances; the kernel counts invalid importances with the non-finite
    results, and either names its culprit."""
    def job(worker: int, n_workers: int) -> int:
        return threads.native_walk(stream, worker, n_workers, lambda start, end: kernels.merge_weighted(
            flat, stream.base, stream.tensors, importances, lambdas, eps, start, end, sign=sign))

    if any(threads.in_native_workers(stream, workers, job)):
        stream.validate_auxiliary()
        stream.raise_nonfinite(0, stream.numel, flat)


def merge_fused(stream: DeltaStream, flat: Tensor, lambdas: Tensor | None, eps: float,
                importances: list[Tensor] | None = None, sign: bool = False) -> None:
    """Each chunk merged by the compiled :func:`ram_live.functional.ram_fused_` (with ``importances``:
    :func:`~ram_live.functional.ram_fused_weighted_`) straight into ``flat`` (through a scratch chunk when
    ``flat`` lives on another device)."""
    bad = torch.zeros((), dtype=torch.int64, device=stream.device)
    scratch = None if flat.device == stream.device else torch.empty(
        min(stream.numel, stream.fused_chunk), dtype=flat.dtype, device=stream.device)
    kernel_fn = F.ram_fused_ if importances is None else F.ram_fused_weighted_
    for start, end, kernel, base, agents in stream.fused_chunks(kernel_fn, build_key(lambdas is not None, sign)):
        written = flat[start:end] if scratch is None else scratch[: end - start]
        if importances is None:
            kernel(written, base, agents, lambdas, eps, sign)
        else:
            kernel(written, base, agents, [h[start:end] for h in importances], lambdas, eps, sign)
        bad += nonfinite(written)
        if scratch is not None:
            flat[start:end].copy_(written)
    if bool(bad):
        stream.raise_nonfinite(0, stream.numel, flat)


def merge_streaming(stream: DeltaStream, flat: Tensor, make_accumulator: Callable[[], Any], workers: int) -> None:
    """One agent at a time per chunk into an accumulator (see :class:`ram_live.functional.RamAccumulator`)."""

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


def merge_stacked(stream: DeltaStream, flat: Tensor, method: MergeMethod, config: Any, state: Any,
                  run_state: Any) -> None:
    """The method's ``combine`` on ``[K, C]`` chunks; entries with τ* = 0 keep the base's exact bits."""
    bad = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start, base_f, deltas in stream:
        n = base_f.numel()
        aux = {name: torch.stack([h[start:start + n].to(deltas.device) for h in hs]).to(deltas.dtype)
               for name, hs in stream.auxiliary.items()} or None
        ctx = TensorContext(key=stream.key, agents=stream.agents, start=start, run_state=run_state, state=state,
                            auxiliary=aux)
        tau = method.combine(deltas, ctx, config)
        changed = tau != 0
        merged = tau.add_(base_f)
        written = flat[start : start + n]
        written.copy_(torch.where(changed, merged, base_f))
        bad += nonfinite(written)
    if bool(bad):
        stream.raise_nonfinite(0, stream.numel, flat)
