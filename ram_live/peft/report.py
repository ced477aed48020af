"""What an adapter merge did: per adapter density, ρ and λ; per module rank and re-factorisation error."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..methods.ram.config import RamConfig


@dataclass
class ModuleReport:
    """One module of the merged adapter: its shape, its rank, and the re-factorisation's relative error.

    Attributes:
        shape: B·A's shape ``(out, in)``.
        kind: ``"linear"`` or ``"embedding"``.
        adapters: the adapters that target the module.
        rank: the re-factored rank k.
        error: the relative Frobenius error ‖ΔW* − B A‖ / ‖ΔW*‖ (0 for ΔW* = 0).
        svd: the SVD used, ``"exact"`` or ``"randomized"``.
        seconds: the time its re-factorisation took.
        norm: ‖ΔW*‖_F, the merged delta's norm (it weighs the module in :attr:`AdapterMergeReport.error`).
    """

    shape: tuple[int, int]
    kind: str
    adapters: tuple[str, ...]
    rank: int | None = None
    error: float | None = None
    svd: str | None = None
    seconds: float = 0.0
    norm: float = 0.0


@dataclass
class AdapterMergeReport:
    """What :func:`ram_merge_adapters` / :func:`ram_merge_adapter_files` did.

    ``density``: per adapter, the fraction of its ΔW entries with |Δ| > eps (over the modules it targets);
    ``active``: the fraction the activity rule kept; ``modules``: per module rank and relative Frobenius error
    of the re-factorisation (``None`` with ``into_base=True``); λ and ρ per adapter for RAM+.

    Attributes:
        adapters, target: the merged adapters' names and where the merge went (``"base weights"``,
            ``"adapter 'name'"`` or ``"adapter folder <out>"``).
        method, config: the merge method and its config.
        sparsify: the activity rule (its ``str``), None for |Δ| > eps.
        density, active, lambdas, rho: per adapter (see above; ``lambdas`` / ``rho`` None unless RAM+).
        modules: per module name, its :class:`ModuleReport`.
        merge_seconds, refactor_seconds, seconds: the time merging, re-factoring and in all took.

    >>> print(ram_merge_adapters(peft_model, ["code", "tool"], "merged").table())   # doctest: +SKIP
    """

    adapters: tuple[str, ...]
    target: str
    method: str = ""
    config: Any = None
    sparsify: str | None = None
    density: dict[str, float] = field(default_factory=dict)
    active: dict[str, float] = field(default_factory=dict)
    lambdas: dict[str, float] | None = None
    rho: dict[str, float] | None = None
    modules: dict[str, ModuleReport] = field(default_factory=dict)
    merge_seconds: float = 0.0
    refactor_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def max_error(self) -> float:
        errors = [m.error for m in self.modules.values() if m.error is not None]
        return max(errors) if errors else 0.0

    @property
    def error(self) -> float:
        """The whole adapter's relative error: sqrt(Σ err_m² ‖ΔW*_m‖²) / sqrt(Σ ‖ΔW*_m‖²)."""
        num = sum((m.error or 0.0) ** 2 * m.norm**2 for m in self.modules.values())
        den = sum(m.norm**2 for m in self.modules.values())
        return math.sqrt(num / den) if den > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready plain values.

        Returns:
            The fields (tuples as lists, an infinite ρ as ``"inf"``, RAM's config as its flat keywords) plus
            ``error``, ``max_error`` and ``seconds: {"merge", "refactor", "total"}``.
        """

        def num(x: float | None) -> float | None | str:
            return None if x is None else ("inf" if math.isinf(x) else float(x))

        if isinstance(self.config, RamConfig):
            config = self.config.record()  # RAM's config as its flat keywords
        else:
            config = self.config.__dict__ if hasattr(self.config, "__dict__") else self.config
        return {
            "adapters": list(self.adapters),
            "target": self.target,
            "method": self.method,
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (config or {}).items()},
            "sparsify": self.sparsify,
            "density": dict(self.density),
            "active": dict(self.active),
            "lambdas": dict(self.lambdas) if self.lambdas else None,
            "rho": {k: num(v) for k, v in self.rho.items()} if self.rho else None,
            "error": self.error,
            "max_error": self.max_error,
            "modules": {
                name: {
                    "shape": list(m.shape),
                    "kind": m.kind,
                    "adapters": list(m.adapters),
                    "rank": m.rank,
                    "error": m.error,
                    "svd": m.svd,
                    "seconds": m.seconds,
                    "norm": m.norm,
                }
                for name, m in self.modules.items()
            },
            "seconds": {"merge": self.merge_seconds, "refactor": self.refactor_seconds, "total": self.seconds},
        }

    def table(self) -> str:
        """A human-readable summary.

        Returns:
            Lines: per adapter density, active fraction, ρ and λ; per module shape, rank, error and SVD (when
            re-factored); the timings.
        """
        lines = [
            f"{self.method} of {len(self.adapters)} adapters -> {self.target}"
            + (f"  (activity rule: {self.sparsify})" if self.sparsify else "  (activity rule: |Δ| > eps)")
        ]
        lines.append(f"{'adapter':<20} {'density':>9} {'active':>9} {'rho':>8} {'lambda':>8}")
        for a in self.adapters:
            rho = self.rho.get(a) if self.rho else None
            lam = self.lambdas.get(a) if self.lambdas else None
            lines.append(
                f"{a:<20} {100 * self.density.get(a, 0):8.2f}% {100 * self.active.get(a, 0):8.2f}% "
                f"{'-' if rho is None else f'{rho:.3f}':>8} {'-' if lam is None else f'{lam:.4f}':>8}"
            )
        if any(m.rank is not None for m in self.modules.values()):
            lines.append(f"{'module':<48} {'shape':>12} {'rank':>5} {'rel. error':>11} {'svd':>10}")
            for name, m in self.modules.items():
                shape = "x".join(map(str, m.shape))
                lines.append(f"{name[-48:]:<48} {shape:>12} {m.rank:>5} {m.error:11.3e} {m.svd:>10}")
            lines.append(f"whole adapter: relative error {self.error:.3e} (max per module {self.max_error:.3e})")
        lines.append(
            f"time: merge {self.merge_seconds:.3f} s, re-factor {self.refactor_seconds:.3f} s, "
            f"total {self.seconds:.3f} s"
        )
        return "\n".join(lines)
