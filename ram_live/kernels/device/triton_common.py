"""The Triton helpers every device kernel inlines: the agent ``t`` of eight pointer arguments (:func:`pick`), the
output's rounding (:func:`store_out`: to nearest even, as torch's ``copy_`` to a narrower dtype does, written by
hand for bfloat16 because Triton's interpreter truncates in ``.to(tl.bfloat16)``) and the invalid-entry count
(:func:`add_invalid`), and the loads and checks of a block that is either whole (no mask: the bulk of a tensor, read
with 128-bit vectors) or the tensor's last, partial block (``MASKED``): :func:`load`, :func:`inside`. Imported only
where Triton serves the device."""

from __future__ import annotations

import inspect

import triton
import triton.language as tl

__all__ = ["add_invalid", "inside", "jit", "load", "pick", "store_out"]

_ALIGNMENT_HINTS = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def jit(*, do_not_specialize: list[str], aligned_anyhow: tuple[str, ...] = ()):
    """``triton.jit`` specialising on neither the values of ``do_not_specialize`` nor the alignment of the pointers
    ``aligned_anyhow`` (one compiled kernel per kernel and dtype in a merge); a Triton without
    ``do_not_specialize_on_alignment`` specialises on their alignment (the same results, more compiles)."""
    if _ALIGNMENT_HINTS and aligned_anyhow:
        return triton.jit(do_not_specialize=do_not_specialize, do_not_specialize_on_alignment=list(aligned_anyhow))
    return triton.jit(do_not_specialize=do_not_specialize)


@triton.jit
def pick(t: tl.constexpr, p0, p1, p2, p3, p4, p5, p6, p7):
    """Argument ``t`` of the eight (``t`` known at compile time)."""
    if t == 0:
        return p0
    elif t == 1:
        return p1
    elif t == 2:
        return p2
    elif t == 3:
        return p3
    elif t == 4:
        return p4
    elif t == 5:
        return p5
    elif t == 6:
        return p6
    else:
        return p7


@triton.jit
def load(ptr, offs, inb, MASKED: tl.constexpr):
    """``ptr[offs]`` as float32: where ``MASKED``, zeros outside ``inb``; else a whole block, unmasked."""
    if MASKED:
        return tl.load(ptr + offs, mask=inb, other=0.0).to(tl.float32)
    else:
        return tl.load(ptr + offs).to(tl.float32)


@triton.jit
def inside(flags, inb, MASKED: tl.constexpr):
    """``flags`` (boolean) as int32, zero outside ``inb`` where ``MASKED``."""
    if MASKED:
        return (flags & inb).to(tl.int32)
    else:
        return flags.to(tl.int32)


@triton.jit
def store_out(out_ptr, offs, inb, value, OUT_BF16: tl.constexpr, MASKED: tl.constexpr):
    """Store float32 ``value`` rounded to nearest even (bfloat16: into the output's int16 bits); returns 1 where the
    stored value is NaN/Inf (in range ``inb``), else 0."""
    if OUT_BF16:
        bits = value.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(value != value, 0x7FC0, rounded)
        stored = rounded.to(tl.uint16).to(tl.int16, bitcast=True)
        bad = (rounded & 0x7F80) == 0x7F80
    else:
        stored = value.to(out_ptr.dtype.element_ty)
        back = stored.to(tl.float32)
        bad = (back != back) | (tl.abs(back) == float("inf"))
    if MASKED:
        tl.store(out_ptr + offs, stored, mask=inb)
    else:
        tl.store(out_ptr + offs, stored)
    return inside(bad, inb, MASKED)


@triton.jit
def add_invalid(bad_ptr, count):
    """Add a block's count of invalid entries to the tensor's int64 slot (no atomic where it found none)."""
    n = tl.sum(count, axis=0)
    tl.atomic_add(bad_ptr, n.to(tl.int64), mask=n > 0)
