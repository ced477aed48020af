"""LoRA factors: one adapter's for one module, every adapter's by module, and their consistency."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from ..errors import InputMismatchError


@dataclass
class Factor:
    """One adapter's LoRA factors for one module: ΔW = scaling · B @ A ([out, in], "B·A layout").

    ``transpose``: the module's weight is stored as ΔWᵀ (``fan_in_fan_out`` linears, embeddings).
    """

    A: Tensor
    B: Tensor
    scaling: float
    kind: Literal["linear", "embedding"]
    transpose: bool

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """B·A's shape [out, in]."""
        return int(self.B.shape[0]), int(self.A.shape[1])

    @property
    def weight_shape(self) -> tuple[int, int]:
        return (self.shape[1], self.shape[0]) if self.transpose else self.shape

    def delta(self, device: torch.device | None = None, layout: Literal["weight", "lora"] = "weight") -> Tensor:
        """ΔW in float32, contiguous, in the weight's layout (default) or B·A's."""
        dev = device or self.B.device
        b = self.B.detach().to(device=dev, dtype=torch.float32)
        a = self.A.detach().to(device=dev, dtype=torch.float32)
        out = (a.T @ b.T) if (self.transpose and layout == "weight") else (b @ a)
        return out.mul_(self.scaling)


def weight_key(module: str) -> str:
    return f"{module}.weight"


def module_of(key: str) -> str:
    return key[: -len(".weight")]


@dataclass
class AdapterSet:
    """Every adapter's factors, by module, plus the order of the modules and what each adapter's config was."""

    names: tuple[str, ...]
    factors: dict[str, dict[str, Factor]]  # adapter -> module -> factor
    order: list[str]
    configs: dict[str, Any]
    saved_weights: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # adapter -> base key -> tensor

    def module(self, name: str) -> Factor:
        return next(self.factors[a][name] for a in self.names if name in self.factors[a])

    def max_rank(self) -> int:
        return max(f.rank for per in self.factors.values() for f in per.values())

    def targeting(self, module: str) -> tuple[str, ...]:
        return tuple(a for a in self.names if module in self.factors[a])


def check_consistent(adapters: AdapterSet) -> None:
    for module in adapters.order:
        ref_name = next(a for a in adapters.names if module in adapters.factors[a])
        ref = adapters.factors[ref_name][module]
        for a in adapters.names:
            f = adapters.factors[a].get(module)
            if f is None:
                continue
            if f.shape != ref.shape or f.kind != ref.kind or f.transpose != ref.transpose:
                raise InputMismatchError(
                    f"module {module!r}: adapter {a!r} has a {f.kind} ΔW of shape {list(f.shape)} "
                    f"(transposed={f.transpose}), adapter {ref_name!r} a {ref.kind} of shape {list(ref.shape)} "
                    f"(transposed={ref.transpose}); were they trained on the same base model?",
                    key=module,
                    agent=a,
                )
            if f.B.shape[1] != f.rank:
                raise InputMismatchError(
                    f"module {module!r} of adapter {a!r}: lora_B has {f.B.shape[1]} columns, lora_A {f.rank} rows",
                    key=module,
                    agent=a,
                )
