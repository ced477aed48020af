"""What the native merge and probe kernels take, shared by their bindings: float32/bfloat16 inputs (:data:`DTYPES`,
the codes the C sources switch on), at most :data:`MAX_AGENTS` agents, flat contiguous CPU tensors
(:func:`supports`), built with this host's :data:`FLAGS`."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from . import cc

__all__ = ["DTYPES", "FLAGS", "MAX_AGENTS", "supports"]

MAX_AGENTS = 32
DTYPES = {torch.float32: 0, torch.bfloat16: 1}

#: The flags of this host's build level (:func:`ram_live.kernels.cc.flags`): AVX-512 (F, BW, DQ) loops where the CPU
#: has them, the portable vector loops (AVX2, NEON, baseline) elsewhere.
FLAGS = cc.flags() if cc.native_enabled() else cc.COMMON_FLAGS


def supports(out: Tensor | None, base: Tensor, agents: Sequence[Tensor]) -> bool:
    """Whether the kernels take these flat tensors: CPU, contiguous, one input dtype of float32/bfloat16, an
    output of either, at most :data:`MAX_AGENTS` agents."""
    tensors = [base, *agents] + ([] if out is None else [out])
    return (
        base.dtype in DTYPES
        and 0 < len(agents) <= MAX_AGENTS
        and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)
        and all(a.dtype == base.dtype for a in agents)
        and (out is None or out.dtype in DTYPES)
    )
