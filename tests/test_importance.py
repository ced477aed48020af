"""Curvature-aware RAM: the shared entries' mean weighted by each agent's importances (docs/curvature.md).

Hand computations, a float64 reference written from the definition, equal importances = RAM bit for bit on every
path and variant, zero importances = the plain mean, and errors that name agent and tensor."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

import ram_live
import ram_live.methods.ram.native as native
from ram_live import ConfigError, InputMismatchError, merge
from ram_live import functional as F
from ram_live.methods import ram as R
from tests.conftest import assert_bit_identical, snapshot

VARIANTS = [
    dict(method="ram"),
    dict(method="ram_plus"),
    dict(method="ram_plus_soft", r=0.3),
    dict(method="ram_plus", rho_scope="tensor", alpha=0.2),
    dict(method="ram", eps=0.0),
]


def _base(dtype=torch.float32, seed=3):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(37, 29, generator=g).to(dtype),
        "b": torch.randn(7, generator=g).to(dtype),
        "v": torch.randn(2049, generator=g).to(dtype),
    }


def _agents(base, densities=(0.4, 0.5, 0.6), seed=4, dtype=None):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, density in enumerate(densities):
        out[f"a{i}"] = {
            k: (v.float() + torch.randn(v.shape, generator=g) * 0.01 * (torch.rand(v.shape, generator=g) < density)).to(
                dtype or v.dtype
            )
            for k, v in base.items()
        }
    return out


def _importances(base, names, seed=5, dtype=torch.float32):
    """Importances over 60 decades, a fifth of them 0, ties between agents."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in enumerate(names):
        out[n] = {}
        for k, v in base.items():
            h = torch.rand(v.shape, generator=g) * torch.pow(10.0, torch.randint(-30, 30, v.shape, generator=g))
            h[torch.rand(v.shape, generator=g) < 0.2] = 0.0
            if i:
                tie = torch.rand(v.shape, generator=g) < 0.1
                h[tie] = out[names[0]][k][tie].float()
            out[n][k] = h.to(dtype)
    return out


def reference(base, agents, importance, eps=1e-5, lambdas=None):
    """Eq. 7 with the importance-weighted mean, from the definition, in float64 (τ computed as the merge does)."""
    names = list(agents)
    out = {}
    threshold = ram_live.Activity(eps=eps).threshold_for(torch.float32)
    for k, b in base.items():
        b32 = b.float().reshape(-1)
        tau = torch.stack([agents[n][k].float().reshape(-1) - b32 for n in names])
        tau = torch.where(tau.abs() > threshold, tau, 0.0).double()
        h = torch.stack([importance[n][k].double().reshape(-1) for n in names])
        active = tau != 0
        c = active.sum(0)
        top = torch.where(active, h, 0.0).amax(0)
        w = torch.where(active, torch.where(top > 0, h / torch.where(top > 0, top, 1.0), 1.0), 0.0)
        mean = (w * tau).sum(0) / w.sum(0).clamp(min=1.0)
        lam = torch.ones(len(names), dtype=torch.float64) if lambdas is None else torch.tensor(lambdas).double()
        unique = (lam[:, None] * tau).sum(0)
        merged = b32.double() + torch.where(c == 1, unique, mean)
        out[k] = merged.reshape(b.shape)
    return out


