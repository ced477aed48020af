"""Live bf16 modules built on the device: a base of square bias-free Linear layers plus a norm weight, and K
agents that are the base plus sparse deltas of different densities, all drawn from seeded generators on that
device (nothing moves over PCIe while the inputs are built)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["DENSITIES", "Sizes", "Stack", "build", "importances", "nbytes", "sizes_for", "subset"]

#: Agent t's share of changed entries: the RAM paper's three agents (as in ``bench_merge.DENSITIES``).
DENSITIES = (0.03, 0.46, 0.54)
SEED = 1234


@dataclass(frozen=True)
class Sizes:
    """``layers`` Linear layers of ``hidden`` x ``hidden`` (bf16), plus one norm weight of ``hidden``."""

    hidden: int
    layers: int

    @property
    def params(self) -> int:
        return self.layers * self.hidden * self.hidden + self.hidden


def sizes_for(params: int | None, small: bool) -> Sizes:
    """Hidden 4096 and as many layers as make ``params`` (default about 1.5 B); ``small``: hidden 128, a few layers."""
    if small:
        return Sizes(128, max(2, round((params or 6 * 128 * 128) / (128 * 128))))
    hidden = 4096 if (params or 1_500_000_000) >= 4096 * 4096 * 2 else 1024
    return Sizes(hidden, max(2, round((params or 1_500_000_000) / (hidden * hidden))))


class Stack(nn.Module):
    """A stack of square Linear layers (no bias) and a norm weight: the shape of a transformer's big tensors."""

    def __init__(self, sizes: Sizes) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(sizes.hidden, sizes.hidden, bias=False) for _ in range(sizes.layers))
        self.norm = nn.Parameter(torch.empty(sizes.hidden))


def _empty(sizes: Sizes, device: torch.device) -> Stack:
    with torch.device("meta"):
        module = Stack(sizes)
    return module.to_empty(device=device).to(torch.bfloat16).requires_grad_(False)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@torch.no_grad()
def build(sizes: Sizes, device: torch.device, k: int = 3, seed: int = SEED) -> tuple[Stack, list[Stack]]:
    """The base and ``k`` agents on ``device``. A changed entry moves by at least max(|w|/64, 1e-4) (as in
    ``bench_merge.build_inputs``): it survives bf16 rounding and its delta exceeds RAM's eps, so every changed
    entry is active and every other entry has delta exactly 0. Masks are independent across agents."""
    if k > len(DENSITIES):
        raise ValueError(f"at most {len(DENSITIES)} agents")
    base = _empty(sizes, device)
    agents = [_empty(sizes, device) for _ in range(k)]
    for index, (name, p) in enumerate(base.named_parameters()):
        g = _generator(device, seed * 1_000_003 + index)
        w = torch.randn(p.shape, generator=g, device=device)
        w.mul_(0.05).add_(1.0) if name == "norm" else w.mul_(0.02)
        p.copy_(w)
        w = p.float()
        step = w.abs().div_(32.0).clamp_(min=2e-4)
        for t, agent in enumerate(agents):
            u = torch.rand(p.shape, generator=g, device=device)
            z = torch.randn(p.shape, generator=g, device=device)
            z = torch.where(z >= 0, z + 0.5, z - 0.5)
            moved = torch.addcmul(w, z, step).to(torch.bfloat16)
            agent.get_parameter(name).copy_(torch.where(u < DENSITIES[t], moved, p))
            del u, z, moved
        del w, step
    return base, agents


@torch.no_grad()
def importances(base: nn.Module, k: int, seed: int = SEED + 1) -> dict[str, dict[str, torch.Tensor]]:
    """Per agent (``agent_0`` ...), bf16 importances > 0 spread over four decades, on the base's device."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for t in range(k):
        per: dict[str, torch.Tensor] = {}
        for index, (name, p) in enumerate(base.named_parameters()):
            g = _generator(p.device, seed * 1_000_003 + 97 * t + index)
            per[name] = (
                torch.rand(p.shape, generator=g, device=p.device)
                .mul_(4 * math.log(10))
                .exp_()
                .mul_(1e-6)
                .to(torch.bfloat16)
            )
        out[f"agent_{t}"] = per
    return out


def subset(
    module: nn.Module | dict[str, torch.Tensor], keys: list[str], device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """The named tensors of a module or state dict, copied to ``device`` (a state dict)."""
    sd = module.state_dict() if isinstance(module, nn.Module) else module
    return {k: sd[k].detach().to(device, copy=True) for k in keys}


def nbytes(obj: nn.Module | dict[str, torch.Tensor]) -> int:
    """Bytes of a module's parameters or a state dict's tensors."""
    tensors = obj.parameters() if isinstance(obj, nn.Module) else obj.values()
    return sum(t.numel() * t.element_size() for t in tensors)
