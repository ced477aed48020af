"""RAM options beyond the paper: per-agent ``lambdas``, uncapped ``alpha=math.inf`` and ``exclude``, on every
kernel path (native, torch streaming, compiled, single read, tensor ρ, in place, files, the snapshot store)."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from ram_live import ConfigError, Given, RamConfig, RhoClip, SnapshotStore, merge
from ram_live.methods import ram as R

from conftest import assert_bit_identical, make_agents

NAMES = ("coder", "tools", "memory")


def hand_ram(base: dict, agents: dict, lambdas: dict[str, float], eps: float = 1e-5) -> dict:
    """θ* by hand in float32, in the kernels' order of operations: Σ −τ over the agents in order, then θ₀ − that
    sum / c where two or more agents are active, θ₀ − (−τ_t)·λ_t where agent t alone is, θ₀ where none is."""
    thr = float(torch.tensor(eps, dtype=torch.float64).to(torch.float32))
    thr = thr if thr <= eps else float(torch.nextafter(torch.tensor(thr), torch.tensor(0.0)))
    out = {}
    for key, b in base.items():
        bf = b.float()
        neg = torch.zeros_like(bf)
        count = torch.zeros_like(bf)
        lam = torch.zeros_like(bf)
        for name, agent in agents.items():
            tau = agent[key].float() - bf
            tau = torch.where(tau.abs() > thr, tau, torch.zeros_like(tau))
            active = tau != 0
            neg = neg - tau
            count += active
            lam = torch.where(active, torch.full_like(lam, lambdas[name]), lam)
        merged = torch.where(count == 1, bf - neg * lam, bf - neg / count.clamp(min=1))
        out[key] = merged.to(b.dtype)
    return out


def counts(base: dict, agents: dict, eps: float = 1e-5) -> dict[str, tuple[int, int]]:
    """(active, unique) per agent, by hand."""
    masks = {n: {k: (a[k].float() - base[k].float()).abs() > eps for k in base} for n, a in agents.items()}
    c = {k: sum(m[k].int() for m in masks.values()) for k in base}
    return {
        n: (sum(int(m[k].sum()) for k in base), sum(int((m[k] & (c[k] == 1)).sum()) for k in base))
        for n, m in masks.items()
    }


@pytest.fixture
def agents(base_sd):
    return dict(zip(NAMES, make_agents(base_sd, [0.05, 0.5, 0.6])))


GIVEN = {"coder": 2.5, "tools": 0.5, "memory": 1.75}


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("method", ["ram", "ram_plus", "ram_plus_soft"])
def test_given_lambdas_equal_the_hand_computation(base_sd, agents, native, method, monkeypatch):
    if not native:
        import ram_live.methods.ram.native as native_mod

        monkeypatch.setattr(native_mod, "_KERNELS", None)
    merged, info = merge(agents, base=base_sd, method=method, lambdas=GIVEN, return_info=True)
    assert_bit_identical(merged, hand_ram(base_sd, agents, GIVEN))
    assert info.lambdas == GIVEN and info.statistics is None and info.passes == 1  # nothing counted
    assert info.extra["kernels"] == ({"native": 5} if native else {"eager": 5})


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_lambdas_of_one_are_plain_ram_bit_for_bit(base_sd, agents, native, monkeypatch):
    if not native:
        import ram_live.methods.ram.native as native_mod

        monkeypatch.setattr(native_mod, "_KERNELS", None)
    base = {k: v.clone() for k, v in base_sd.items()}
    base["layers.0.b"][:3] = -0.0  # untouched −0.0 must stay −0.0
    ones = dict.fromkeys(NAMES, 1.0)
    for method in ("ram", "ram_plus"):
        assert_bit_identical(
            merge(agents, base=base, method=method, lambdas=ones), merge(agents, base=base, method="ram")
        )
    bf16 = {k: v.bfloat16() for k, v in base.items()}
    bf_agents = {n: {k: v.bfloat16() for k, v in a.items()} for n, a in agents.items()}
    assert_bit_identical(
        merge(bf_agents, base=bf16, method="ram", lambdas=ones), merge(bf_agents, base=bf16, method="ram")
    )


def test_lambdas_override_tensor_rho_and_equal_across_scopes(base_sd, agents):
    want = hand_ram(base_sd, agents, GIVEN)
    for scope in ("global", "tensor"):
        assert_bit_identical(
            merge(agents, base=base_sd, method="ram_plus", rho_scope=scope, r=3.0, lambdas=GIVEN), want
        )


def test_lambdas_in_place_files_and_chunks(base_sd, agents, tmp_path):
    want = hand_ram(base_sd, agents, GIVEN)
    model = torch.nn.Module()
    for i, (k, v) in enumerate(base_sd.items()):
        model.register_parameter(f"p{i}", torch.nn.Parameter(v.clone()))
    names = {f"p{i}": k for i, k in enumerate(base_sd)}
    mod_agents = {n: {p: a[k] for p, k in names.items()} for n, a in agents.items()}
    _, info = merge(mod_agents, base=model, method="ram", lambdas=GIVEN, inplace=True, return_info=True)
    assert_bit_identical({names[p]: v.detach() for p, v in model.state_dict().items()}, want)
    assert info.rho is not None  # in place counts anyway (its validation pass): ρ reported, not used
    folders = {}
    for name, sd in {"base": base_sd, **agents}.items():
        folders[name] = tmp_path / name
        folders[name].mkdir()
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folders[name] / "model.safetensors"))
    from_files = merge(
        {n: folders[n] for n in NAMES}, base=folders["base"], method="ram", lambdas=GIVEN, chunk_numel=50
    )
    assert_bit_identical(from_files, want)


def test_lambdas_from_the_snapshot_store(base_sd, agents, tmp_path):
    store = SnapshotStore(tmp_path / "store", durable=False)
    for i, (name, sd) in enumerate(agents.items()):
        store.writer(name, base_sd, activity="abs", eps=1e-5).snapshot(sd, i + 1)
    latest = store.latest_all()
    latest = {n: latest[n] for n in NAMES}
    assert_bit_identical(merge(latest, method="ram", lambdas=GIVEN), hand_ram(base_sd, agents, GIVEN))


def test_compiled_kernels_take_given_lambdas(base_sd, agents, no_native):
    from ram_live.engine.compiling import compiler_available

    if not compiler_available("cpu"):
        pytest.skip("no C++ compiler for torch.compile")
    merged, info = merge(agents, base=base_sd, method="ram", lambdas=GIVEN, compile=True, return_info=True)
    assert info.extra["compiled"] and info.extra["kernels"] == {"compiled": 5}
    assert_bit_identical(merged, hand_ram(base_sd, agents, GIVEN))


def test_uncapped_alpha_is_the_formula(base_sd, agents, monkeypatch):
    counted = counts(base_sd, agents)
    r = 0.75
    want = {n: 1.0 + r * (a - u) / u for n, (a, u) in counted.items()}
    merged, info = merge(agents, base=base_sd, method="ram_plus", r=r, alpha=math.inf, return_info=True)
    assert info.lambdas == pytest.approx(want, rel=1e-12)
    assert max(want.values()) > 2.0 + 1.0  # the clip at α = 2 would have mattered
    assert_bit_identical(merged, hand_ram(base_sd, agents, info.lambdas))
    # the same through the two-pass path and a reused count
    monkeypatch.setenv("RAM_LIVE_SINGLE_READ", "0")
    again, info2 = merge(agents, base=base_sd, method="ram_plus", r=r, alpha=math.inf, return_info=True)
    assert info2.passes == 2 and info.passes == 1
    assert_bit_identical(again, merged)
    reused = merge(agents, base=base_sd, method="ram_plus", r=r, alpha=math.inf, statistics=info.statistics)
    assert_bit_identical(reused, merged)


def test_uncapped_alpha_for_an_agent_without_unique_entries(base_sd):
    base = {"w": torch.zeros(8)}
    a = {"w": torch.tensor([1.0, 1.0, 0, 0, 0, 0, 0, 0])}
    b = {"w": torch.tensor([1.0, 3.0, 2.0, 0, 0, 0, 0, 0])}  # b alone changed entry 2; a has nothing alone
    merged, info = merge({"a": a, "b": b}, base=base, method="ram_plus", r=2.0, alpha=math.inf, return_info=True)
    assert info.rho == {"a": math.inf, "b": 2.0}
    assert info.lambdas == {"a": 1.0, "b": 5.0}  # ρ = +∞: reported as 1.0 (it scales nothing)
    assert torch.equal(merged["w"], torch.tensor([1.0, 2.0, 10.0, 0, 0, 0, 0, 0]))
    assert R.ram_lambda(math.inf, "ram_plus", 2.0, 3.0) == 7.0  # capped: 1 + r·α, as before


def test_uncapped_alpha_in_place_checks_overflow(base_sd):
    """λ has no a-priori bound with α = ∞: the in-place dry run must look at every tensor."""
    base = {"w": torch.zeros(4, dtype=torch.float16)}
    a = {"w": torch.tensor([1000.0, 1.0, 1.0, 0.0], dtype=torch.float16)}
    b = {"w": torch.tensor([0.0, 1.0, 1.0, 1.0], dtype=torch.float16)}
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(base["w"].clone())
    from ram_live import NonFiniteError

    with pytest.raises(NonFiniteError, match="overflows"):
        merge({"a": a, "b": b}, base=model, method="ram_plus", r=100.0, alpha=math.inf, inplace=True)
    assert torch.equal(model.w.detach(), base["w"])


def test_exclude_is_the_merge_without_that_agent(base_sd, agents):
    two = {n: agents[n] for n in ("coder", "memory")}
    lam = {"coder": 3.0, "memory": 0.25}
    assert_bit_identical(
        merge(agents, base=base_sd, method="ram", lambdas=lam, exclude=["tools"]),
        merge(two, base=base_sd, method="ram", lambdas=lam),
    )
    assert_bit_identical(
        merge(agents, base=base_sd, method="ram_plus", exclude=("tools",)), merge(two, base=base_sd, method="ram_plus")
    )
    with pytest.raises(ConfigError, match=r"exclude: unknown agent\(s\) 'nobody'"):
        merge(agents, base=base_sd, method="ram", exclude=["nobody"])
    with pytest.raises(ConfigError, match="exclude names every agent"):
        merge(agents, base=base_sd, method="ram", exclude=list(NAMES))
    with pytest.raises(ConfigError, match="exclude must be a sequence of agent names"):
        merge(agents, base=base_sd, method="ram", exclude="tools")


def test_lambdas_errors_name_the_agents(base_sd, agents):
    with pytest.raises(ConfigError, match=r"lambdas: unknown agent\(s\) 'nobody'; no λ for agent\(s\) 'memory'"):
        merge(agents, base=base_sd, method="ram", lambdas={"coder": 1.0, "tools": 1.0, "nobody": 2.0})
    with pytest.raises(ConfigError, match=r"lambdas\['coder'\] must be a finite number"):
        merge(agents, base=base_sd, method="ram", lambdas={"coder": math.nan, "tools": 1.0, "memory": 1.0})
    with pytest.raises(ConfigError, match="lambdas must be a mapping"):
        merge(agents, base=base_sd, method="ram", lambdas=[1.0, 2.0, 3.0])


def test_options_need_statistics_only_where_they_count():
    from ram_live.methods import get_method

    needs = get_method("ram_plus").needs_statistics
    assert needs(RamConfig()) and needs(RamConfig(lam=RhoClip(alpha=math.inf)))
    assert not needs(RamConfig(lam=Given({"a": 2.0})))
    assert RhoClip(alpha=math.inf).alpha == math.inf
    given = {"a": 2.0}
    cfg = RamConfig(lam=Given(given))
    given["a"] = 5.0
    assert cfg.lam.lambdas == {"a": 2.0}  # a copy
    with pytest.raises(ConfigError, match="alpha must be a finite number"):
        RhoClip(alpha=-math.inf)
