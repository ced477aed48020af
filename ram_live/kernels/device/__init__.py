"""Device kernels: one fused kernel per tensor for merges on accelerators, registered as ``torch.library`` custom
ops (``torch.ops.ram_live.*``) with fake implementations, so that torch.compile, FSDP and tracing see one op. Each
op runs its Triton kernel where Triton serves the tensors' device (CUDA/XPU; CPU tensors only under Triton's
interpreter, ``TRITON_INTERPRET=1``, which the tests use), else a whole-tensor torch implementation of the same
arithmetic. Every op counts the entries it finds invalid (NaN/Inf results, invalid importances) into an int64
slot on the device, which the engine reads once per pass (:mod:`ram_live.engine.checks`).

Modules: :mod:`.common` (which tensors Triton takes, the agents' pointer arguments, programs per device, the
launch that falls back where a kernel cannot be built), :mod:`.triton_common` (the jit helpers: rounding, invalid
counts), :mod:`.ram_triton` (RAM's merge) and :mod:`.counts_triton` (the activity counts of RAM's statistics pass
and of the probe; their ops live in ``ram_live/methods/ram/device.py`` and ``ram_live/probe_device.py``),
:mod:`.linear` (task arithmetic, linear, DARE-linear), :mod:`.select` (TIES' threshold by radix select),
:mod:`.ties` (TIES and DARE-TIES), :mod:`.philox` (DARE's drop, the same in torch and Triton), :mod:`.edges` (the
inputs' first and last entries a pass's digest hashes, gathered in one launch); each op's Triton code in
``<name>_triton.py`` (the grouped launches' in ``group_*_triton.py``). Nothing here imports the engine or a method.
"""
