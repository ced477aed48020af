"""Every path of RAM's room against its reference (``ram_live.methods.ram.reference.ram_combine``) in one table:
the eager accumulator, the fused expression ``compile=True`` compiles (run eagerly here), the native kernels (plain
and importance-weighted), the single read (merge as RAM while counting, then λ) and the stacked ``combine``. Each
is within float32 rounding of the float64 reference; every fast path gives the accumulator's bits."""

from __future__ import annotations

import itertools

import pytest
import torch

from ram_live.methods.ram import native, native_weighted
from ram_live.methods.ram.accumulators import RamAccumulator, WeightedRamAccumulator
from ram_live.methods.ram.compiled import ram_fused_, ram_fused_weighted_
from ram_live.methods.ram.reference import ram_combine

EPS = 1e-5
N = 2053  # not a multiple of 32 or of a vector width: every kernel's tail runs
CASES = list(itertools.product([2, 3, 5], [False, True], [False, True], [False, True]))  # k, λ, sign, importance


def _inputs(k: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """A float32 base, k agents that each move a random part of it (overlapping: shared and unique entries, some
    moves under EPS, some in opposite directions), λ per agent and non-negative importances."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(N, generator=g)
    base[:17] = -0.0
    agents = []
    for t in range(k):
        moved = torch.rand(N, generator=g) < (0.3 + 0.1 * t)
        tau = torch.randn(N, generator=g) * 0.05 * moved
        tau[t * 40 : t * 40 + 8] = 0.5 * EPS  # under the threshold: inactive
        agents.append(base + tau)
    lambdas = 1.0 + torch.rand(k, generator=g)
    importances = torch.rand(k, N, generator=g) * 4
    importances[:, :64] = 0.0  # every active importance 0 there: the plain mean
    return base, agents, lambdas, importances


def _deltas(base: torch.Tensor, agents: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([torch.hardshrink((a.to(dtype) - base.to(dtype)), EPS) for a in agents])


def _accumulator(base, agents, lambdas, sign, importances) -> torch.Tensor:
    cls = RamAccumulator if importances is None else WeightedRamAccumulator
    acc = cls(N, len(agents), torch.device("cpu"), lambdas=None if lambdas is None else lambdas.tolist(), sign=sign)
    acc.begin(N)
    for t, delta in enumerate(_deltas(base, agents, torch.float32)):
        acc.add(t, delta) if importances is None else acc.add(t, delta, importance=importances[t])
    return acc.merged(base).clone()


def _paths(base, agents, lambdas, sign, importances) -> dict[str, torch.Tensor]:
    """θ* by every fast path that takes this case (the native ones where they build here)."""
    out: dict[str, torch.Tensor] = {}
    fused = torch.empty(N)
    if importances is None:
        ram_fused_(fused, base, agents, lambdas, EPS, sign)
    else:
        ram_fused_weighted_(fused, base, agents, list(importances), lambdas, EPS, sign)
    out["compiled expression"] = fused
    plain = native.kernels()
    if importances is None and plain is not None:
        merged = torch.empty(N)
        assert plain.merge(merged, base, agents, lambdas, EPS, 0, N, sign=sign) == 0
        out["native"] = merged
        if lambdas is not None and not sign:
            once = torch.empty(N)
            planes = torch.empty(native.planes_numel(N, len(agents)), dtype=torch.int32)
            active, unique = torch.zeros(len(agents), dtype=torch.int64), torch.zeros(len(agents), dtype=torch.int64)
            assert plain.merge_unscaled(once, base, agents, EPS, 0, N, planes, active, unique) == 0
            assert plain.rescale(once, base, planes, lambdas, 0, N) == 0
            out["single read"] = once
    weighted = native_weighted.kernels()
    if importances is not None and weighted is not None:
        merged = torch.empty(N)
        assert weighted.merge_weighted(merged, base, agents, list(importances), lambdas, EPS, 0, N, sign=sign) == 0
        out["native weighted"] = merged
    return out


@pytest.mark.parametrize("k, scaled, sign, weighted", CASES)
def test_every_path_is_the_reference_and_the_fast_paths_are_the_accumulators_bits(k, scaled, sign, weighted):
    base, agents, lambdas, importances = _inputs(k, seed=k * 8 + scaled * 4 + sign * 2 + weighted)
    lam = lambdas if scaled else None
    imp = importances if weighted else None
    reference = base.double() + ram_combine(
        _deltas(base, agents, torch.float64),
        None if lam is None else lam.double(),
        None if imp is None else imp.double(),
        sign=sign,
    )
    eager = _accumulator(base, agents, lam, sign, imp)
    stacked = base + ram_combine(_deltas(base, agents, torch.float32), lam, imp, sign=sign)
    for name, value in {"accumulator": eager, "stacked combine": stacked}.items():
        torch.testing.assert_close(value.double(), reference, rtol=2e-7, atol=2e-8, msg=name)
    paths = _paths(base, agents, lam, sign, imp)
    assert "compiled expression" in paths
    for name, value in paths.items():
        assert torch.equal(value, eager), f"{name}: {int((value != eager).sum())} entries differ from the accumulator"
    untouched = torch.stack([a != base for a in agents]).sum(0) == 0
    assert torch.equal(eager[untouched].view(torch.int32), base[untouched].view(torch.int32))  # the base's bits
