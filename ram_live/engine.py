"""The streaming executor: validate, (pass 1) gather statistics, (pass 2) merge tensor by tensor, chunk by chunk;
RAM+ with global ρ into memory reads the inputs once instead (:func:`_single_read_pass`).

For each tensor the engine reads the base and each agent (views of live tensors, or one memory-mapped tensor
from disk), and walks it in chunks: the agents' deltas of one chunk fill a float32 scratch ``[K, C]`` with
``K × C`` fixed, so extra memory depends neither on the model's size nor on the number of agents. The method's
stateless ``combine`` turns the chunk into τ*, which is added to the base and written in the base's dtype.
Entries with τ* = 0 keep the base's exact bits.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import shutil
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from . import _cc, _ram_native, memory
from . import functional as F
from .errors import ConfigError, InputMismatchError, NoAgentsError, NonFiniteError
from .methods import RAM_VARIANTS, Activity, MergeMethod, RamStatistics, RunContext, TensorContext, lambda_bound
from .distributed import Distributed, RemoteRankError
from .auxiliary import AuxiliaryInputs, resolve as resolve_auxiliary, validate as validate_auxiliary
from . import _importance_native
from .progress import ProgressHook
from .sinks import Sink
from .sources import TensorSource
from .types import MergeInfo, Plan, TensorSpec

__all__ = ["Plan", "build_plan", "DeltaStream", "MergeInfo", "run_merge", "DEFAULT_CHUNK_NUMEL"]

#: Elements of the ``[K, C]`` float32 scratch of stacking methods (4 MiB); C = DEFAULT_CHUNK_NUMEL // K.
DEFAULT_CHUNK_NUMEL = 1 << 20
#: Chunk length of the streaming (one agent at a time) path: small enough to stay in L2, and below torch's
#: intra-op grain (32768) so each op runs inline on its thread; chunks are shared by a few Python threads.
STREAM_CHUNK = 31 * 1024
#: ``compile="auto"`` compiles merges of at least this many agent-entries (Σ numel × K): compiling costs
#: seconds (a warm cache) to tens of seconds (cold) once per process, the eager path ~2 ns per agent-entry on CPU.
COMPILE_AUTO_MIN = 4 << 30
#: Entries per call of the native CPU kernels (threads take every ``workers``-th range of a tensor).
NATIVE_CHUNK = 1 << 18
#: Longest chunk of the compiled kernels: their float32 counts are exact below 2^24 entries per chunk.
FUSED_CHUNK_MAX = 1 << 23


# ----------------------------------------------------------------------------------------------- the plan


def build_plan(base: TensorSource, agents: Sequence[TensorSource]) -> Plan:
    """Check key sets, shapes and dtypes (nothing is read) and decide what happens to each key."""
    if not agents:
        raise NoAgentsError("no agents to merge: pass at least one model in `models`")
    base_keys = base.keys()
    base_set = set(base_keys)
    aliases = base.aliases()
    for agent in agents:
        agent_set = set(agent.keys())
        tied = agent.aliases()
        # a tied name one side leaves out (save_pretrained does) is the tensor it is tied to
        missing = [k for k in base_keys if k not in agent_set and aliases.get(k) not in agent_set]
        extra = sorted(k for k in agent_set - base_set if tied.get(k) not in base_set)
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {len(missing)} key(s) of the base, e.g. {missing[:5]}")
            if extra:
                parts.append(f"{len(extra)} key(s) the base lacks, e.g. {extra[:5]}")
            raise InputMismatchError(
                f"agent {agent.name!r} does not match the base {base.name!r}: {'; '.join(parts)} "
                "(is the base of another architecture?)",
                key=(missing or extra)[0],
                agent=agent.name,
            )
    buffers = {k for k in base_keys if base.spec(k).is_buffer}
    for agent in agents:
        buffers |= {k for k in base_keys if k not in aliases and agent.spec(k).is_buffer}
    merge, copy, check = [], [], []
    for key in base_keys:
        if key in aliases:
            continue
        b = base.spec(key)
        for agent in agents:
            a = agent.spec(key)
            if a.shape != b.shape:
                raise InputMismatchError(
                    f"tensor {key!r}: agent {agent.name!r} has shape {list(a.shape)}, the base {list(b.shape)}",
                    key=key, agent=agent.name,
                )
            if a.dtype.is_floating_point != b.dtype.is_floating_point or (
                not b.dtype.is_floating_point and a.dtype != b.dtype
            ):
                raise InputMismatchError(
                    f"tensor {key!r}: agent {agent.name!r} has dtype {a.dtype}, the base {b.dtype}",
                    key=key, agent=agent.name,
                )
        if key in buffers or not b.dtype.is_floating_point:
            copy.append(key)
            if key not in buffers:
                check.append(key)
        else:
            merge.append(key)
    return Plan(tuple(merge), tuple(copy), {k: v for k, v in aliases.items()}, tuple(check))


# ----------------------------------------------------------------------------------------------- deltas


def _compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _narrower(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return a if torch.finfo(a).bits < torch.finfo(b).bits or (
        torch.finfo(a).bits == torch.finfo(b).bits and torch.finfo(a).eps > torch.finfo(b).eps
    ) else b


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
        self.dtype = _compute_dtype(base.dtype, *(a.dtype for a in agents))
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
                self._raise_nonfinite(start, end)
            if self.raw_hook is not None:
                self.raw_hook(deltas)
            if self.activity is not None:
                self._apply_activity(deltas, base_chunk, agent_chunks)
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

    def _agent_deltas(self, start: int, end: int, base_f: Tensor, base_chunk: Tensor,
                      row: Tensor) -> Iterator[tuple[int, Tensor]]:
        for t, agent in enumerate(self.tensors):
            chunk = agent[start:end]
            row.copy_(chunk)
            row.sub_(base_f)
            if self.activity is not None:
                self._apply_activity(row.unsqueeze(0), base_chunk, [chunk])
            yield t, row

    def _apply_activity(self, deltas: Tensor, base_chunk: Tensor, agent_chunks: list[Tensor]) -> None:
        assert self.activity is not None
        if self.activity.rule == "abs":
            F.apply_activity_(deltas, self.activity.threshold_for(deltas.dtype))
            return
        # "changed": on exact deltas of same-dtype inputs, τ ≠ 0 iff the stored value changed; across dtypes,
        # compare in the narrower one (what a checkpoint stored in it would show).
        for row, agent in zip(deltas, agent_chunks):
            if agent.dtype != base_chunk.dtype:
                narrow = _narrower(agent.dtype, base_chunk.dtype)
                same = agent.to(device=row.device, dtype=narrow) == base_chunk.to(device=row.device, dtype=narrow)
                row.masked_fill_(same, 0.0)

    def _raise_nonfinite(self, start: int, end: int, out: Tensor | None = None) -> None:
        """Raise :class:`NonFiniteError` naming the first input of ``[start, end)`` that holds NaN/Inf, else the
        first task vector that overflows the compute dtype, else the first merged value in ``out`` (flat) that
        does not fit its dtype."""
        candidates = [("base", "the base", self.base)]
        candidates += [(n, f"agent {n!r}", a) for n, a in zip(self.agents, self.tensors)]
        for name, who, tensor in candidates:
            index = _first_nonfinite(tensor[start:end])
            if index is not None:
                raise NonFiniteError(f"tensor {self.key!r} of {who} holds {tensor[start + index].item()} at flat "
                                     f"index {start + index}", key=self.key, agent=name)
        base_f = self.base[start:end].to(self.dtype)
        for name, tensor in zip(self.agents, self.tensors):
            index = _first_nonfinite(tensor[start:end].to(self.dtype) - base_f)
            if index is not None:
                raise NonFiniteError(
                    f"tensor {self.key!r}: the task vector of agent {name!r} overflows {self.dtype} at flat index "
                    f"{start + index} (agent and base values too far apart to subtract)", key=self.key, agent=name,
                )
        index = None if out is None else _first_nonfinite(out[start:end])
        where = "" if index is None else f" at flat index {start + index}"
        raise NonFiniteError(
            f"tensor {self.key!r}: the merged value{where} overflows {out.dtype if out is not None else self.dtype} "
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

    def fused_chunks(self, kernel: Callable[..., Any], key: Any = None
                     ) -> Iterator[tuple[int, int, Any, Tensor, list[Tensor]]]:
        """``(start, end, compiled kernel, base chunk, agent chunks)`` over chunks of ``fused_chunk`` elements
        (views of the inputs); full chunks get the build of ``kernel`` specialised on their length."""
        chunk = self.fused_chunk
        key = (len(self.tensors), key)
        for start in range(0, self.numel, chunk):
            end = min(self.numel, start + chunk)
            yield (start, end, F.compiled(kernel, static=end - start == chunk, key=key), self.base[start:end],
                   [t[start:end] for t in self.tensors])

    def delta(self, index: int) -> Tensor:
        """Agent ``index``'s whole flat task vector (a new tensor)."""
        out = self.tensors[index].to(device=self.device, dtype=self.dtype, copy=True)
        return out.sub_(self.base.to(device=self.device))

    def statistics(self, activity: Activity) -> RamStatistics:
        stream = DeltaStream(self.key, self.base, self.tensors, self.agents, self.device,
                             self.chunk_numel, activity, {}, compile=self.compile)
        return _accumulate_statistics(stream, len(self.tensors))


