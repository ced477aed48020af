"""TIES' trim thresholds selected on the device (:func:`select_magnitudes`): per agent, the k-th largest |τ| over a
whole tensor, k = int(density · numel) as :func:`ram_live.functional.magnitude_threshold` defines it, found by a
radix select over the float32 bits of |τ| in three digit passes (11, 11, 9 bits), each one multi-block launch over
all agents (``torch.ops.ram_live.radix_histogram_``), with no host read. The merge kernels derive each agent's
threshold from the three histograms themselves; :meth:`MagnitudeSelection.thresholds` gives them as a tensor.

Each pass runs the Triton kernel of :mod:`.select_triton` where Triton serves the device, else the same counts by
torch ops (scatter-adds into the histogram). Not ``from __future__ import annotations``: ``torch.library.custom_op``
reads the annotations as types.
"""

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...engine.ops import call_op
from .common import MAX_AGENTS, block_size, device_programs, launch, register_cap, triton_takes

__all__ = ["NBINS", "PASSES", "MagnitudeSelection", "select_magnitudes", "selection_rank", "triton_thresholds"]

#: Bins of each pass's histogram.
NBINS = 2048
#: Per digit pass: the shift of its digit, the digit's mask, and the shift above which an entry's bits must equal
#: those fixed by the earlier passes.
PASSES = ((20, 2047, 31), (9, 2047, 20), (0, 511, 9))
#: Warps per program of the histogram kernel (each step a 16-byte vector of every input per thread), and programs
#: per multiprocessor.
HIST_WARPS = 8
HIST_PROGRAMS_PER_SM = 2
#: Warps of the single program that selects a tensor's thresholds (every agent's scan side by side).
THRESHOLD_WARPS = 16
#: Entries per step of the torch implementation (bounds its scratch).
TORCH_STEP = 1 << 22


def selection_rank(density: float, numel: int) -> int:
    """Which entry an agent's trim keeps down to: k = int(density · numel) > 0 (the k-th largest |τ|), 0 for
    none (threshold inf), -1 for all (density >= 1).

    Example:
        >>> selection_rank(0.2, 10), selection_rank(0.01, 10), selection_rank(1.0, 10)
        (2, 0, -1)
    """
    if density >= 1.0:
        return -1
    return max(0, int(density * numel))


def _pow2(k: int) -> int:
    return max(2, 1 << (k - 1).bit_length())


@torch.library.custom_op("ram_live::radix_histogram_", mutates_args=("histograms",))
def radix_histogram_(base: Tensor, agents: list[Tensor], ranks: list[int], pass_index: int, histograms: Tensor) -> None:
    """Digit pass ``pass_index`` of the radix select: adds to ``histograms[pass_index]`` (int32 ``[3, K, NBINS]``)
    the counts of each selecting agent's (rank > 0) digit of |agent − base| among the entries that share the bits
    the earlier passes fixed."""
    takes = triton_takes([base, *agents], len(agents))
    args = (base, agents, ranks, pass_index, histograms)
    launch("radix_histogram_kernel", takes, _triton_histogram, _torch_histogram, *args)


@radix_histogram_.register_fake
def _(base, agents, ranks, pass_index, histograms) -> None:
    return None


def _triton_histogram(base: Tensor, agents: list[Tensor], ranks: list[int], pass_index: int, hist: Tensor) -> None:
    from .common import agent_args
    from .select_triton import radix_histogram_kernel

    k, numel = len(agents), base.numel()
    shift, digit_mask, match_shift = PASSES[pass_index]
    block = block_size([base, *agents], HIST_WARPS)
    radix_histogram_kernel[(device_programs(base.device, numel, block, HIST_PROGRAMS_PER_SM),)](
        base, *agent_args(agents), hist, numel, *_padded(ranks, 0),
        K=k, KP=_pow2(k), ACTIVE=_bitmask(r > 0 for r in ranks), PASS=pass_index, SHIFT=shift,
        DIGIT_MASK=digit_mask, MATCH_SHIFT=match_shift, BLOCK=block, num_warps=HIST_WARPS,
        **register_cap(base.device),
    )  # fmt: skip


def triton_thresholds(hist: Tensor, ranks: Sequence[int]) -> Tensor:
    """Each selecting agent's (rank > 0) threshold from the three passes' histograms, by one single-program launch
    of :func:`.select_triton.select_thresholds_kernel`: a float32 ``[K]`` tensor on the histograms' device whose
    other entries are undefined. For the merge kernels, once per tensor."""
    from .select_triton import select_thresholds_kernel

    k = len(ranks)
    thresholds = torch.empty(k, dtype=torch.float32, device=hist.device)
    select_thresholds_kernel[(1,)](
        hist,
        thresholds,
        *_padded(ranks, 0),
        K=k,
        KP=_pow2(k),
        TRIM=_bitmask(r > 0 for r in ranks),
        num_warps=THRESHOLD_WARPS,
    )
    return thresholds


