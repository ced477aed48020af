"""Curvature-aware RAM on the native (AVX-512 and portable) and compiled kernels: the eager torch path's bits."""

from __future__ import annotations

import pytest
import torch

import ram_live.methods.ram.native_weighted as wnative
import ram_live.methods.ram.native as native
from ram_live import merge
from ram_live.engine.compiling import compiler_available
from tests.conftest import assert_bit_identical
from tests.test_importance import VARIANTS, _agents, _base, _eager, _importances, reference
from tests.test_ram_native import _accumulated, _builds, _check_ranges, _check_sign_is_plain, _conflicting

needs_kernels = pytest.mark.skipif(
    wnative.kernels() is None or native.kernels() is None, reason="no C compiler: native kernels unavailable"
)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("imp_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_native_equals_eager_bits(monkeypatch, dtype, imp_dtype, out_dtype, k):
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)  # several ranges per tensor, shared by two threads
    base = _base(dtype)
    agents = _agents(base, densities=(0.4, 0.5, 0.6, 0.3, 0.7)[:k])
    importance = _importances(base, list(agents), dtype=imp_dtype)
    for case in VARIANTS:
        kw = dict(importance=importance, dtype=out_dtype, workers=2, return_info=True, **case)
        fast, info = merge(agents, base, **kw)
        slow, slow_info = _eager(monkeypatch, merge, agents, base, **kw)
        assert info.extra["kernels"] == {"native": 3}, info.extra
        assert slow_info.extra["kernels"] == {"eager": 3}
        assert_bit_identical(fast, slow)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("imp_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plus", [False, True])
def test_vector_and_portable_builds_give_the_same_bits(dtype, imp_dtype, plus):
    builds = _builds(wnative)
    assert builds["portable"] is not None and builds["portable"].simd_bits == 0
    from ram_live.kernels import cc

    # the level the native build is made for: the CPU's, or what RAM_LIVE_SIMD asks of it
    assert builds["native"].simd_bits == (512 if cc.build_level() == "avx512" else 0)
    base = _base(dtype)
    agents = _agents(base, densities=(0.4, 0.5, 0.6, 0.3))
    importance = _importances(base, list(agents), dtype=imp_dtype)
    lambdas = torch.tensor([1.1, 1.2, 0.9, 1.3]) if plus else None
    for out_dtype in (torch.float32, torch.bfloat16):
        results = {}
        for name, kernels in builds.items():
            b = base["v"]
            out = torch.empty(b.numel(), dtype=out_dtype)
            bad = kernels.merge_weighted(
                out, b, [a["v"] for a in agents.values()], [h["v"] for h in importance.values()], lambdas, 1e-5, 0, 1000
            )
            bad += kernels.merge_weighted(
                out,
                b,
                [a["v"] for a in agents.values()],
                [h["v"] for h in importance.values()],
                lambdas,
                1e-5,
                1000,
                b.numel(),
            )
            assert bad == 0
            results[name] = out
        assert torch.equal(
            results["native"].view(torch.uint8) if out_dtype == torch.float32 else results["native"].view(torch.int16),
            results["portable"].view(torch.uint8)
            if out_dtype == torch.float32
            else results["portable"].view(torch.int16),
        )
        if not plus:
            ref = reference(
                {"v": base["v"]},
                {n: {"v": a["v"]} for n, a in agents.items()},
                {n: {"v": h["v"]} for n, h in importance.items()},
            )["v"]
            tol = 1e-2 if out_dtype == torch.bfloat16 else 2e-6
            torch.testing.assert_close(results["native"].double(), ref, rtol=tol, atol=1e-7)


@needs_kernels
def test_native_counts_bad_importances_in_both_builds():
    base = torch.zeros(100)
    agents = [torch.zeros(100), torch.zeros(100)]
    for kernels in _builds(wnative).values():
        for bad in (-1.0, float("nan"), float("inf")):
            h = [torch.ones(100), torch.ones(100)]
            h[1][77] = bad
            out = torch.empty(100)
            assert kernels.merge_weighted(out, base, agents, h, None, 1e-5, 0, 100) == 1
            assert torch.equal(out, base)


def test_unsupported_importances_fall_back_to_the_eager_kernels():
    """float16 importances, or non-contiguous ones: the torch path runs (never ignores them)."""
    base = _base()
    agents = _agents(base)
    importance = _importances(base, list(agents))
    half = {n: {k: v.clamp(max=6e4).half() for k, v in sd.items()} for n, sd in importance.items()}
    merged, info = merge(agents, base, importance=half, return_info=True)
    assert info.extra["kernels"] == {"eager": 3}
    as_float = {n: {k: v.float() for k, v in sd.items()} for n, sd in half.items()}
    assert_bit_identical(merged, merge(agents, base, importance=as_float))