def _eager(monkeypatch, fn, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(native, "_KERNELS", None)
        return fn(*args, **kw)


def test_hand_computed():
    base = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])}
    agents = {
        "a": {"w": torch.tensor([1.5, 2.25, 3.0, 4.75, 5.5])},
        "b": {"w": torch.tensor([1.0, 2.5, 3.0, 4.25, 5.25])},
    }
    importance = {
        "a": {"w": torch.tensor([1.0, 2.0, 1.0, 0.0, 1e-30])},
        "b": {"w": torch.tensor([1.0, 1.0, 1.0, 0.0, 3e-30])},
    }
    merged = merge(agents, base, method="ram", importance=importance)["w"]
    # unique: a's τ; shared (2:1): (0.25 + 0.5·0.5)/1.5; none: the base; both 0: the plain mean; tiny: 1:3
    expected = torch.tensor([1.5, 2.0 + 0.5 / 1.5, 3.0, 4.5, 5.0 + (0.5 / 3 + 0.25) / (1 + 1 / 3)])
    torch.testing.assert_close(merged, expected, rtol=0, atol=1e-6)
    plus = merge(agents, base, method="ram_plus", importance=importance, return_info=True)
    lam = plus[1].lambdas["a"]
    assert lam > 1
    torch.testing.assert_close(plus[0]["w"][0], torch.tensor(1.0 + 0.5 * lam))
    torch.testing.assert_close(plus[0]["w"][1:], expected[1:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["native", "eager"])
def test_against_the_float64_reference(monkeypatch, dtype, path):
    base = _base(dtype)
    agents = _agents(base)
    importance = _importances(base, list(agents))
    run = merge if path == "native" else (lambda *a, **k: _eager(monkeypatch, merge, *a, **k))
    merged = run(agents, base, method="ram", importance=importance, dtype=torch.float32)
    ref = reference(base, agents, importance)
    for k in base:
        torch.testing.assert_close(merged[k].double(), ref[k], rtol=2e-6, atol=1e-7)
    plain = merge(agents, base, method="ram", dtype=torch.float32)
    assert any(not torch.equal(plain[k], merged[k]) for k in base)


@pytest.mark.parametrize("case", VARIANTS)
@pytest.mark.parametrize("path", ["native", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_equal_importances_are_ram_bit_for_bit(monkeypatch, case, path, dtype):
    base = _base(dtype)
    agents = _agents(base)
    run = merge if path == "native" else (lambda *a, **k: _eager(monkeypatch, merge, *a, **k))
    plain = run(agents, base, **case)
    for value in (1.0, 3e-38, 1e-45, 7.5, 1e38, 0.0):  # 1e-45: a subnormal
        same = {n: {k: torch.full(v.shape, value) for k, v in base.items()} for n in agents}
        weighted, info = run(agents, base, importance=same, return_info=True, **case)
        assert_bit_identical(plain, weighted)
        assert info.extra["importance"] == "given"


def test_equal_importances_in_place_and_stacked(monkeypatch):
    """In place (validation pass, dry run) and the stacking ``combine`` path give RAM's bits too."""
    base = _base()
    agents = _agents(base)
    same = {n: {k: torch.full(v.shape, 2.0) for k, v in base.items()} for n in agents}
    module = torch.nn.Module()
    for k, v in base.items():
        module.register_parameter(k, torch.nn.Parameter(v.clone()))
    plain = merge(agents, base, method="ram_plus")
    merge(agents, module, method="ram_plus", importance=same, inplace=True)
    assert_bit_identical(plain, {k: v.detach() for k, v in module.state_dict().items()})
    tau = torch.stack([agents[n]["v"] - base["v"] for n in agents])
    tau = F.apply_activity_(tau, 1e-5)
    h = torch.full_like(tau, 0.5)
    assert torch.equal(R.ram_combine(tau, importance=h), R.ram_combine(tau))
    lam = torch.tensor([1.1, 1.2, 1.3])
    assert torch.equal(R.ram_combine(tau, lam, importance=h), R.ram_combine(tau, lam))


def test_zero_importances_are_the_plain_mean():
    base = _base()
    agents = _agents(base)
    zero = {n: {k: torch.zeros(v.shape) for k, v in base.items()} for n in agents}
    assert_bit_identical(
        merge(agents, base, method="ram_plus"), merge(agents, base, method="ram_plus", importance=zero)
    )
    # one agent with importance 0 against others with importance > 0 weighs nothing where they are active
    h = _importances(base, list(agents))
    h["a0"] = {k: torch.zeros(v.shape) for k, v in base.items()}
    merged = merge(agents, base, method="ram", importance=h)
    ref = reference(base, agents, h)
    for k in base:
        torch.testing.assert_close(merged[k].double(), ref[k], rtol=2e-6, atol=1e-7)


def test_safetensors_and_sequence_importances(tmp_path):
    base = _base()
    agents = _agents(base)
    h = _importances(base, list(agents))
    paths = {}
    for n, sd in h.items():
        paths[n] = tmp_path / f"{n}.safetensors"
        save_file(sd, paths[n])
    from_dicts = merge(agents, base, importance=h)
    assert_bit_identical(from_dicts, merge(agents, base, importance={n: str(p) for n, p in paths.items()}))
    assert_bit_identical(from_dicts, merge(list(agents.values()), base, importance=[h[n] for n in agents]))
    half = {n: {k: v.to(torch.bfloat16) for k, v in sd.items()} for n, sd in h.items()}
    assert_bit_identical(
        merge(agents, base, importance=half),
        merge(agents, base, importance={n: {k: v.float() for k, v in sd.items()} for n, sd in half.items()}),
    )


def test_excluded_agent_needs_no_importance():
    base = _base()
    agents = _agents(base)
    h = _importances(base, list(agents))
    del h["a2"]
    two = {n: agents[n] for n in ("a0", "a1")}
    assert_bit_identical(
        merge(two, base, method="ram", importance=h), merge(agents, base, method="ram", exclude=["a2"], importance=h)
    )


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("path", ["native", "eager", "inplace"])
def test_invalid_values_name_agent_and_tensor(monkeypatch, bad, path):
    base = _base()
    agents = _agents(base)
    h = _importances(base, list(agents))
    h["a1"]["v"][1234] = bad
    monkeypatch.setattr(ram_live.auxiliary, "CHECK_CHUNK", 1000)  # the index is found in the second chunk
    module = torch.nn.Module()
    for k, v in base.items():
        module.register_parameter(k, torch.nn.Parameter(v.clone()))
    before = snapshot(module)
    with pytest.raises(InputMismatchError, match=r"importance of agent 'a1', tensor 'v': flat index 1234") as err:
        if path == "inplace":
            merge(agents, module, importance=h, inplace=True)
        elif path == "eager":
            _eager(monkeypatch, merge, agents, base, importance=h)
        else:
            merge(agents, base, importance=h)
    assert err.value.agent == "a1" and err.value.key == "v"
    assert_bit_identical(before, snapshot(module))  # nothing written


def test_wrong_shape_missing_tensor_missing_agent():
    base = _base()
    agents = _agents(base)
    h = _importances(base, list(agents))
    wrong = {**h, "a0": {**h["a0"], "w": torch.ones(29, 37)}}
    with pytest.raises(InputMismatchError, match=r"importance of agent 'a0', tensor 'w': shape \[29, 37\]"):
        merge(agents, base, importance=wrong)
    missing = {**h, "a2": {k: v for k, v in h["a2"].items() if k != "b"}}
    with pytest.raises(InputMismatchError, match=r"importance of agent 'a2' has no tensor 'b'"):
        merge(agents, base, importance=missing)
    with pytest.raises(ConfigError, match=r"no entry for agent\(s\) 'a1'"):
        merge(agents, base, importance={n: v for n, v in h.items() if n != "a1"})
    with pytest.raises(ConfigError, match=r"unknown agent\(s\) 'zz'"):
        merge(agents, base, importance={**h, "zz": h["a0"]})
    with pytest.raises(ConfigError, match=r"method 'ties' takes no importance"):
        merge(agents, base, method="ties", importance=h)
    with pytest.raises(InputMismatchError, match="not floating point"):
        merge(
            agents, base, importance={**h, "a0": {k: torch.ones(v.shape, dtype=torch.int32) for k, v in base.items()}}
        )
    with pytest.raises(ConfigError, match="must map each agent"):
        merge(agents, base, importance=h["a0"])


def test_lambdas_and_rho_do_not_depend_on_importances():
    """RAM+ counts as without importances (same λ, ρ), in two passes: the one-read route takes no importances."""
    base = _base(torch.bfloat16)
    agents = _agents(base)
    _, plain = merge(agents, base, return_info=True)
    _, weighted = merge(agents, base, importance=_importances(base, list(agents)), return_info=True)
    assert plain.passes == 1 and weighted.passes == 2
    assert weighted.lambdas == plain.lambdas and weighted.rho == plain.rho
    assert weighted.extra["auxiliary"] == ("importance",)


def test_stacked_combine_path_takes_importances():
    """A RAM registered without its streaming accumulator merges through ``combine`` with ``ctx.auxiliary``."""
    import dataclasses

    from ram_live.methods import _REGISTRY

    stacked = dataclasses.replace(
        ram_live.get_method("ram"), name="ram_stacked_importance_test", accumulator=None, kernels=None
    )
    _REGISTRY[stacked.name] = stacked
    try:
        base = _base()
        agents = _agents(base)
        h = _importances(base, list(agents))
        merged, info = merge(agents, base, method=stacked.name, importance=h, chunk_numel=300, return_info=True)
        assert info.extra["kernels"] == {"eager": 3}
        ref = reference(base, agents, h)
        for k in base:
            torch.testing.assert_close(merged[k].double(), ref[k], rtol=2e-6, atol=1e-7)
        same = {n: {k: torch.full(v.shape, 4.0) for k, v in base.items()} for n in agents}
        assert_bit_identical(
            merge(agents, base, method=stacked.name, importance=same, chunk_numel=300),
            merge(agents, base, method=stacked.name, chunk_numel=300),
        )
    finally:
        _REGISTRY.pop(stacked.name)
