"""Checks a device merge keeps on the device (:class:`DeferredChecks`): each tensor's kernels add the number of
entries they find invalid (NaN/Inf inputs or results, invalid auxiliary values) into that tensor's slot of one
int64 buffer per device, and the engine reads the buffers once per pass. Where a slot is non-zero, the tensor is
read again and the usual check raises naming the tensor and the input at fault. On a CPU nothing is deferred:
the kernels check as they go (a host read there costs nothing)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["DeferredChecks", "deferred_device"]


def deferred_device(device: torch.device) -> bool:
    """Whether checks on ``device`` are deferred to the end of the pass (every device but the CPU and meta)."""
    return device.type not in ("cpu", "meta")


class DeferredChecks:
    """One pass's deferred checks over ``keys`` (the pass's tensors, in order).

    Example:
        >>> checks = DeferredChecks(["w"])
        >>> checks.slot(0, torch.device("cpu")) is None
        True
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = list(keys)
        #: The dtype each tensor was written in (a merged value that overflows is named in it).
        self.written: dict[str, torch.dtype] = {}
        self._buffers: dict[torch.device, Tensor] = {}
        self._slots: dict[torch.device, tuple[Tensor, ...]] = {}

    def slot(self, index: int, device: torch.device) -> Tensor | None:
        """The 0-d int64 slot of tensor ``index`` on ``device`` that its kernels add their invalid entries to,
        or None where checks are not deferred (the kernels then check and raise themselves)."""
        if not deferred_device(device):
            return None
        slots = self._slots.get(device)
        if slots is None:
            slots = self._slots[device] = self.buffer(device).unbind(0)  # every slot's view at once
        return slots[index]

    def buffer(self, device: torch.device) -> Tensor:
        """The int64 buffer of every slot on ``device`` (slot ``i`` at index ``i``), for kernels that merge many
        tensors in one launch."""
        buffer = self._buffers.get(device)
        if buffer is None:
            buffer = self._buffers[device] = torch.zeros(len(self.keys), dtype=torch.int64, device=device)
        return buffer

    def raise_first(self, recheck: Callable[[str], None]) -> None:
        """Read every buffer (one device-to-host read per device) and call ``recheck(key)`` for the first tensor
        whose slot is non-zero: it reads that tensor again and raises naming the input at fault."""
        if not self._buffers:
            return
        flagged: list[int] = []
        for buffer in self._buffers.values():
            if bool(buffer.any()):  # the one read of the pass on this device
                flagged += [i for i, n in enumerate(buffer.cpu().tolist()) if n]
        for index in sorted(flagged):
            recheck(self.keys[index])
