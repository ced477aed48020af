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

The package exports nothing of its own: import what you need from the module that defines it
(``from ram_live.engine.run import run_merge``; ``MergeInfo`` and ``Plan`` are in :mod:`ram_live.types`).
"""

