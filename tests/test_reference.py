"""The naive reference itself follows the spec where the engine is tested against it."""

from __future__ import annotations

import math

import torch

from ram_live import merge
from tests.reference import ref_ram


def test_reference_rho_is_inf_for_an_agent_that_changed_nothing() -> None:
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(64, generator=g)}
    mover = {"w": base["w"] + torch.randn(64, generator=g)}
    idle = {"w": base["w"].clone()}
    for variant, r, alpha in (("ram_plus", 0.5, 2.0), ("ram_plus_soft", 0.5, 2.0)):
        expected, lam = ref_ram(base, [mover, idle], variant=variant, r=r, alpha=alpha)
        clip = {"alpha": alpha} if variant == "ram_plus" else {}  # RAM+s has no alpha
        merged, info = merge([mover, idle], base=base, method=variant, r=r, return_info=True, **clip)
        # ρ = +∞ for the idle agent: RAM+ clips it to α, RAM+s saturates at 1 (the spec), never ρ = 0.
        assert lam[1] == (1 + r * alpha if variant == "ram_plus" else 1 + r)
        assert info.lambdas is not None and math.isclose(list(info.lambdas.values())[1], lam[1])
        assert math.isinf(list(info.rho.values())[1])
        assert torch.equal(merged["w"], expected["w"])