def _padded(values: Sequence, fill) -> list:
    return [*values, *([fill] * (MAX_AGENTS - len(values)))]


def _bitmask(flags) -> int:
    return sum(1 << t for t, flag in enumerate(flags) if flag)


def _magnitude_bits(agent: Tensor, base_f: Tensor) -> Tensor:
    return (agent.to(torch.float32) - base_f).view(torch.int32) & 0x7FFFFFFF


def _torch_histogram(base: Tensor, agents: list[Tensor], ranks: list[int], pass_index: int, hist: Tensor) -> None:
    prefix = torch_select_state(hist, ranks, pass_index)[0] if pass_index else None
    shift, digit_mask, match_shift = PASSES[pass_index]
    numel = base.numel()
    for start in range(0, numel, TORCH_STEP):
        end = min(numel, start + TORCH_STEP)
        base_f = base[start:end].to(torch.float32)
        for t, agent in enumerate(agents):
            if ranks[t] <= 0:
                continue
            bits = _magnitude_bits(agent[start:end], base_f)
            digit = (bits >> shift) & digit_mask
            if prefix is not None:  # entries outside the earlier passes' bin go to an overflow bin
                digit = torch.where((bits >> match_shift) == prefix[t], digit, NBINS)
            counts = torch.zeros(NBINS + 1, dtype=torch.int32, device=base.device)
            counts.scatter_add_(0, digit.to(torch.int64), torch.ones_like(digit))
            hist[pass_index, t] += counts[:NBINS]


def torch_select_state(hist: Tensor, ranks: Sequence[int], passes: int) -> tuple[list[Tensor | None], list]:
    """:func:`.select_triton.select_state` in torch ops: per agent, the bits fixed by the first ``passes`` passes
    (a 0-d int32 tensor) and the rank left among the entries sharing them; None for agents that select nothing."""
    prefixes: list[Tensor | None] = []
    left: list = []
    for t, rank in enumerate(ranks):
        if rank <= 0:
            prefixes.append(None)
            left.append(None)
            continue
        prefix: Tensor | int = 0
        for p in range(passes):
            counts = hist[p, t].flip(0)
            above = counts.cumsum(0) < rank
            digit = NBINS - 1 - above.sum().to(torch.int32)
            rank = rank - (counts * above).sum().to(torch.int32)
            prefix = (prefix << (9 if p == 2 else 11)) | digit
        prefixes.append(prefix if isinstance(prefix, Tensor) else None)
        left.append(rank)
    return prefixes, left


@dataclass(frozen=True)
class MagnitudeSelection:
    """Each agent's trim threshold of one tensor, selected on the device.

    Attributes:
        ranks: per agent, :func:`selection_rank` (k > 0: the k-th largest |τ|; 0: none kept; -1: all kept).
        histograms: the radix passes' int32 ``[3, K, NBINS]`` counts, or None where no agent selects.
    """

    ranks: tuple[int, ...]
    histograms: Optional[Tensor]

    def thresholds(self, device: torch.device) -> Tensor:
        """The thresholds as a float32 ``[K]`` tensor on ``device`` (inf: none kept; 0: all kept), no host read."""
        out = torch.zeros(len(self.ranks), dtype=torch.float32, device=device)
        prefixes = torch_select_state(self.histograms, self.ranks, 3)[0] if self.histograms is not None else []
        for t, rank in enumerate(self.ranks):
            if rank == 0:
                out[t] = math.inf
            elif rank > 0:
                out[t] = prefixes[t].view(torch.float32)
        return out


def select_magnitudes(base: Tensor, agents: Sequence[Tensor], densities: Sequence[float]) -> MagnitudeSelection:
    """The radix select of each agent's top-``density`` magnitudes over the flat tensors (``densities``: one per
    agent), left on the device: three launches of ``radix_histogram_`` where an agent selects, none otherwise.

    Example:
        >>> select_magnitudes(torch.zeros(4), [torch.ones(4)], [1.0]).histograms is None
        True
    """
    ranks = tuple(selection_rank(d, base.numel()) for d in densities)
    if not any(r > 0 for r in ranks):
        return MagnitudeSelection(ranks, None)
    hist = torch.zeros(3, len(agents), NBINS, dtype=torch.int32, device=base.device)
    for p in range(len(PASSES)):
        call_op(radix_histogram_, base, list(agents), list(ranks), p, hist)
    return MagnitudeSelection(ranks, hist)
