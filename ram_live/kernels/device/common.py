"""What every device kernel shares: whether Triton serves a device (:func:`triton_serves`), the agents' tensors as
kernel arguments (:data:`MAX_AGENTS` pointers, :func:`agent_args`) and the output as a kernel writes it
(:func:`kernel_out`). Torch only: the Triton helpers live in :mod:`.triton_common`."""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Sequence

import torch
from torch import Tensor

__all__ = [
    "INPUT_DTYPES",
    "MAX_AGENTS",
    "MAX_NUMEL",
    "OUT_DTYPES",
    "agent_args",
    "device_programs",
    "kernel_out",
    "triton_serves",
    "triton_takes",
]

#: The most agents one kernel launch takes (one pointer argument each); more agents merge through the torch
#: implementation of the same op.
MAX_AGENTS = 8
#: Output dtypes the kernels round to themselves, and the input dtypes they read.
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Some kernels index in int32 (and draw DARE's masks from 32-bit counters): tensors of at least this many entries
#: take the torch implementations.
MAX_NUMEL = 1 << 31


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_serves(device: torch.device) -> bool:
    """Whether the Triton kernels run on tensors of ``device``: CUDA/XPU where Triton is installed; CPU only under
    Triton's interpreter (``TRITON_INTERPRET=1``, for tests).

    Example:
        >>> triton_serves(torch.device("meta"))
        False
    """
    if not _triton_installed():
        return False
    if device.type in ("cuda", "xpu"):
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def agent_args(tensors: Sequence[Tensor | None]) -> list[Tensor | None]:
    """``tensors`` padded with None to :data:`MAX_AGENTS` pointer arguments (a kernel reads the first K)."""
    return [*tensors, *([None] * (MAX_AGENTS - len(tensors)))]


def kernel_out(out: Tensor) -> tuple[Tensor, bool]:
    """The output as the kernel writes it: bfloat16 as its int16 bits (rounded by the kernel), else as it is."""
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16), True
    return out, False


def triton_takes(tensors: Sequence[Tensor], k: int) -> bool:
    """Whether the Triton kernels take these flat tensors (inputs, and the output where given) of ``k`` agents: on
    one device Triton serves, contiguous, of :data:`INPUT_DTYPES`, at most :data:`MAX_AGENTS` agents."""
    device = tensors[0].device
    return (
        triton_serves(device)
        and 0 < k <= MAX_AGENTS
        and tensors[0].numel() < MAX_NUMEL
        and all(t.device == device and t.is_contiguous() and t.dtype in INPUT_DTYPES for t in tensors)
    )


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def device_programs(device: torch.device, numel: int, block: int, per_sm: int) -> int:
    """Programs of a kernel whose programs walk strided shares of ``numel`` entries, ``block`` at a time:
    ``per_sm`` per multiprocessor at most (each then adds its sums once)."""
    return max(1, min(-(-numel // block), _multiprocessors(device) * per_sm))
