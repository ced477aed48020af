"""One tensor's task vectors, chunk by chunk (:class:`DeltaStream`), and the checks on them: non-finite values
named by input (the inputs' digest lives in :mod:`ram_live.engine.digest`).

For each tensor the engine reads the base and each agent (views of live tensors, or one memory-mapped tensor
from disk), and walks it in chunks: the agents' deltas of one chunk fill a float32 scratch ``[K, C]`` with
``K × C`` fixed, so extra memory depends neither on the model's size nor on the number of agents.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from .. import functional as F
from ..auxiliary import validate as validate_auxiliary
from ..errors import NonFiniteError
from ..types import Activity
from . import checks
from .compiling import compiled

__all__ = [
    "DEFAULT_CHUNK_NUMEL",
    "STREAM_CHUNK",
    "FUSED_CHUNK_MAX",
    "DeltaStream",
    "first_nonfinite",
    "nonfinite",
]

#: Elements of the ``[K, C]`` float32 scratch of stacking methods (4 MiB); C = DEFAULT_CHUNK_NUMEL // K.
DEFAULT_CHUNK_NUMEL = 1 << 20
#: Chunk length of the streaming (one agent at a time) path: small enough to stay in L2, and below torch's
#: intra-op grain (32768) so each op runs inline on its thread; chunks are shared by a few Python threads.
STREAM_CHUNK = 31 * 1024
#: Longest chunk of the compiled kernels: their float32 counts are exact below 2^24 entries per chunk.
FUSED_CHUNK_MAX = 1 << 23


class DeltaStream:
    """One tensor's task vectors, chunk by chunk: ``for start, base_f, deltas in stream: ...``.

    ``base_f`` is the base chunk in the compute dtype, ``deltas`` the ``[K, C]`` scratch with τ_t in row t
    (thresholded when ``activity`` is given). Both are reused between chunks: consume before advancing.
    """

    def __init__(
        self,
        key: str,
        base: Tensor,
        agents: Sequence[Tensor],
        agent_names: tuple[str, ...],
        device: torch.device,
        chunk_numel: int,
        activity: Activity | None = None,
        workspace: dict[Any, Tensor] | None = None,
        raw_hook: Callable[[Tensor], None] | None = None,
        compile: bool = False,
    ) -> None:
        self.key = key
        self.base = base.reshape(-1)
        self.tensors = [a.reshape(-1) for a in agents]
        self.agents = agent_names
        self.device = device
        self.numel = self.base.numel()
        self.dtype = F.compute_dtype(base.dtype, *(a.dtype for a in agents))
        k = len(agents)
        self.chunk = max(1, min(self.numel, chunk_numel // max(k, 1)))
        # CPU: cache-sized chunks shared by threads; accelerators: one stream, where small chunks are launch-bound
        self.stream_chunk = max(1, min(self.numel, chunk_numel, STREAM_CHUNK if device.type == "cpu" else chunk_numel))
        self._ws = workspace if workspace is not None else {}
        self.activity = activity
        self.raw_hook = raw_hook
        self.compile = compile
        self.chunk_numel = chunk_numel
        #: called with ``(start, stop)`` once the native kernels are done with those flat entries (set by the
        #: engine to release mapped pages range by range)
        self.range_done: Callable[[int, int], None] | None = None
        # the compiled kernels need no scratch: on accelerators, long chunks amortise each launch
        self.fused_chunk = max(1, min(chunk_numel if device.type == "cpu" else FUSED_CHUNK_MAX, FUSED_CHUNK_MAX))
        #: the method's per-agent auxiliary inputs of this tensor, ``{name: [flat tensor per agent]}``, and the
        #: method's check of their values (see :mod:`ram_live.auxiliary`)
        self.auxiliary: dict[str, list[Tensor]] = {}
        self.check_auxiliary: Any = None
        #: device merges: this tensor's slot of the pass's :class:`~ram_live.engine.checks.DeferredChecks` (a
        #: 0-d int64 device tensor the kernels add their invalid entries to), or None: check at once
        self.deferred: Tensor | None = None
        #: device statistics passes: the pass's running counts on this device (int64 ``[3K + 1]``: active, unique,
        #: histogram) that a device counter adds this tensor's counts to, where the tensor is counted
        self.totals: Tensor | None = None

    def invalid_slot(self) -> Tensor:
        """Where a device kernel adds the number of invalid entries it finds: :attr:`deferred`, else a fresh zero
        that :meth:`settle` reads."""
        if self.deferred is not None:
            return self.deferred
        return torch.zeros((), dtype=torch.int64, device=self.device)

    def settle(self, slot: Tensor, out: Tensor | None = None) -> None:
        """After a device kernel counted into ``slot``: nothing where the check is deferred to the end of the pass,
        else raise now naming the input at fault (auxiliary values first) where it counted any."""
        if slot is not self.deferred and bool(slot):
            self.validate_auxiliary()
            self.raise_nonfinite(0, self.numel, out)

    def auxiliary_rows(self, t: int, start: int, end: int, worker: int = 0) -> dict[str, Tensor]:
        """Agent ``t``'s auxiliary inputs over ``[start, end)`` in the compute dtype, one reused buffer per input
        and worker."""
        rows = {}
        for i, (name, tensors) in enumerate(self.auxiliary.items()):
            slot = ("aux", self.device, self.dtype, worker, i)
            if slot not in self._ws or self._ws[slot].numel() < end - start:
                self._ws[slot] = torch.empty(max(end - start, self.stream_chunk), dtype=self.dtype, device=self.device)
            rows[name] = self._ws[slot][: end - start].copy_(tensors[t][start:end])
        return rows

    def validate_auxiliary(self) -> None:
        """Raise naming agent and tensor where an auxiliary input holds a value the method refuses."""
        validate_auxiliary(self.key, self.agents, self.auxiliary, self.check_auxiliary)

    def __iter__(self) -> Iterator[tuple[int, Tensor, Tensor]]:
        k = len(self.tensors)
        slot = ("stacked", self.device, self.dtype, k)
        if slot not in self._ws or self._ws[slot].shape[1] < self.chunk:
            self._ws[slot] = torch.empty(k + 1, self.chunk, dtype=self.dtype, device=self.device)
        self._scratch = self._ws[slot]
        for start in range(0, self.numel, self.chunk):
            end = min(self.numel, start + self.chunk)
            n = end - start
            base_f = self._scratch[k, :n]
            base_chunk = self.base[start:end]
            base_f.copy_(base_chunk)
            deltas = self._scratch[:k, :n]
            agent_chunks = [a[start:end] for a in self.tensors]
            F.task_deltas_(deltas, base_f, agent_chunks)
            if not bool(torch.isfinite(deltas.sum())):
                self.raise_nonfinite(start, end)
            if self.raw_hook is not None:
                self.raw_hook(deltas)
            if self.activity is not None:
                self._apply_activity(self.activity, deltas, base_chunk, agent_chunks)
            yield start, base_f, deltas

    def streamed(self, worker: int = 0, workers: int = 1) -> Iterator[tuple[int, Tensor, Iterator[tuple[int, Tensor]]]]:
        """Chunks of ``stream_chunk`` elements as ``(start, base_f, agents)``, where ``agents`` yields
        ``(t, τ_t)`` one agent at a time through one reused buffer (thresholded when ``activity`` is set).
        ``worker``/``workers``: this worker's share of the chunks (every ``workers``-th), with its own buffers.
        NaN/Inf are not checked here: callers check what they accumulate."""
        chunk = self.stream_chunk
        slot = ("streamed", self.device, self.dtype, worker)
        if slot not in self._ws or self._ws[slot].shape[1] < chunk:
            self._ws[slot] = torch.empty(2, chunk, dtype=self.dtype, device=self.device)
        buffers = self._ws[slot]
        for start in range(worker * chunk, self.numel, chunk * workers):
            end = min(self.numel, start + chunk)
            base_f = buffers[0, : end - start]
            base_chunk = self.base[start:end]
            base_f.copy_(base_chunk)
            yield start, base_f, self._agent_deltas(start, end, base_f, base_chunk, buffers[1, : end - start])

    def _agent_deltas(
        self, start: int, end: int, base_f: Tensor, base_chunk: Tensor, row: Tensor
    ) -> Iterator[tuple[int, Tensor]]:
        for t, agent in enumerate(self.tensors):
            chunk = agent[start:end]
            row.copy_(chunk)
            row.sub_(base_f)
            if self.activity is not None:
                self._apply_activity(self.activity, row.unsqueeze(0), base_chunk, [chunk])
            yield t, row

    def _apply_activity(
        self, activity: Activity, deltas: Tensor, base_chunk: Tensor, agent_chunks: list[Tensor]
    ) -> None:
        if activity.rule == "abs":
            F.apply_activity_(deltas, activity.threshold_for(deltas.dtype))
            return
        # "changed": on exact deltas of same-dtype inputs, τ ≠ 0 iff the stored value changed; across dtypes,
        # compare in the narrower one (what a checkpoint stored in it would show).
        for row, agent in zip(deltas, agent_chunks):
            if agent.dtype != base_chunk.dtype:
                narrow = F.narrower_dtype(agent.dtype, base_chunk.dtype)
                same = agent.to(device=row.device, dtype=narrow) == base_chunk.to(device=row.device, dtype=narrow)
                row.masked_fill_(same, 0.0)

    def raise_nonfinite(
        self, start: int, end: int, out: Tensor | None = None, written: torch.dtype | None = None
    ) -> None:
        """Raise :class:`NonFiniteError` naming the first input of ``[start, end)`` that holds NaN/Inf, else the
        first task vector that overflows the compute dtype, else the first merged value in ``out`` (flat) that
        does not fit its dtype (without ``out``: a merged value overflows ``written``, the dtype it was written in,
        or the compute dtype)."""
        candidates = [("base", "the base", self.base)]
        candidates += [(n, f"agent {n!r}", a) for n, a in zip(self.agents, self.tensors)]
        for name, who, tensor in candidates:
            index = first_nonfinite(tensor[start:end])
            if index is not None:
                raise NonFiniteError(
                    f"tensor {self.key!r} of {who} holds {tensor[start + index].item()} at flat index {start + index}",
                    key=self.key,
                    agent=name,
                )
        base_f = self.base[start:end].to(self.dtype)
        for name, tensor in zip(self.agents, self.tensors):
            index = first_nonfinite(tensor[start:end].to(self.dtype) - base_f)
            if index is not None:
                raise NonFiniteError(
                    f"tensor {self.key!r}: the task vector of agent {name!r} overflows {self.dtype} at flat index "
                    f"{start + index} (agent and base values too far apart to subtract)",
                    key=self.key,
                    agent=name,
                )
        index = None if out is None else first_nonfinite(out[start:end])
        where = "" if index is None else f" at flat index {start + index}"
        raise NonFiniteError(
            f"tensor {self.key!r}: the merged value{where} overflows "
            f"{out.dtype if out is not None else written or self.dtype} "
            "(every input and task vector is finite: the method's scaling or sum leaves the dtype's range)",
            key=self.key,
        )

    def fused_eps(self, activity: Activity) -> float | None:
        """The threshold for the compiled kernels (0 for "changed" on same-dtype inputs, where it is τ ≠ 0), or
        None where they do not apply: not compiling, float64 compute, inputs on another device, or "changed"
        across dtypes."""
        if not self.compile or self.dtype != torch.float32 or any(t.device != self.base.device for t in self.tensors):
            return None
        if activity.rule == "changed" and any(t.dtype != self.base.dtype for t in self.tensors):
            return None
        return activity.threshold

    def device_eps(self, activity: Activity) -> float | None:
        """The threshold for the device kernels (0 for "changed" on same-dtype inputs, where it is τ ≠ 0), or None
        where they do not take this stream: not on an accelerator, float64 compute, inputs on several devices, or
        "changed" across dtypes (the CPU's paths run)."""
        if not checks.deferred_device(self.device) or self.dtype != torch.float32:
            return None
        if any(t.device != self.device for t in (self.base, *self.tensors)):
            return None
        if activity.rule == "changed" and any(t.dtype != self.base.dtype for t in self.tensors):
            return None
        return activity.threshold

    def fused_chunks(
        self, kernel: Callable[..., Any], key: Any = None
    ) -> Iterator[tuple[int, int, Any, Tensor, list[Tensor]]]:
        """``(start, end, compiled kernel, base chunk, agent chunks)`` over chunks of ``fused_chunk`` elements
        (views of the inputs); full chunks get the build of ``kernel`` specialised on their length."""
        chunk = self.fused_chunk
        key = (len(self.tensors), key)
        for start in range(0, self.numel, chunk):
            end = min(self.numel, start + chunk)
            yield (
                start,
                end,
                compiled(kernel, static=end - start == chunk, key=key),
                self.base[start:end],
                [t[start:end] for t in self.tensors],
            )

    def delta(self, index: int) -> Tensor:
        """Agent ``index``'s whole flat task vector (a new tensor)."""
        out = self.tensors[index].to(device=self.device, dtype=self.dtype, copy=True)
        return out.sub_(self.base.to(device=self.device))


def first_nonfinite(flat: Tensor) -> int | None:
    """The index of the first NaN/Inf in the 1-d ``flat``, or None."""
    bad = ~torch.isfinite(flat)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


def nonfinite(stored: Tensor) -> Tensor:
    """How many entries of ``stored`` are NaN/Inf, as a tensor (no sync): checked on the values as written, so
    that a float32 result beyond a narrower output dtype's range (float16: 65504) counts too."""
    return (~torch.isfinite(stored)).sum()