def default_workers(device: torch.device) -> int:
    """Threads that share a tensor's chunks: on CPU as many as torch's intra-op threads (at most 8), since each
    cache-sized op then runs on one core without OpenMP hand-offs; one on accelerators (one stream)."""
    return min(torch.get_num_threads(), 8) if device.type == "cpu" else 1


def _threads(workers: int | None, device: torch.device) -> int:
    """``workers`` as given, else :func:`default_workers` for ``device``."""
    return workers if workers is not None else default_workers(device)


def _in_workers(stream: DeltaStream, workers: int, job: Callable[[int, int], Any], chunk: int | None = None
                ) -> list[Any]:
    """``job(worker, workers)`` for each worker, in threads when there is more than one chunk (of ``chunk``
    entries, default the stream's) to share."""
    workers = max(1, min(workers, -(-stream.numel // (chunk or stream.stream_chunk))))
    if workers == 1:
        return [job(0, 1)]
    if workers > POOL_THREADS or threading.current_thread().name.startswith(_POOL_PREFIX):
        # more threads than the shared pool has, or called from one of its threads (which must not wait on it)
        with ThreadPoolExecutor(workers, thread_name_prefix="ram-live-extra") as pool:
            return list(pool.map(lambda w: job(w, workers), range(workers)))
    return list(_pool().map(lambda w: job(w, workers), range(workers)))


#: Threads of the pool that every merge shares (a pool per tensor and pass cost ~0.2 ms: 70 ms per pass over a
#: 7B model's ~340 tensors); ``workers`` above this get a pool of their own.
POOL_THREADS = 8
_POOL_PREFIX = "ram-live-pool"
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix=_POOL_PREFIX)
        return _POOL


def _forget_pool() -> None:
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()  # a forked child has the pool object but none of its threads


os.register_at_fork(after_in_child=_forget_pool)


def _native(stream: DeltaStream, activity: Activity, out: Tensor | None = None) -> tuple[Any, float] | None:
    """The native CPU kernels and their threshold where they apply (see :mod:`ram_live._ram_native`; not when
    ``compile=True`` asks for the torch.compile kernels), else None."""
    if stream.compile or stream.device.type != "cpu" or stream.dtype != torch.float32:
        return None
    kernels = _ram_native.kernels()
    if kernels is None or not _ram_native.supports(out, stream.base, stream.tensors):
        return None
    return kernels, activity.threshold


def _native_walk(stream: DeltaStream, worker: int, workers: int, call: Callable[[int, int], int]) -> int:
    """``call(start, end)`` on this worker's share of the ranges (every ``workers``-th), each range's pages
    released after it; returns the sum of what the calls return (their counts of non-finite entries)."""
    bad = 0
    for start in range(worker * NATIVE_CHUNK, stream.numel, NATIVE_CHUNK * workers):
        end = min(stream.numel, start + NATIVE_CHUNK)
        bad += call(start, end)
        if stream.range_done is not None:
            stream.range_done(start, end)
    return bad


def _native_statistics(stream: DeltaStream, k: int, kernels: Any, eps: float, workers: int,
                       amax: list[tuple[float, float]] | None = None) -> RamStatistics:
    tops: dict[int, Tensor] = {}  # per worker (keyed by its counts tensor): max |τ|, max |θ₀|

    def count(start: int, end: int, active: Tensor, unique: Tensor) -> int:
        top = None if amax is None else tops.setdefault(id(active), torch.zeros(2))
        return int(kernels.counts(stream.base, stream.tensors, eps, start, end, active, unique, top))

    stats = _native_counts(stream, k, workers, count)
    if amax is not None and tops:
        top = torch.stack(list(tops.values())).amax(0)
        amax.append((float(top[0]), float(top[1])))
    return stats


def _native_counts(stream: DeltaStream, k: int, workers: int,
                   count: Callable[[int, int, Tensor, Tensor], int], out: Tensor | None = None) -> RamStatistics:
    """``count(start, end, active, unique)`` over the stream's ranges in threads (it adds to the int64 counts and
    returns its number of non-finite entries); the summed counts, or the :class:`NonFiniteError` naming one
    (``out``: what ``count`` writes, if anything)."""
    def job(worker: int, n_workers: int) -> tuple[Tensor, Tensor, int]:
        active, unique = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
        bad = _native_walk(stream, worker, n_workers, lambda start, end: count(start, end, active, unique))
        return active, unique, bad

    results = _in_workers(stream, workers, job, NATIVE_CHUNK)
    if any(bad for _, _, bad in results):
        stream._raise_nonfinite(0, stream.numel, out)
    return RamStatistics(sum(r[0] for r in results), sum(r[1] for r in results),  # type: ignore[arg-type]
                         torch.zeros(k + 1, dtype=torch.int64))


def _merge_native(stream: DeltaStream, flat: Tensor, kernels: Any, lambdas: Tensor | None, eps: float,
                  workers: int) -> None:
    def job(worker: int, n_workers: int) -> int:
        return _native_walk(stream, worker, n_workers, lambda start, end: kernels.merge(
            flat, stream.base, stream.tensors, lambdas, eps, start, end))

    if any(_in_workers(stream, workers, job, NATIVE_CHUNK)):
        stream._raise_nonfinite(0, stream.numel, flat)


def _accumulate_statistics(stream: DeltaStream, k: int, workers: int = 1,
                           amax: list[tuple[float, float]] | None = None) -> RamStatistics:
    """The counts of ``stream``; ``amax``: gets (max |τ|, max |θ₀|) appended where the kernels track them (native
    and torch paths; not the compiled one)."""
    assert stream.activity is not None
    native = _native(stream, stream.activity)
    if native is not None:
        return _native_statistics(stream, k, *native, workers, amax)
    eps = stream.fused_eps(stream.activity)
    if eps is not None:
        return _fused_statistics(stream, k, eps)

    def job(worker: int, n_workers: int) -> tuple[F.RamCounter, Tensor | None]:
        counter = F.RamCounter(stream.stream_chunk, k, stream.device, stream.dtype)
        top = None if amax is None else torch.zeros(2, dtype=stream.dtype, device=stream.device)
        for _, base_f, agents in stream.streamed(worker, n_workers):
            counter.begin(base_f.numel())
            if top is not None:
                top[1] = torch.maximum(top[1], base_f.abs().amax())
            for t, delta in agents:
                counter.add(t, delta)
                if top is not None:
                    top[0] = torch.maximum(top[0], delta.abs().amax())
            counter.end()
        return counter, top

    runs = _in_workers(stream, workers, job)
    counters = [c for c, _ in runs]
    if not all(c.finite() for c in counters):
        stream._raise_nonfinite(0, stream.numel)
    if amax is not None and runs:
        top = torch.stack([t for _, t in runs if t is not None]).amax(0)
        amax.append((float(top[0]), float(top[1])))
    results = [c.result() for c in counters]
    return RamStatistics(*(sum(r[i] for r in results) for i in range(3)))  # type: ignore[arg-type]


def _fused_statistics(stream: DeltaStream, k: int, eps: float) -> RamStatistics:
    """The counts of :func:`_accumulate_statistics` by the compiled :func:`ram_live.functional.ram_counts_fused`."""
    active = torch.zeros(k, dtype=torch.float64, device=stream.device)
    unique = torch.zeros_like(active)
    check = torch.zeros((), dtype=torch.float32, device=stream.device)
    for _, _, kernel, base, agents in stream.fused_chunks(F.ram_counts_fused):
        a, u, c = kernel(base, agents, eps)
        active += a
        unique += u
        check += c
    if not bool(torch.isfinite(check)):
        stream._raise_nonfinite(0, stream.numel)
    return RamStatistics(active.cpu().round().long(), unique.cpu().round().long(), torch.zeros(k + 1, dtype=torch.int64))


# ----------------------------------------------------------------------------------------------- compiling


@functools.cache
def compiler_available(device_type: str) -> bool:
    """Whether ``torch.compile`` can build kernels for this device type here: a C++ compiler on CPU, Triton on
    CUDA/XPU; never elsewhere."""
    if device_type == "cpu":
        return any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c)
    if device_type in ("cuda", "xpu"):
        return importlib.util.find_spec("triton") is not None
    return False


def resolve_compile(compile: bool | str, device: torch.device, agent_entries: int) -> bool:
    """``compile`` of :func:`ram_live.merge` as a decision. ``"auto"``, by what the host has:

    * fewer than :data:`COMPILE_AUTO_MIN` agent-entries: never (the compile would cost more than it saves);
    * CPU with the native kernels built at a vector level (AVX-512, AVX2 or NEON: ``ram_live._cc.build_level``):
      never, the native kernels run at a few times the copy floor, faster than inductor's code, and there is
      nothing to compile per process;
    * otherwise (GPUs; CPUs without native kernels, or with only the baseline ``scalar`` build, where inductor
      generates code for the CPU's own instructions): compile where a toolchain is available.

    Example:
        >>> resolve_compile("auto", torch.device("cpu"), 10)
        False
    """
    if isinstance(compile, bool):
        return compile
    if compile != "auto":
        raise ConfigError(f"compile must be True, False or 'auto', got {compile!r}")
    if agent_entries < COMPILE_AUTO_MIN:
        return False
    if device.type == "cpu" and _ram_native.kernels() is not None and _cc.build_level() != "scalar":
        return False
    return compiler_available(device.type)


def _compiler_works(device: torch.device, k: int, weighted: bool, importance: bool = False) -> bool:
    """Build (or load from the cache) the dynamic-shape RAM kernel on a tiny input, so that a missing or broken
    toolchain falls back to the eager path with a warning before anything is written."""
    try:
        zeros = torch.zeros(3, device=device)
        lambdas = torch.ones(k, device=device) if weighted else None
        F.compiled(F.ram_fused_, key=(k, not weighted))(zeros.clone(), zeros, [zeros] * k, lambdas, 0.0)
        if importance:
            F.compiled(F.ram_fused_weighted_, key=(k, not weighted))(zeros.clone(), zeros, [zeros] * k,
                                                                       [zeros] * k, lambdas, 0.0)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure of the toolchain means "merge eagerly"
        warnings.warn(f"torch.compile failed on {device} ({type(exc).__name__}: {str(exc)[:200]}); merging with "
                      "the eager kernels instead (same results, slower)", RuntimeWarning, stacklevel=3)
        return False


# ----------------------------------------------------------------------------------------------- running


class _Reader:
    """Reads one key from the base and every agent, on the compute device."""

    def __init__(self, base: TensorSource, agents: Sequence[TensorSource], device: torch.device | None) -> None:
        self.base = base
        self.agents = list(agents)
        self.names = tuple(a.name for a in agents)
        self.device = device
        self.auxiliary = AuxiliaryInputs({}, None)

    def stream(self, stream: DeltaStream) -> DeltaStream:
        """``stream`` with this key's auxiliary inputs attached."""
        if self.auxiliary:
            stream.auxiliary = self.auxiliary.read(stream.key, stream.device)
            stream.check_auxiliary = self.auxiliary.check
        return stream

    def read(self, key: str) -> tuple[Tensor, list[Tensor], torch.device]:
        base = self.base.get(key)
        device = self.device or base.device
        if base.device != device:
            base = base.to(device)
        return base, [a.get(key) for a in self.agents], device

    def release(self, key: str) -> None:
        """Let sources that map files drop ``key``'s pages."""
        for src in (self.base, *self.agents, *self.auxiliary.all_sources()):
            release = getattr(src, "release", None)
            if release is not None:
                release(key)

    def range_releaser(self, key: str, sink: Any = None) -> Callable[[int, int], None] | None:
        """A callback that drops the mapped pages of flat entries ``[start, stop)`` of ``key`` from the inputs
        (and from ``sink``'s output) once a range is merged, so that resident memory holds a few ranges rather than
        K + 2 whole tensors; None when no input maps files."""
        sources = [src for src in (self.base, *self.agents, *self.auxiliary.all_sources())
                   if getattr(src, "releases_ranges", False)]
        out = getattr(sink, "release_range", None)
        if not sources and out is None:
            return None

        def release(start: int, stop: int) -> None:
            for src in sources:
                src.release(key, start, stop)
            if out is not None:
                out(key, start, stop)

        return release

    def nbytes(self, key: str) -> int:
        """Bytes of ``key`` over the base and every agent."""
        return sum(s.numel * s.dtype.itemsize for s in (src.spec(key) for src in (self.base, *self.agents)))


def _check_equal(reader: _Reader, key: str) -> None:
    base, agents, _ = reader.read(key)
    for name, agent in zip(reader.names, agents):
        if not torch.equal(agent.to(base.device), base):
            raise InputMismatchError(
                f"non-floating tensor {key!r} of agent {name!r} differs from the base's "
                "(integer tensors cannot be merged; they must be equal)",
                key=key, agent=name,
            )


def _check_ties_and_copies(reader: _Reader, plan: Plan) -> None:
    """Before anything is written: an agent that does not tie a name the base ties, and holds other values under
    it, would lose them to the base's tie (the merge keeps one tensor); a floating tensor taken from the base
    as is (a buffer) must be finite, as every merged input must."""
    for name, agent in zip(reader.names, reader.agents):
        keys, tied = set(agent.keys()), agent.aliases()
        for alias, canonical in plan.alias.items():
            if alias not in keys or tied.get(alias) == canonical:
                continue
            mine, theirs = agent.get(alias), agent.get(canonical)
            if not torch.equal(mine, theirs.to(mine.device)):
                raise InputMismatchError(
                    f"tensor {alias!r}: agent {name!r} holds other values there than under {canonical!r}, which "
                    "the base ties it to; the merge keeps the base's tie, so they would be lost (tie them in the "
                    "agent, or untie them in the base)", key=alias, agent=name,
                )
    for key in plan.copy:
        flat = reader.base.get(key).reshape(-1)
        index = _first_nonfinite(flat) if flat.dtype.is_floating_point else None
        if index is not None:
            raise NonFiniteError(f"tensor {key!r} of the base (a buffer: taken from the base as is) holds "
                                 f"{flat[index].item()} at flat index {index}", key=key, agent="base")


def statistics_pass(
    reader: _Reader,
    plan: Plan,
    activity: Activity,
    chunk_numel: int,
    workspace: dict[Any, Tensor],
    progress: ProgressHook | None = None,
    workers: int | None = None,
    compile: bool = False,
    digest: Any = None,
    amax: dict[str, tuple[float, float]] | None = None,
    check_auxiliary: bool = False,
) -> RamStatistics:
    """Pass 1: RAM counts over every merged tensor (also checks that every input is finite); ``digest``: fed
    by :func:`digest_update` for every tensor; ``amax``: gets (max |τ|, max |θ₀|) per tensor where the kernels
    track them; ``check_auxiliary``: also validates the method's auxiliary inputs (the in-place validation pass)."""
    k = len(reader.agents)
    active = torch.zeros(k, dtype=torch.int64)
    unique = torch.zeros_like(active)
    histogram = torch.zeros(k + 1, dtype=torch.int64)
    if progress:
        progress.start("statistics", len(plan.merge), sum(reader.nbytes(key) for key in plan.merge))
    for key in plan.merge:
        base, agents, device = reader.read(key)
        stream = DeltaStream(key, base, agents, reader.names, device, chunk_numel, activity, workspace,
                             compile=compile)
        if digest is not None:
            digest_update(digest, stream)
        stream.range_done = reader.range_releaser(key)
        tops: list[tuple[float, float]] | None = None if amax is None else []
        stats = _accumulate_statistics(stream, k, _threads(workers, device), tops)
        if check_auxiliary:
            reader.stream(stream).validate_auxiliary()
        if tops:
            amax[key] = tops[0]
        if reader.base.spec(key).counted:
            active += stats.active
            unique += stats.unique
            histogram += stats.histogram
        reader.release(key)
        if progress:
            progress.update(key, reader.nbytes(key))
    for key in plan.check_equal:
        _check_equal(reader, key)
    if progress:
        progress.close()
    return RamStatistics(active, unique, histogram)


def _merge_streaming(stream: DeltaStream, make_accumulator: Callable[[], Any], flat: Tensor, workers: int) -> None:
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
            bad += _nonfinite(flat[start : start + n])  # NaN/Inf in any input reaches the output; one sync per tensor
        return bad

    if any(bool(b) for b in _in_workers(stream, workers, job)):
        stream._raise_nonfinite(0, stream.numel, flat)


def _first_nonfinite(flat: Tensor) -> int | None:
    """The index of the first NaN/Inf in the 1-d ``flat``, or None."""
    bad = ~torch.isfinite(flat)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


def _nonfinite(stored: Tensor) -> Tensor:
    """How many entries of ``stored`` are NaN/Inf, as a tensor (no sync): checked on the values as written, so
    that a float32 result beyond a narrower output dtype's range (float16: 65504) counts too."""
    return (~torch.isfinite(stored)).sum()


def _fused_kernel(method: MergeMethod, config: Any, state: Any, stream: DeltaStream, flat: Tensor,
                  workers: int) -> functools.partial[None] | None:
    """A one-pass RAM merge ``(stream, flat output) -> None`` where one applies (RAM family): the native CPU
    kernels, else the compiled ones (see :meth:`DeltaStream.fused_eps`); None: the eager streaming path runs."""
    if method.accumulator is None or getattr(config, "variant", None) not in RAM_VARIANTS:
        return None
    activity = method.activity(config)
    lambdas = None if state is None else state.to(device=stream.device, dtype=stream.dtype)
    if stream.auxiliary:
        return _weighted_kernel(stream, flat, activity, lambdas, workers)
    native = _native(stream, activity, flat)
    if native is not None:
        return functools.partial(_merge_native, kernels=native[0], lambdas=lambdas, eps=native[1], workers=workers)
    eps = stream.fused_eps(activity)
    if eps is None:
        return None
    return functools.partial(_merge_fused, lambdas=lambdas, eps=eps)


def _weighted_kernel(stream: DeltaStream, flat: Tensor, activity: Activity, lambdas: Tensor | None,
                     workers: int) -> functools.partial[None] | None:
    """:func:`_fused_kernel` for RAM with importances (the only auxiliary input the RAM kernels take): the native
    weighted kernel, else the compiled one, else None (the eager :class:`~ram_live.functional.
    WeightedRamAccumulator`)."""
    importances = stream.auxiliary.get("importance")
    if importances is None or len(stream.auxiliary) != 1:
        return None
    native = _native(stream, activity, flat)
    kernels = None if native is None else _importance_native.kernels()
    if kernels is not None and _importance_native.supports(stream.base, importances):
        return functools.partial(_merge_native_weighted, kernels=kernels, importances=importances, lambdas=lambdas,
                                 eps=native[1], workers=workers)  # type: ignore[index]
    eps = stream.fused_eps(activity)
    if eps is None or any(h.device != stream.base.device for h in importances):
        return None
    return functools.partial(_merge_fused, lambdas=lambdas, eps=eps, importances=importances)


def _merge_native_weighted(stream: DeltaStream, flat: Tensor, kernels: Any, importances: list[Tensor],
                           lambdas: Tensor | None, eps: float, workers: int) -> None:
    """:func:`_merge_native` with importances; the kernel counts invalid importances with the non-finite
    results, and either names its culprit."""
    def job(worker: int, n_workers: int) -> int:
        return _native_walk(stream, worker, n_workers, lambda start, end: kernels.merge_weighted(
            flat, stream.base, stream.tensors, importances, lambdas, eps, start, end))

    if any(_in_workers(stream, workers, job, NATIVE_CHUNK)):
        stream.validate_auxiliary()
        stream._raise_nonfinite(0, stream.numel, flat)


def _merge_fused(stream: DeltaStream, flat: Tensor, lambdas: Tensor | None, eps: float,
                 importances: list[Tensor] | None = None) -> None:
    """Each chunk merged by the compiled :func:`ram_live.functional.ram_fused_` (with ``importances``:
    :func:`~ram_live.functional.ram_fused_weighted_`) straight into ``flat`` (through a scratch chunk when
    ``flat`` lives on another device)."""
    bad = torch.zeros((), dtype=torch.int64, device=stream.device)
    scratch = None if flat.device == stream.device else torch.empty(
        min(stream.numel, stream.fused_chunk), dtype=flat.dtype, device=stream.device)
    kernel_fn = F.ram_fused_ if importances is None else F.ram_fused_weighted_
    for start, end, kernel, base, agents in stream.fused_chunks(kernel_fn, lambdas is None):
        written = flat[start:end] if scratch is None else scratch[: end - start]
        if importances is None:
            kernel(written, base, agents, lambdas, eps)
        else:
            kernel(written, base, agents, [h[start:end] for h in importances], lambdas, eps)
        bad += _nonfinite(written)
        if scratch is not None:
            flat[start:end].copy_(written)
    if bool(bad):
        stream._raise_nonfinite(0, stream.numel, flat)


def run_merge(
    base: TensorSource,
    agents: Sequence[TensorSource],
    method: MergeMethod,
    config: Any,
    sink: Sink,
    *,
    device: torch.device | None = None,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    validate_first: bool = False,
    progress: ProgressHook | None = None,
    workers: int | None = None,
    dist: Distributed | None = None,
    compile: bool | str = "auto",
    statistics: RamStatistics | None = None,
    auxiliary: Any = None,
) -> MergeInfo:
    """Merge ``agents`` onto ``base`` with ``method`` into ``sink``; see :func:`ram_live.merge`. ``statistics``:
    counts of an earlier pass over the same inputs, used instead of pass 1 (checked against the agents, the
    activity rule and the number of entries before the merge, and against the digest of the inputs' first and
    last entries after it, before the sink finishes; not with ``validate_first``, whose pass 1 validates).
    ``auxiliary``: the method's per-agent auxiliary inputs, ``{name: {agent name: TensorSource}}`` (RAM:
    ``"importance"``), streamed like the agents (see :mod:`ram_live.auxiliary`)."""
    t0 = time.perf_counter()
    agents = _kept_agents(agents, getattr(config, "exclude", ()))
    plan = build_plan(base, agents)
    specs = {key: base.spec(key) for key in plan.keys}
    counted = sum(specs[key].numel for key in plan.merge if specs[key].counted)
    if dist is not None and not dist.sharded:
        owner = dist.owners(plan, specs)
        if hasattr(sink, "distribute"):
            sink.distribute(dist, plan, owner, specs)
        plan = dist.local_plan(plan, owner)
    reader = _Reader(base, agents, device)
    reader.auxiliary = resolve_auxiliary(method, auxiliary, agents, plan.merge, base)
    _check_ties_and_copies(reader, plan)
    names = reader.names
    activity = method.activity(config)
    workspace: dict[Any, Tensor] = {}
    info = MergeInfo(method=method.name, config=config, agents=names)
    run_device = device or (base.spec(plan.merge[0]).device if plan.merge else torch.device("cpu"))
    compile = resolve_compile(compile, run_device, sum(specs[key].numel for key in plan.merge) * len(names))
    if compile:
        compile = _compiler_works(run_device, len(names), _ram_weighted(config), bool(reader.auxiliary))
    info.extra["compiled"] = compile
    if reader.auxiliary:
        info.extra["auxiliary"] = reader.auxiliary.names
    job = _Job(reader, method, config, sink, activity, info, chunk_numel, workers, compile, workspace)

    reuse, statistics = statistics, None
    if reuse is None and not validate_first and dist is None and not compile and not reader.auxiliary and _single_read(
            method, config, sink, len(names)):
        digest = inputs_digest()
        statistics, run_state = _single_read_pass(job, plan, specs, progress, run_device, digest)
        info.statistics = replace(statistics, agents=names, activity=activity or Activity(), numel=counted,
                                  fingerprint=digest.hexdigest())
        _record_lambdas(info, run_state)
        info.seconds = time.perf_counter() - t0
        return info
    amax: dict[str, tuple[float, float]] = {}
    if reuse is not None and method.needs_statistics(config) and not validate_first:
        statistics = _check_reusable(reuse, names, activity or Activity(), counted)
        info.statistics = statistics
    elif method.needs_statistics(config) or validate_first:
        digest = inputs_digest()
        try:
            statistics = statistics_pass(reader, plan, activity or Activity(), chunk_numel, workspace, progress,
                                         workers, compile, digest, amax if validate_first else None,
                                         check_auxiliary=validate_first)
        except BaseException:
            if dist is not None:  # every rank reaches the collective, failed or not; this rank's error wins
                try:
                    dist.reduce_statistics(None, len(names))
                except RemoteRankError:
                    pass
            raise
        if dist is not None:
            statistics = dist.reduce_statistics(statistics, len(names))
        statistics = replace(statistics, agents=names, activity=activity or Activity(), numel=counted,
                             fingerprint=digest.hexdigest())
        info.passes = 2
        info.statistics = statistics
    run_state = method.setup(config, RunContext(names, statistics, run_device)) if method.setup else None
    _record_lambdas(info, run_state)

    if validate_first:  # in place: nothing is written until every merged value is known to fit
        ok = False
        try:
            _dry_run(job, plan, specs, run_state, amax)
            ok = True
        finally:
            if dist is not None and not dist.all_ok(ok) and ok:
                raise RemoteRankError(f"rank {dist.rank}: another rank's merged values do not fit (see its error)")
        info.passes += 1 if info.extra["dry_run"] else 0

    check = inputs_digest() if reuse is not None and statistics is reuse and reuse.fingerprint else None
    try:
        _merge_pass(job, plan, specs, run_state, progress, validate_first, check)
        if check is not None and check.hexdigest() != reuse.fingerprint:  # before the sink's finish()
            raise ConfigError("statistics= were counted over other weights (the first and last entries of some "
                              "tensor differ): count them again, or pass the checkpoints they came from")
    except BaseException:
        if dist is not None:
            dist.all_ok(False)
        raise
    if dist is not None and not dist.all_ok(True):
        raise RemoteRankError(f"rank {dist.rank}: another rank failed while merging (see its error)")
    info.seconds = time.perf_counter() - t0
    return info


def _kept_agents(agents: Sequence[TensorSource], exclude: Sequence[str]) -> Sequence[TensorSource]:
    """``agents`` without those a config's ``exclude`` names (ConfigError naming names that are not agents)."""
    if not exclude:
        return agents
    names = [a.name for a in agents]
    unknown = [n for n in exclude if n not in names]
    if unknown:
        raise ConfigError(f"exclude: unknown agent(s) {', '.join(map(repr, unknown))} (the agents are "
                          f"{', '.join(map(repr, names))})")
    kept = [a for a in agents if a.name not in exclude]
    if not kept:
        raise ConfigError("exclude names every agent: at least one must be merged")
    return kept


def _record_lambdas(info: MergeInfo, run_state: Any) -> None:
    """λ and ρ per agent in ``info`` where the run state is one λ per agent computed from counts."""
    statistics, names = info.statistics, info.agents
    given = getattr(info.config, "lambdas", None) is not None
    if isinstance(run_state, Tensor) and (statistics is not None or given) and run_state.numel() == len(names):
        info.lambdas = dict(zip(names, map(float, run_state.tolist())))
    if info.lambdas is not None and statistics is not None:
        info.rho = {
            n: F.rho(float(u), float(a))
            for n, a, u in zip(names, statistics.active.tolist(), statistics.unique.tolist())
        }


def _check_reusable(statistics: RamStatistics, names: tuple[str, ...], activity: Activity,
                    numel: int) -> RamStatistics:
    """``statistics`` if they were counted over these agents, with this activity rule, over ``numel`` entries."""
    if not isinstance(statistics, RamStatistics):
        raise ConfigError(f"statistics= takes RamStatistics (MergeInfo.statistics or ProbeReport.statistics()), "
                          f"got {type(statistics).__name__}")
    if statistics.agents != names:
        raise ConfigError(f"statistics= were counted for agents {list(statistics.agents)}, this merge has "
                          f"{list(names)}")
    if statistics.activity != activity:
        raise ConfigError(f"statistics= were counted with {statistics.activity}, this merge uses {activity}")
    if statistics.numel != numel:
        raise ConfigError(f"statistics= were counted over {statistics.numel:,} entries, this merge has {numel:,} "
                          "(another model, or other tensors)")
    return statistics


def inputs_digest() -> Any:
    """A fresh digest for :func:`digest_update` (what a :class:`RamStatistics` ``fingerprint`` is)."""
    return hashlib.blake2b(digest_size=16)


def digest_update(digest: Any, stream: DeltaStream) -> None:
    """Feed the first and last 64 stored entries of the base's and every agent's flat tensor to ``digest``: two
    pages per input and tensor, read while the passes read them anyway, so that reused statistics are checked
    against the inputs they were counted over (a changed or swapped checkpoint changes some of them)."""
    for t in (stream.base, *stream.tensors):
        for part in (t[:64], t[-64:]):
            digest.update(bytes(part.contiguous().view(torch.uint8).cpu().tolist()))


def _ram_weighted(config: Any) -> bool:
    """Whether the RAM kernel gets λ (RAM+ variants, or λ given) — the build the compile check warms up."""
    return getattr(config, "variant", "ram") != "ram" or getattr(config, "lambdas", None) is not None


@dataclass
class _Job:
    """What every tensor of one merge shares."""

    reader: _Reader
    method: MergeMethod
    config: Any
    sink: Sink
    activity: Activity | None
    info: MergeInfo
    chunk_numel: int
    workers: int | None
    compile: bool = False
    workspace: dict[Any, Tensor] = field(default_factory=dict)


class _ScratchSink:
    """Where :func:`_dry_run` merges to: destinations are given, nothing is kept."""

    def commit(self, key: str) -> None:
        pass


def _fits(job: _Job, spec: TensorSpec, amax: tuple[float, float] | None, run_state: Any = None) -> bool:
    """Whether a RAM-family merge of a tensor with these (max |τ|, max |θ₀|) fits its dtype whatever the entries:
    |θ*| ≤ max |θ₀| + λ_max · K · max |τ| (the float32 sum of K task vectors, then the mean or λ), kept 1 %
    under the dtype's largest value for rounding."""
    if amax is None or job.method.accumulator is None or getattr(job.config, "variant", None) not in RAM_VARIANTS:
        return False
    lam = lambda_bound(job.config, run_state)
    tau, base = amax
    return base + lam * len(job.reader.names) * tau < 0.99 * torch.finfo(spec.dtype).max


def _dry_run(job: _Job, plan: Plan, specs: dict[str, TensorSpec], run_state: Any,
             amax: dict[str, tuple[float, float]]) -> None:
    """Merge into one scratch buffer (per device, as large as the largest tensor), and drop, every tensor that
    :func:`_fits` cannot clear from ``amax`` (what the validation pass saw): such merges raise
    :class:`NonFiniteError` where a merged value does not fit its dtype (float16 past 65504, a scale that
    overflows), which an in-place merge must find before it writes into the base. The same kernels run again to
    write, so they give the same bits."""
    dry = replace(job, sink=_ScratchSink(), info=MergeInfo(method=job.info.method, config=job.config,
                                                             agents=job.info.agents))
    keys = [key for key in plan.merge if not _fits(job, specs[key], amax.get(key), run_state)]
    job.info.extra["dry_run"] = len(keys)
    need: dict[torch.device, int] = {}
    for key in keys:
        spec = specs[key]
        need[spec.device] = max(need.get(spec.device, 0), spec.numel * spec.dtype.itemsize)
    scratch = {device: memory.empty(n, dtype=torch.uint8, device=device) for device, n in need.items()}
    for key in keys:
        spec = specs[key]
        buffer = scratch[spec.device][: spec.numel * spec.dtype.itemsize]
        _merge_tensor(dry, key, run_state, dest=buffer.view(spec.dtype).view(spec.shape))


def _merge_pass(job: _Job, plan: Plan, specs: dict[str, TensorSpec], run_state: Any, progress: ProgressHook | None,
                validate_first: bool, digest: Any = None) -> None:
    reader, sink = job.reader, job.sink
    for key in plan.check_equal:
        if not validate_first:
            _check_equal(reader, key)
    sink.begin(plan, specs)
    if progress:
        progress.start("merge", len(plan.merge), sum(reader.nbytes(key) for key in plan.merge))
    for key in plan.merge:
        _merge_tensor(job, key, run_state, digest)
        if progress:
            progress.update(key, reader.nbytes(key))
    if progress:
        progress.close()
    _finish_pass(reader, plan, sink)


def _merge_tensor(job: _Job, key: str, run_state: Any, digest: Any = None, dest: Tensor | None = None) -> None:
    """Merge ``key`` into the sink's destination (``dest`` when it was already taken) and commit it."""
    reader, method, config, sink, activity, info = job.reader, job.method, job.config, job.sink, job.activity, job.info
    names, workers = reader.names, job.workers
    base_t, agent_ts, dev = reader.read(key)
    stream = reader.stream(DeltaStream(key, base_t, agent_ts, names, dev, job.chunk_numel, activity,
                                       job.workspace, compile=job.compile))
    if digest is not None:
        digest_update(digest, stream)
    stream.range_done = reader.range_releaser(key, sink)
    state = method.prepare(config, stream, run_state) if method.prepare else None
    if dest is None:
        dest = sink.destination(key, reader.base.spec(key))
    flat = dest.view(-1) if dest.is_contiguous() else torch.empty(dest.numel(), dtype=dest.dtype,
                                                                   device=dest.device)
    n_workers = _threads(workers, dev)
    fused = _fused_kernel(method, config, state, stream, flat, n_workers)
    native = fused is not None and fused.func in (_merge_native, _merge_native_weighted)
    _count_kernel(info, "eager" if fused is None else ("native" if native else "compiled"))
    if stream.auxiliary and not native:  # the native kernels check the values as they go
        stream.validate_auxiliary()
    if fused is not None:
        fused(stream, flat)
    elif method.accumulator is not None:
        _merge_streaming(
            stream,
            functools.partial(method.accumulator, config, state, stream.stream_chunk, len(names), dev, stream.dtype,
                              **({"auxiliary": tuple(stream.auxiliary)} if stream.auxiliary else {})),
            flat,
            n_workers,
        )
    else:
        bad = torch.zeros((), dtype=torch.int64, device=flat.device)
        for start, base_f, deltas in stream:
            n = base_f.numel()
            aux = {name: torch.stack([h[start:start + n].to(deltas.device) for h in hs]).to(deltas.dtype)
                   for name, hs in stream.auxiliary.items()} or None
            ctx = TensorContext(key=key, agents=names, start=start, run_state=run_state, state=state, auxiliary=aux)
            tau = method.combine(deltas, ctx, config)
            changed = tau != 0
            merged = tau.add_(base_f)
            written = flat[start : start + base_f.numel()]
            written.copy_(torch.where(changed, merged, base_f))
            bad += _nonfinite(written)
        if bool(bad):
            stream._raise_nonfinite(0, stream.numel, flat)
    if flat.data_ptr() != dest.data_ptr():
        dest.copy_(flat.view(dest.shape))
    sink.commit(key)
    reader.release(key)
    info.tensors += 1
    info.parameters += stream.numel


def _count_kernel(info: MergeInfo, kind: str) -> None:
    kernels = info.extra.setdefault("kernels", {})
    kernels[kind] = kernels.get(kind, 0) + 1


def _finish_pass(reader: _Reader, plan: Plan, sink: Sink) -> None:
    """The unmerged tensors (copied from the base) and the tied names."""
    for key in plan.copy:
        sink.copy_from_base(key, reader.base.get(key))
    for alias, canonical in plan.alias.items():
        sink.alias(alias, canonical)


# ------------------------------------------------------------------------------ RAM+ in one read of the inputs


def _single_read(method: MergeMethod, config: Any, sink: Sink, k: int) -> bool:
    """Whether a global-ρ RAM+ merge reads its inputs once where it can (:func:`_single_read_pass`): a RAM-family
    method that needs the counts, a sink whose fresh destinations stay in memory, and the native kernels for this
    many agents (``RAM_LIVE_SINGLE_READ=0``: never). The caller rules out ``validate_first``, reused counts,
    ``dist`` and ``compile``."""
    return (os.environ.get("RAM_LIVE_SINGLE_READ", "auto") != "0"
            and method.accumulator is not None and getattr(config, "variant", None) in RAM_VARIANTS
            and method.needs_statistics(config) and bool(getattr(sink, "revisable", False))
            and k <= _ram_native.MAX_UNSCALED_AGENTS and _ram_native.kernels() is not None)


def _owner_map_budget(plan: Plan, specs: dict[str, TensorSpec]) -> float:
    """Bytes the owner maps of a single-read merge may hold: twice the largest tensor, so that extra memory stays
    ≤ output + 2 × largest tensor as with two passes (``RAM_LIVE_SINGLE_READ=1``: unbounded)."""
    if os.environ.get("RAM_LIVE_SINGLE_READ") == "1":
        return math.inf
    return 2 * max((specs[key].numel * specs[key].dtype.itemsize for key in plan.merge), default=0)


def _owner_map_arena(plan: Plan, specs: dict[str, TensorSpec], k: int) -> Tensor:
    """One int32 buffer the owner maps are cut from, in merge order, as far as :func:`_owner_map_budget` allows.
    One buffer, not one per tensor: it faults in as huge pages (:mod:`ram_live.memory`), which made a fresh
    33 MB map 3.3 ms to fill instead of 10.9 ms here; the part no map reaches is never touched."""
    need = sum(_ram_native.planes_numel(specs[key].numel, k) for key in plan.merge)
    numel = int(min(need, _owner_map_budget(plan, specs) // 4))
    return memory.empty(numel, dtype=torch.int32, device="cpu")


def _single_read_pass(job: _Job, plan: Plan, specs: dict[str, TensorSpec], progress: ProgressHook | None,
                      run_device: torch.device, digest: Any) -> tuple[RamStatistics, Any]:
    """RAM+ with global ρ reading the agents once: λ scales only the entries one agent alone changed, so each
    tensor is merged as RAM (those entries keep the agent's own value) while the same read counts, and an owner map
    (:func:`ram_live._ram_native.plane_count` bits per entry) records who changed them alone; once every count is
    in, λ is applied there from the base and the output. The bits equal the two-pass merge's (same float32 ops in
    the same order). Tensors the native kernels do not take, and those whose owner map would pass
    :func:`_owner_map_budget`, are counted in the first loop and merged after it (read twice).
    Returns the statistics and the method's run state (λ)."""
    reader, sink, k = job.reader, job.sink, len(job.reader.names)
    for key in plan.check_equal:
        _check_equal(reader, key)
    sink.begin(plan, specs)
    active = torch.zeros(k, dtype=torch.int64)
    unique = torch.zeros_like(active)
    deferred: list[tuple[str, Tensor, Tensor]] = []  # (key, flat output, owner map), λ still to apply
    rest: list[tuple[str, Tensor]] = []  # (key, destination), merged once λ is known
    arena = _owner_map_arena(plan, specs, k)
    used = 0
    if progress:
        progress.start("merge", len(plan.merge), sum(reader.nbytes(key) for key in plan.merge))
    for key in plan.merge:
        size = _ram_native.planes_numel(specs[key].numel, k)
        fits = used + size <= arena.numel()
        stats, dest, planes = _merge_unscaled(job, key, digest, arena[used:used + size] if fits else None)
        if planes is None:
            rest.append((key, dest))
        else:
            deferred.append((key, dest.view(-1), planes))
            used += size
        if reader.base.spec(key).counted:
            active += stats.active
            unique += stats.unique
        if progress:
            progress.update(key, reader.nbytes(key))
    if progress:
        progress.close()
    statistics = RamStatistics(active, unique, torch.zeros(k + 1, dtype=torch.int64))
    run_state = job.method.setup(job.config, RunContext(reader.names, statistics, run_device)) \
        if job.method.setup else None
    while deferred:  # last merged first: some of its lines are still in the cache
        _rescale(job, *deferred.pop(), run_state)
    for key, dest in rest:
        _merge_tensor(job, key, run_state, dest=dest)
    _finish_pass(reader, plan, sink)
    job.info.passes = 2 if rest else 1
    job.info.extra["single_read"] = len(plan.merge) - len(rest)
    return statistics, run_state


def _merge_unscaled(job: _Job, key: str, digest: Any, planes: Tensor | None
                    ) -> tuple[RamStatistics, Tensor, Tensor | None]:
    """Pass 1 of :func:`_single_read_pass` on ``key``: its counts and destination, and where ``planes`` (room for
    its owner map) is given and the native kernels take it, that owner map, filled, of the destination merged but
    for λ (else None: only counted)."""
    reader, k = job.reader, len(job.reader.names)
    activity = job.activity or Activity()
    base_t, agent_ts, dev = reader.read(key)
    stream = DeltaStream(key, base_t, agent_ts, reader.names, dev, job.chunk_numel, activity, job.workspace)
    digest_update(digest, stream)
    stream.range_done = reader.range_releaser(key)
    workers = _threads(job.workers, dev)
    dest = job.sink.destination(key, reader.base.spec(key))
    flat = dest.view(-1) if planes is not None and dest.is_contiguous() and dest.dtype == stream.base.dtype else None
    native = None if flat is None else _native(stream, activity, flat)
    if flat is None or native is None:
        stats, planes = _accumulate_statistics(stream, k, workers), None
    else:
        kernels, eps = native
        out, owners = flat, planes
        stats = _native_counts(stream, k, workers, lambda start, end, a, u: kernels.merge_unscaled(
            out, stream.base, stream.tensors, eps, start, end, owners, a, u), out)
        job.sink.commit(key)
    reader.release(key)
    return stats, dest, planes


def _rescale(job: _Job, key: str, flat: Tensor, planes: Tensor, run_state: Any) -> None:
    """Pass 2 of :func:`_single_read_pass` on ``key``: λ applied where the owner map names an agent."""
    reader = job.reader
    base_t, agent_ts, dev = reader.read(key)
    stream = DeltaStream(key, base_t, agent_ts, reader.names, dev, job.chunk_numel, job.activity, job.workspace)
    stream.range_done = reader.range_releaser(key)
    state = job.method.prepare(job.config, stream, run_state) if job.method.prepare else run_state
    lambdas = state.to(dtype=torch.float32).contiguous()
    kernels = _ram_native.kernels()
    workers = _threads(job.workers, dev)
    bad = _in_workers(stream, workers, lambda w, n: _native_walk(
        stream, w, n, lambda start, end: kernels.rescale(flat, stream.base, planes, lambdas, start, end)),
        NATIVE_CHUNK)
    if any(bad):
        stream._raise_nonfinite(0, stream.numel, flat)
    reader.release(key)
    _count_kernel(job.info, "native")
    job.info.tensors += 1
    job.info.parameters += stream.numel
