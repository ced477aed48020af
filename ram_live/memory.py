"""Fresh output tensors that fault in as 2 MiB pages.

A merge writes its output into new memory, and first-touch page faults (4 KiB each, zeroed by the kernel) cost
more than the merge itself on some hosts: 268 MB took 80–190 ms to fault in on this project's VM against 15–25 ms
to copy. With ``MADV_HUGEPAGE`` on the buffer before its first write (what PyTorch's ``THP_MEM_ALLOC_ENABLE=1``
does for every CPU allocation, which can only be set before torch starts) the same took 25–40 ms. The advice
only matters where transparent huge pages are in "madvise" (or "always") mode; the kernel may compact memory
to find huge pages, which can occasionally take longer. ``RAM_LIVE_HUGEPAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

import torch
from torch import Tensor

__all__ = ["empty", "advise_hugepages"]

_HUGE = 1 << 21
_MADV_HUGEPAGE = 14
#: Smallest buffer worth advising (a couple of huge pages).
MIN_BYTES = 4 << 20


@functools.cache
def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_hugepages(t: Tensor) -> Tensor:
    """Ask for huge pages under ``t``'s not yet touched CPU memory (the 2 MiB-aligned part of it); a no-op
    elsewhere, for small tensors, or with ``RAM_LIVE_HUGEPAGES=0``. Returns ``t``."""
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < MIN_BYTES or os.environ.get("RAM_LIVE_HUGEPAGES", "1") == "0":
        return t
    madvise = _madvise()
    if madvise is not None:
        start = (t.data_ptr() + _HUGE - 1) & ~(_HUGE - 1)
        end = (t.data_ptr() + nbytes) & ~(_HUGE - 1)
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failure changes nothing
    return t


def empty(shape: Any, *, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """``torch.empty`` whose CPU memory faults in as huge pages (see :func:`advise_hugepages`)."""
    return advise_hugepages(torch.empty(shape, dtype=dtype, device=device))