@pytest.mark.skipif(not compiler_available("cpu"), reason="no C++ compiler for torch.compile")
def test_compiled_equals_eager_bits(monkeypatch):
    base = _base()
    agents = _agents(base)
    importance = _importances(base, list(agents))
    with monkeypatch.context() as m:
        m.setattr(native, "_KERNELS", None)
        for case in (dict(method="ram"), dict(method="ram_plus")):
            compiled, info = merge(agents, base, importance=importance, compile=True, return_info=True, **case)
            assert info.extra["kernels"] == {"compiled": 3}, info.extra
            eager = merge(agents, base, importance=importance, compile=False, **case)
            assert_bit_identical(compiled, eager)
            same = {n: {k: torch.full(v.shape, 2.0) for k, v in base.items()} for n in agents}
            assert_bit_identical(
                merge(agents, base, importance=same, compile=True, **case), merge(agents, base, compile=True, **case)
            )


def _signed_inputs(k, n, dtype, imp_dtype, seed, agree=False):
    """Agents from ``test_ram_native``'s conflicting data (``agree``: one sign per entry), importances over 60
    decades with a fifth of them 0 and ties (``tests.test_importance._importances``)."""
    base, agents = _conflicting(k, n, dtype, seed, agree)
    names = [f"a{t}" for t in range(k)]
    h = _importances({"v": base}, names, seed=seed, dtype=imp_dtype)
    return base, agents, [h[name]["v"] for name in names]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("imp_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 11])
def test_sign_gives_the_weighted_accumulators_bits(dtype, imp_dtype, k):
    """``sign=True`` on both builds: the bits of ``WeightedRamAccumulator(sign=True)``, RAM and RAM+, either
    output dtype, on ranges with odd starts and tails (the side sums rescaled with S and W)."""
    builds = _builds(wnative)
    base, agents, importances = _signed_inputs(k, 1237, dtype, imp_dtype, seed=400 + k)
    changed = 0
    for lambdas in (None, 1.0 + torch.rand(k, generator=torch.Generator().manual_seed(k))):
        for out_dtype in (torch.float32, torch.bfloat16):
            want = _accumulated(base, agents, lambdas, 1e-5, out_dtype, sign=True, importances=importances)
            plain = _accumulated(base, agents, lambdas, 1e-5, out_dtype, sign=False, importances=importances)
            changed += int((want != plain).sum())
            _check_ranges(
                builds,
                lambda kernels, out, start, end: kernels.merge_weighted(
                    out, base, agents, importances, lambdas, 1e-5, start, end, sign=True
                ),
                want,
                (out_dtype, lambdas is not None),
            )
    assert k == 1 or changed > 100, "the data has conflicts the rule resolves"


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 11])
def test_sign_where_the_agents_agree_is_the_plain_weighted_merge_bit_for_bit(dtype, k):
    builds = _builds(wnative)
    n = 1237
    base, agents, importances = _signed_inputs(k, n, dtype, torch.float32, seed=500 + k, agree=True)
    for lambdas in (None, 1.0 + torch.rand(k, generator=torch.Generator().manual_seed(k))):
        for out_dtype in (torch.float32, torch.bfloat16):
            _check_sign_is_plain(
                builds,
                lambda kernels, out, sign: kernels.merge_weighted(
                    out, base, agents, importances, lambdas, 1e-5, 0, n, sign=sign
                ),
                n,
                out_dtype,
                (lambdas is not None,),
            )


@needs_kernels
def test_sign_with_importances_through_merge_runs_native_with_the_eager_bits(monkeypatch):
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)  # several ranges per tensor, shared by two threads
    base = _base()
    agents = _agents(base)
    importance = _importances(base, list(agents))
    kw = dict(importance=importance, method="ram_plus", shared="sign", workers=2, return_info=True)
    fast, info = merge(agents, base, **kw)
    slow, slow_info = _eager(monkeypatch, merge, agents, base, **kw)
    assert info.extra["kernels"] == {"native": 3}, info.extra
    assert slow_info.extra["kernels"] == {"eager": 3}
    assert_bit_identical(fast, slow)
    plain = merge(agents, base, importance=importance, method="ram_plus")
    assert any(not torch.equal(fast[k], plain[k]) for k in base), "the rule changed shared entries"
