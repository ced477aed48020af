"""DARE's keep-mask on the device: ``u < density`` with ``u`` Triton's ``tl.rand(seed, i)`` (Philox-4x32, ten
rounds, keyed by the 64-bit seed, counter = the flat index ``i``), so that a mask depends on the seed and the entry
alone, not on the launch's grid. :func:`uniform` computes the same numbers with torch integer ops, for the ops'
torch implementations: the Triton kernels and the torch implementation draw the same masks bit for bit.

The CPU merge keeps drawing DARE's masks with ``torch.bernoulli`` from :func:`~ram_live.methods.dare.dare_generator`
(the same seed), so CPU and device masks differ, as CPU and CUDA generators always did.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["uniform", "keep_mask"]

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
#: ``tl.rand``'s factor from a non-negative int32 to [0, 1), rounded to float32 as Triton does.
_TO_UNIT = 4.6566127342e-10


def _mul32(a: int, b: Tensor) -> tuple[Tensor, Tensor]:
    """High and low 32 bits of ``a · b`` for 32-bit unsigned values held in int64 (the product wraps modulo 2^64,
    which keeps both halves' bits)."""
    product = b * a
    return (product >> 32) & _MASK32, product & _MASK32


def uniform(seed: int, start: int, end: int, device: torch.device) -> Tensor:
    """``tl.rand(seed, i)`` for the flat indices ``i`` in ``[start, end)`` (``end <= 2^31``), as float32.

    Example:
        >>> uniform(7, 0, 3, torch.device("cpu")).shape
        torch.Size([3])
    """
    c0 = torch.arange(start, end, dtype=torch.int64, device=device)
    c1 = torch.zeros_like(c0)
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(10):
        hi_b, lo_b = _mul32(_ROUND_B, c2)
        hi_a, lo_a = _mul32(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    signed = torch.where(c0 >= 1 << 31, c0 - (1 << 32), c0)  # the bits as int32
    signed = torch.where(signed < 0, ~signed, signed).to(torch.int32)
    return signed.to(torch.float32) * _TO_UNIT  # a Python scalar: rounded to float32, then one float32 product


def keep_mask(seed: int, start: int, end: int, density: float, device: torch.device) -> Tensor:
    """DARE's keep-mask of entries ``[start, end)`` as float32 ones and zeros: ``uniform < float32(density)``."""
    return (uniform(seed, start, end, device) < density).to(torch.float32)  # compared in float32
