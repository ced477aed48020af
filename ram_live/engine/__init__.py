"""The streaming executor: plan and check, (pass 1) gather statistics, (pass 2) merge tensor by tensor, chunk by
chunk; RAM+ with global ρ into memory reads the inputs once instead.

One module per job: :mod:`.plan` (what happens to each key), :mod:`.reader` (reading a key from every input),
:mod:`.stream` (one tensor's task vectors, chunk by chunk), :mod:`.threads` (the workers and their pool),
:mod:`.dispatch` (which kernel runs a tensor) with :mod:`.counts` and :mod:`.merges` (the kernels' runners),
:mod:`.compiling` (``compile=``), :mod:`.passes` (statistics, dry run, merge), :mod:`.single_read` (RAM+ in one
read), :mod:`.results` (what a merge reports and reuses) and :mod:`.run` (:func:`run_merge`, orchestration).

Each tensor's chunks feed the method's stateless ``combine`` (or its accumulator, or the fast kernels it
declares), which turns them into τ*; τ* is added to the base and written in the base's dtype. Entries with
τ* = 0 keep the base's exact bits.
"""

from __future__ import annotations

from ..types import MergeInfo, Plan
from .compiling import COMPILE_AUTO_MIN, compiler_available, compiler_works, resolve_compile
from .dispatch import count_tensor, merge_kernel, method_kernels, native_for
from .passes import Job, merge_pass, statistics_pass
from .plan import build_plan, kept_agents
from .reader import Reader
from .run import run_merge
from .single_read import single_read_pass
from .stream import (DEFAULT_CHUNK_NUMEL, FUSED_CHUNK_MAX, STREAM_CHUNK, DeltaStream, digest_update,
                     inputs_digest)
# (NATIVE_CHUNK is read from .threads at call time: patch it there)
from .threads import POOL_THREADS, default_workers, in_workers, native_walk, worker_count

__all__ = [
    "Plan", "build_plan", "DeltaStream", "MergeInfo", "run_merge", "DEFAULT_CHUNK_NUMEL",
    "STREAM_CHUNK", "FUSED_CHUNK_MAX", "POOL_THREADS", "COMPILE_AUTO_MIN",
    "Reader", "Job", "kept_agents", "statistics_pass", "merge_pass", "single_read_pass",
    "compiler_available", "compiler_works", "resolve_compile", "method_kernels", "native_for", "count_tensor",
    "merge_kernel", "default_workers", "worker_count", "in_workers", "native_walk",
    "inputs_digest", "digest_update",
]
