"""Re-factorisation of a merged ΔW* into LoRA factors B A by truncated SVD."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .. import functional as F
from ..errors import ConfigError
from .factors import AdapterSet, module_of
from .report import AdapterMergeReport, ModuleReport
from .svd_options import SvdOptions


@dataclass
class Refactored:
    """What :func:`refactor` returns: ΔW ≈ B @ A.

    Attributes:
        A: [rank, in], √S Vᵀ.
        B: [out, rank], U√S.
        rank: the rank k kept.
        error: ‖ΔW − BA‖_F / ‖ΔW‖_F, measured (0 for ΔW = 0).
        svd: the SVD used, ``"exact"`` or ``"randomized"``.
        seconds: the time it took.
    """

    A: Tensor
    B: Tensor
    rank: int
    error: float
    svd: str
    seconds: float


def _energy_rank(s: Tensor, total: float, energy: float, cap: int) -> int:
    if total <= 0:
        return 1
    captured = torch.cumsum(s.double().pow(2), 0) / total
    reached = torch.nonzero(captured >= energy - 1e-12)
    k = int(reached[0, 0]) + 1 if reached.numel() else int(s.numel())
    return max(1, min(k, cap))


def refactor(
    delta: Tensor,
    rank: int | None = None,
    *,
    svd_options: SvdOptions | None = None,
    **svd_keywords: Any,
) -> Refactored:
    """Truncated SVD of ``delta`` ([out, in], B·A layout) into ``B`` [out, k] and ``A`` [k, in], split as
    B = U√S, A = √S Vᵀ.

    ``energy``: the smallest k whose singular values capture that fraction of ‖ΔW‖²_F, at most ``rank`` (or
    min(out, in)). ``svd="exact"``: ``torch.linalg.svd(full_matrices=False)``; ``"randomized"``:
    ``torch.svd_lowrank`` with q = k + ``oversample`` (default max(k, 16)) columns and ``niter`` power
    iterations, drawn from a generator seeded with ``seed`` (the global RNG is left as it was); ``"auto"``:
    randomized when q ≤ min(out, in) / 4, else exact. The error is measured, not estimated.

    Args:
        delta: the matrix ΔW.
        rank: k (capped at min(out, in)); the same as ``SvdOptions.rank``.
        svd_options: an :class:`SvdOptions`; or its fields as keywords, not both.
        **svd_keywords: the fields as keywords (``energy=``, ``svd=``, ``oversample=``, ``niter=``, ``seed=``).

    Returns:
        A :class:`Refactored`: ``A``, ``B``, the rank kept, the relative error, the SVD used, the seconds.

    Raises:
        ConfigError: an unknown or invalid SVD option, options given both ways, or neither ``rank`` nor ``energy``.

    Example:
        >>> out = refactor(delta, svd_options=SvdOptions(rank=8, svd="exact"))   # doctest: +SKIP
        >>> out.rank, out.error                                                  # doctest: +SKIP
        (8, 0.031)
    """
    t0 = time.perf_counter()
    if rank is not None:
        svd_keywords["rank"] = rank
    opts = SvdOptions.of(svd_options, where="refactor", **svd_keywords)
    rank, energy, svd, oversample, niter, seed = (
        opts.rank,
        opts.energy,
        opts.svd,
        opts.oversample,
        opts.niter,
        opts.seed,
    )
    m = delta.float()
    rows, cols = m.shape
    full = min(rows, cols)
    cap = min(rank, full) if rank is not None else full
    if rank is None and energy is None:
        raise ConfigError("pass rank= or energy=")
    extra = oversample if oversample is not None else max(cap, 16)
    q = min(full, cap + extra)
    kind = svd
    if kind == "auto":
        kind = "randomized" if 4 * q <= full else "exact"
    total = float(m.double().pow(2).sum())
    if kind == "exact":
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
    else:
        devices = [m.device] if m.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if m.device.type == "cuda":
                with torch.cuda.device(m.device):
                    torch.cuda.manual_seed(seed)
            torch.random.default_generator.manual_seed(seed)
            u, s, v = torch.svd_lowrank(m, q=q, niter=niter)
        vh = v.T
    k = _energy_rank(s, total, energy, cap) if energy is not None else min(cap, int(s.numel()))
    root = s[:k].clamp(min=0).sqrt()
    b = u[:, :k] * root
    a = root[:, None] * vh[:k]
    if total > 0:
        error = float(torch.linalg.matrix_norm(m - b @ a).double() / math.sqrt(total))
    else:
        error = 0.0
    return Refactored(a.contiguous(), b.contiguous(), k, error, kind, time.perf_counter() - t0)


@dataclass
class Refactorer:
    """on_module callback: re-factor each merged ΔW* and keep its (small) factors, by module name."""

    adapters: AdapterSet
    report: "AdapterMergeReport"
    options: SvdOptions
    factors: dict[str, Refactored] = field(default_factory=dict)

    def __call__(self, key: str, delta: Tensor) -> None:
        module = module_of(key)
        f = self.adapters.module(module)
        lora_layout = delta.T if f.transpose else delta
        seed = F.stable_seed("refactor", self.options.seed, module)
        out = refactor(lora_layout, svd_options=dataclasses.replace(self.options, seed=seed))
        self.factors[module] = out
        self.report.modules[module] = ModuleReport(
            shape=f.shape,
            kind=f.kind,
            adapters=self.adapters.targeting(module),
            rank=out.rank,
            error=out.error,
            svd=out.svd,
            seconds=out.seconds,
            norm=float(torch.linalg.matrix_norm(delta)),
        )
        self.report.refactor_seconds += out.seconds


def make_refactorer(adapters: AdapterSet, report: "AdapterMergeReport", options: SvdOptions) -> Refactorer:
    """The re-factoring callback; with neither ``rank`` nor ``energy``, the rank is the largest input rank."""
    if options.rank is None and options.energy is None:
        options = dataclasses.replace(options, rank=adapters.max_rank())
    return Refactorer(adapters, report, options)
