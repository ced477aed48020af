"""The streaming executor: plan and check, (pass 1) gather statistics, (pass 2) merge tensor by tensor, chunk by
chunk; a method that declares a merge in one read (RAM+ with global ρ into memory) runs that instead.

One module per job: :mod:`.plan` (what happens to each key), :mod:`.reader` (reading a key from every input),
:mod:`.stream` (one tensor's task vectors, chunk by chunk), :mod:`.threads` (the workers and their pool),
:mod:`.dispatch` (which kernel runs a tensor: a method's declared fast path, else its accumulator or ``combine``)
with :mod:`.counts` and :mod:`.merges` (the engine's own runners), :mod:`.compiling` (``compile=`` and the cache of
compiled builds), :mod:`.passes` (statistics, dry run, merge), :mod:`.results` (what a merge may reuse) and
:mod:`.run` (:func:`run_merge`, orchestration). The engine knows no method by name: what it runs besides a
method's ``combine`` is what the method declares (:class:`~ram_live.methods.base.MethodKernels`).

Each tensor's chunks feed the method's stateless ``combine`` (or its accumulator, or the fast paths it
declares), which turns them into τ*; τ* is added to the base and written in the base's dtype. Entries with
τ* = 0 keep the base's exact bits.

The package exports nothing of its own: import what you need from the module that defines it
(``from ram_live.engine.run import run_merge``; ``MergeInfo`` and ``Plan`` are in :mod:`ram_live.types`).
"""
