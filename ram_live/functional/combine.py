"""Task vectors of a chunk and task arithmetic's combine (PEFT's ``task_arithmetic``)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["task_arithmetic_combine", "task_deltas_"]


def task_deltas_(out: Tensor, base: Tensor, agents: Sequence[Tensor]) -> Tensor:
    """Write ``agents[t] − base`` into ``out[t]`` in float32 (exact for bf16/fp16 inputs up to f32 rounding)."""
    for row, agent in zip(out, agents):
        if agent.device == row.device:
            torch.sub(agent, base, out=row)
        else:
            row.copy_(agent)
            row.sub_(base)
    return out


def task_arithmetic_combine(deltas: Tensor, weights: Tensor) -> Tensor:
    """Σ_t w_t τ_t (PEFT's ``task_arithmetic``)."""
    return (deltas * weights.to(deltas.dtype).view(-1, 1)).sum(dim=0)
