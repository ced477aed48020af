"""Fresh output buffers that fault in as 2 MiB pages.

First-touch page faults (4 KiB each, zeroed by the kernel) of new memory can cost more than the pass that fills
it: 268 MB took 80–190 ms to fault in on this project's VM against 15–25 ms to copy. With ``MADV_HUGEPAGE`` on the
buffer before its first write (what PyTorch's ``THP_MEM_ALLOC_ENABLE=1`` does for every CPU allocation, which can
only be set before torch starts) the same took 25–40 ms — but the kernel may stop to compact memory to find huge
pages, which made whole merges 2–4 × slower now and then. Measured on merges (6 runs, 134 M × 3): with the advice
0.08–0.36 s, without 0.15–0.18 s, the same median; on snapshot captures (best of 11) the advice kept 50 % density
at 1.71–1.75 × copy_ against 1.75–2.21 × without. So the advice is a per-call-site default: on for the capture's
buffers and RAM+'s owner maps (33 MiB: 3.3 ms to fill instead of 10.9 ms), off for merge outputs.
``RAM_LIVE_HUGEPAGES=1`` / ``=0`` forces it on / off everywhere. It only matters where transparent huge pages are
in "madvise" (or "always") mode.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

import torch
from torch import Tensor

from .. import settings

__all__ = ["empty", "advise_hugepages", "hugepages_wanted"]

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


#: ``RAM_LIVE_HUGEPAGES`` ("1"/"0") if set, else the call site's ``default`` (read in :mod:`ram_live.settings`).
hugepages_wanted = settings.hugepages


def advise_hugepages(t: Tensor, default: bool = True) -> Tensor:
    """Ask for huge pages under ``t``'s not yet touched CPU memory (the 2 MiB-aligned part of it) where
    :func:`ram_live.settings.hugepages`; a no-op elsewhere and for small tensors. Returns ``t``."""
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < MIN_BYTES or not settings.hugepages(default):
        return t
    madvise = _madvise()
    if madvise is not None:
        start = (t.data_ptr() + _HUGE - 1) & ~(_HUGE - 1)
        end = (t.data_ptr() + nbytes) & ~(_HUGE - 1)
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failure changes nothing
    return t


def empty(shape: Any, *, dtype: torch.dtype, device: torch.device | str, hugepages: bool = True) -> Tensor:
    """``torch.empty`` whose CPU memory faults in as huge pages (see :func:`advise_hugepages`; ``hugepages`` is
    the default when ``RAM_LIVE_HUGEPAGES`` is unset)."""
    return advise_hugepages(torch.empty(shape, dtype=dtype, device=device), hugepages)
