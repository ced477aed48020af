"""RAM's ``shared="sign"``: the conflict-aware shared region (the mean over the active agents that agree with the
plain mean's sign), by hand, against the float64 reference, bit for bit across the torch paths, bit for bit RAM
where the agents agree, with importances, and its errors."""

from __future__ import annotations

import pytest
import torch

from ram_live import ConfigError, RamConfig, Unit, merge
from ram_live.methods import ram as R

from conftest import make_agents
from reference import ref_ram
from test_ram_native import _accumulated

NAMES = ("coder", "tools", "memory")


def test_by_hand():
    base = {"w": torch.tensor([10.0, 10.0, 10.0, 10.0, 10.0, -0.0])}
    taus = torch.tensor(
        [[1.0, 1.0, 1.0, 3.0, 0.0, 0.0], [2.0, 2.0, -1.0, 0.0, 0.0, 0.0], [-4.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    )
    agents = {n: {"w": base["w"] + t} for n, t in zip(NAMES, taus)}
    # entry 0: Σ τ = -1 elects the negative side, whose mean is -4 (RAM: -1/3); entry 1: all agree, RAM's 1.5;
    # entry 2: Σ τ = 0, the mean (0); entry 3: coder alone (λ for RAM+); entries 4, 5: nobody, the base's bits
    out = merge(agents, base=base, method="ram", shared="sign")["w"]
    assert torch.equal(out, torch.tensor([6.0, 11.5, 10.0, 13.0, 10.0, -0.0]))
    assert torch.signbit(out[5])
    plain = merge(agents, base=base, method="ram")["w"]
    assert plain[0] == pytest.approx(10 - 1 / 3) and torch.equal(plain[1:], out[1:])
    lam = merge(agents, base=base, method="ram", shared="sign", lambdas={"coder": 2.0, "tools": 1.0, "memory": 1.0})
    assert torch.equal(lam["w"], torch.tensor([6.0, 11.5, 10.0, 16.0, 10.0, -0.0]))


@pytest.mark.parametrize("variant", ["ram", "ram_plus", "ram_plus_soft"])
def test_against_the_float64_reference(base_sd, variant):
    agents = make_agents(base_sd, [0.3, 0.6, 0.9], scale=0.05)
    r = {} if variant == "ram" else {"r": 0.5}
    out = merge(dict(zip(NAMES, agents)), base=base_sd, method=variant, shared="sign", **r)
    ref, _ = ref_ram(base_sd, agents, variant=variant, shared="sign", **r)
    plain = merge(dict(zip(NAMES, agents)), base=base_sd, method=variant, **r)
    moved = 0
    for key in base_sd:
        torch.testing.assert_close(out[key], ref[key], rtol=1.5e-7, atol=1e-8)  # float32 rounding of θ₀ + τ*
        moved += int((out[key] != plain[key]).sum())
    assert moved > 100  # the rule changed many shared entries here


def _streamed(taus, lambdas=None, importance=None, sign=True):
    """The streaming accumulator's τ* of task vectors ``taus`` ``[K, N]`` (on a base of zeros)."""
    n = taus.shape[1]
    return _accumulated(
        torch.zeros(n),
        list(taus),
        lambdas,
        0.0,
        torch.float32,
        sign,
        importances=None if importance is None else list(importance),
    )


def _taus(k, n, seed, same_sign=False):
    g = torch.Generator().manual_seed(seed)
    taus = torch.randn(k, n, generator=g) * (torch.rand(k, n, generator=g) < 0.6)
    taus[:2, :64] = torch.tensor([1.5, -1.5]).view(2, 1)  # Σ τ = 0 on some entries
    return taus.abs() if same_sign else taus


@pytest.mark.parametrize("k", [2, 3, 5, 8])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_torch_paths_agree_bit_for_bit(k, weighted):
    """The streaming accumulator and the fused expression (what ``compile=True`` compiles) give the same bits;
    the stacked combine the same values (its sums run in another order)."""
    taus = _taus(k, 1003, seed=k)
    lambdas = [1.0 + 0.25 * t for t in range(k)]
    h = torch.rand(k, 1003, generator=torch.Generator().manual_seed(7)) * 3 if weighted else None
    for lam in (None, lambdas):
        streamed = _streamed(taus, lam, h)
        fused = torch.empty(1003)
        lam_t = None if lam is None else torch.tensor(lam)
        if h is None:
            R.ram_fused_(fused, torch.zeros(1003), list(taus), lam_t, 0.0, True)
        else:
            R.ram_fused_weighted_(fused, torch.zeros(1003), list(taus), list(h), lam_t, 0.0, True)
        assert torch.equal(fused, streamed)
        stacked = R.ram_combine(taus, lam_t, h, sign=True)
        torch.testing.assert_close(stacked, streamed, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True])
def test_where_the_agents_agree_it_is_ram_bit_for_bit(weighted):
    taus = _taus(5, 777, seed=3, same_sign=True)
    h = torch.rand(5, 777, generator=torch.Generator().manual_seed(1)) if weighted else None
    for lam in (None, [2.0, 1.0, 0.5, 1.0, 3.0]):
        assert torch.equal(_streamed(taus, lam, h, sign=True), _streamed(taus, lam, h, sign=False))
    assert torch.equal(R.ram_combine(-taus, sign=True), R.ram_combine(-taus))


def test_elected_mean_with_importances_by_hand():
    taus = torch.tensor([[1.0], [2.0], [-1.0]])
    h = torch.tensor([[1.0], [1.0], [4.0]])
    # weights h / max h = 1/4, 1/4, 1: Σ w·τ = 0.25 + 0.5 - 1 < 0 elects the negative side: -1 (plain weighted
    # mean -0.25 / 1.5); the same importances with the positive side heavier elect it: (1·1 + 4·2) / 5
    assert torch.equal(_streamed(taus, importance=h), torch.tensor([-1.0]))
    assert torch.equal(_streamed(taus, importance=torch.tensor([[1.0], [4.0], [1.0]])), torch.tensor([1.8]))
    assert torch.equal(R.ram_combine(taus, importance=h, sign=True), torch.tensor([-1.0]))


def test_through_merge_with_importances_and_files(base_sd, tmp_path):
    from safetensors.torch import save_file

    agents = dict(zip(NAMES, make_agents(base_sd, [0.5, 0.5, 0.5], scale=0.05)))
    importance = {n: {k: torch.rand_like(v) for k, v in base_sd.items()} for n in NAMES}
    live = merge(agents, base=base_sd, method="ram_plus", shared="sign", importance=importance)
    paths = {}
    for n, sd in agents.items():
        paths[n] = str(tmp_path / f"{n}.safetensors")
        save_file(sd, paths[n])
    save_file(base_sd, str(tmp_path / "base.safetensors"))
    files = merge(
        paths, base=str(tmp_path / "base.safetensors"), method="ram_plus", shared="sign", importance=importance
    )
    plain = merge(agents, base=base_sd, method="ram_plus", importance=importance)
    assert all(torch.equal(live[k], files[k]) for k in base_sd)
    assert any(not torch.equal(live[k], plain[k]) for k in base_sd)


def test_options_and_errors():
    assert RamConfig(lam=Unit(), shared="sign").flat() == ("ram", {"shared": "sign"})
    assert RamConfig().shared == "mean"
    with pytest.raises(ConfigError, match="shared"):
        merge({"a": {"w": torch.ones(2)}}, base={"w": torch.zeros(2)}, method="ram", shared="median")
    with pytest.raises(ConfigError, match="shared"):
        RamConfig(shared="vote")
