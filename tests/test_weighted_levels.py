"""The weighted (curvature-aware RAM) native kernel gives the same bits at every build level this host runs:
the AVX-512 loop, the portable vector loop (AVX2 / NEON / SSE) and its scalar tail, on lengths off the vector
widths, 1-8 agents, every input / importance / output dtype, with and without λ and ε, importances with zeros and
ties (tests/test_kernel_digests.py pins one setting's digests; this covers the rest)."""

from __future__ import annotations

import pytest
import torch

from ram_live.kernels import cc
import ram_live.methods.ram.native_weighted as weighted


def _levels() -> list[str]:
    if not cc.native_enabled():
        return []
    host = cc.host_level()
    return [
        lv
        for lv in ("avx512", "avx2", "neon", "scalar")
        if lv == host or lv == "scalar" or (lv == "avx2" and host == "avx512")
    ]


LEVELS = _levels()
pytestmark = pytest.mark.skipif(len(LEVELS) < 2, reason="needs the native kernels at two build levels")
DTYPES = (torch.float32, torch.bfloat16)


def _case(n: int, k: int, dtype: torch.dtype, hdtype: torch.dtype, g: torch.Generator):
    base = torch.randn(n, generator=g).to(dtype)
    agents = [
        torch.where(torch.rand(n, generator=g) < d, base + 0.01 * torch.randn(n, generator=g).to(dtype), base)
        for d in (0.3, 0.6, 0.9, 0.5, 0.2, 0.7, 0.4, 0.8)[:k]
    ]
    imps = [(torch.rand(n, generator=g) ** 3 * torch.randint(0, 2, (n,), generator=g)).to(hdtype) for _ in range(k)]
    if k > 1:
        imps[1][: n // 3] = imps[0][: n // 3]  # ties: equal importances of two agents
    return base, agents, imps


@pytest.mark.parametrize("n", [1, 7, 31, 33, 1000, 4099])
def test_weighted_kernel_same_bits_at_every_level(n):
    kernels = {lv: weighted.build(cc.flags(lv)) for lv in LEVELS}
    assert all(kernels.values()), f"a build failed: {[lv for lv, kn in kernels.items() if kn is None]}"
    g = torch.Generator().manual_seed(n)
    for k in (1, 2, 3, 5, 8):
        for dtype in DTYPES:
            for hdtype in DTYPES:
                base, agents, imps = _case(n, k, dtype, hdtype, g)
                for odt in DTYPES:
                    for lam in (None, torch.rand(k, generator=g) + 0.5):
                        for eps in (0.0, 1e-3):
                            got = {}
                            for lv, kn in kernels.items():
                                out = torch.zeros(n, dtype=odt)
                                bad = kn.merge_weighted(out, base, agents, imps, lam, eps, 0, n)
                                got[lv] = (out.view(torch.int16 if odt == torch.bfloat16 else torch.int32), bad)
                            ref_out, ref_bad = got[LEVELS[0]]
                            for lv, (out, bad) in got.items():
                                assert torch.equal(out, ref_out), (lv, n, k, dtype, hdtype, odt, lam, eps)
                                assert (bad == 0) == (ref_bad == 0) == True  # noqa: E712 - valid inputs


@pytest.mark.parametrize("bad_value", [-1.0, float("nan"), float("inf")])
def test_bad_importance_reported_at_every_level(bad_value):
    """A negative, NaN or Inf importance anywhere (vector lanes or the scalar tail) makes every level report."""
    kernels = {lv: weighted.build(cc.flags(lv)) for lv in LEVELS}
    g = torch.Generator().manual_seed(1)
    n = 1003
    base, agents, imps = _case(n, 3, torch.bfloat16, torch.float32, g)
    for at in (0, 17, n - 1):
        h = [x.clone() for x in imps]
        h[2][at] = bad_value
        for lv, kn in kernels.items():
            out = torch.zeros(n, dtype=torch.bfloat16)
            assert kn.merge_weighted(out, base, agents, h, None, 0.0, 0, n) > 0, (lv, at)
