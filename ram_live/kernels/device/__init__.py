"""Device kernels: one fused kernel per tensor for merges on accelerators, registered as ``torch.library`` custom
ops (``torch.ops.ram_live.*``) with fake implementations, so that torch.compile, FSDP and tracing see one op. Each
op runs its Triton kernel where Triton serves the tensors' device (CUDA/XPU; CPU tensors only under Triton's
interpreter, ``TRITON_INTERPRET=1``, which the tests use), else a whole-tensor torch implementation of the same
arithmetic. Every op counts the entries it finds invalid (NaN/Inf results, invalid importances) into an int64
slot on the device, which the engine reads once per pass (:mod:`ram_live.engine.checks`).

Modules: :mod:`.common` (Triton availability, the agents' pointer arguments, output rounding), :mod:`.ram`
(RAM's family: merge and counts). Nothing here imports the engine or a method.
"""
