"""ram_merge / merge: semantics of RAM and its variants, input kinds, output kinds, inputs untouched."""

import math

import pytest
import torch
from torch import nn

from ram_live import merge
from tests.conftest import assert_bit_identical, make_agents, snapshot
from tests.reference import ref_ram


@pytest.mark.parametrize("variant", ["ram", "ram_plus", "ram_plus_soft"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scope", ["global", "tensor"])
def test_matches_reference(base_sd, variant, dtype, scope):
    base = {k: v.to(dtype) for k, v in base_sd.items()}
    agents = make_agents(base, [0.05, 0.4, 0.6], scale=0.05)
    kwargs = {} if variant == "ram" else {"rho_scope": scope}
    merged, info = merge(agents, base=base, method=variant, return_info=True, **kwargs)
    expected, lam = ref_ram(base, agents, variant=variant, scope=scope)
    for k in base:
        assert merged[k].dtype == dtype
        torch.testing.assert_close(merged[k], expected[k])
    if variant != "ram" and scope == "global":
        assert list(info.lambdas.values()) == pytest.approx(lam)
        assert len(set(info.lambdas.values())) == 3  # heterogeneous agents: different λ


def test_chunking_does_not_change_bits(base_sd):
    agents = make_agents(base_sd, [0.1, 0.5, 0.7])
    a = merge(agents, base=base_sd, rho_scope="tensor")
    b = merge(agents, base=base_sd, rho_scope="tensor", chunk_numel=7)
    assert_bit_identical(a, b)


def test_disjoint_agents_give_base_plus_sum(base_sd):
    g = torch.Generator().manual_seed(3)
    owner = {k: torch.randint(0, 4, v.shape, generator=g) for k, v in base_sd.items()}  # 3 = nobody
    agents = [{k: v + (owner[k] == t) * 0.1 for k, v in base_sd.items()} for t in range(3)]
    for variant in ("ram", "ram_plus", "ram_plus_soft"):
        merged, info = merge(agents, base=base_sd, method=variant, return_info=True)
        for k in base_sd:
            expected = base_sd[k] + sum(a[k] - base_sd[k] for a in agents)
            torch.testing.assert_close(merged[k], expected, rtol=0, atol=1e-6)
        if variant != "ram":
            assert all(v == 1.0 for v in info.lambdas.values())  # ρ = 0: nothing shared


def test_identical_agents_give_that_agent(base_sd):
    (agent,) = make_agents(base_sd, [0.3])
    for variant in ("ram", "ram_plus"):
        merged, info = merge([agent, agent, agent], base=base_sd, method=variant, return_info=True)
        for k in base_sd:
            expected = torch.where((agent[k] - base_sd[k]).abs() > 1e-5, agent[k], base_sd[k])  # sub-eps: dropped
            torch.testing.assert_close(merged[k], expected, rtol=0, atol=1e-6)
        if variant == "ram_plus":
            assert all(math.isinf(r) for r in info.rho.values())  # no unique entry: ρ = +inf, no crash
            assert all(v == pytest.approx(1.2) for v in info.lambdas.values())


def test_lambda_touches_unique_entries_only(base_sd):
    agents = make_agents(base_sd, [0.2, 0.5, 0.5])
    plain = merge(agents, base=base_sd, method="ram")
    plus = merge(agents, base=base_sd, method="ram_plus")
    for k in base_sd:
        count = sum(((a[k] - base_sd[k]).abs() > 1e-5).int() for a in agents)
        differs = plain[k] != plus[k]
        assert differs.any()
        assert (count[differs] == 1).all()


def test_untouched_entries_keep_base_bits_including_negative_zero(base_sd):
    base = {k: v.to(torch.bfloat16) for k, v in base_sd.items()}
    base["layers.0.b"][:4] = -0.0
    agents = make_agents(base, [0.1, 0.1])
    for a in agents:
        a["layers.0.b"][:4] = -0.0
        a["layers.0.b"][4] = base["layers.0.b"][4] + 4e-6  # below eps: dropped
    merged = merge(agents, base=base, method="ram_plus")
    touched = sum(((a["layers.0.b"].float() - base["layers.0.b"].float()).abs() > 1e-5) for a in agents) > 0
    bits = merged["layers.0.b"].view(torch.int16)
    assert torch.equal(bits[~touched], base["layers.0.b"].view(torch.int16)[~touched])
    assert (bits[:4] == torch.tensor(-0.0, dtype=torch.bfloat16).view(torch.int16)).all()


def test_eps_boundary_is_strict():
    base = {"w": torch.zeros(4)}
    eps32 = torch.tensor(1e-5).item()
    above = torch.nextafter(torch.tensor(1e-5), torch.tensor(1.0)).item()
    agent = {"w": torch.tensor([eps32, above, -eps32, -above])}
    merged = merge([agent, {"w": torch.zeros(4)}], base=base, method="ram")
    assert merged["w"].tolist() == [0.0, pytest.approx(above), 0.0, pytest.approx(-above)]


def test_activity_changed_rule_on_bf16():
    base = {"w": torch.tensor([1.0, 1.0, 2.0**-12, 0.5], dtype=torch.bfloat16)}
    # + one bf16 ULP of 1.0 (7.8e-3) and a change of a tiny weight by 2**-19 (~1.9e-6 < eps)
    agent = {"w": torch.tensor([1.0078125, 1.0, 2.0**-12 + 2.0**-19, 0.5], dtype=torch.bfloat16)}
    abs_rule = merge([agent, base], base=base, method="ram_plus", return_info=True)[1]
    changed = merge([agent, base], base=base, method="ram_plus", activity="changed", return_info=True)[1]
    assert abs_rule.statistics.active.tolist() == [1, 0]
    assert changed.statistics.active.tolist() == [2, 0]


def test_activity_changed_compares_in_narrower_dtype():
    base = {"w": torch.tensor([1.0, 1.0], dtype=torch.bfloat16)}
    agent = {"w": torch.tensor([1.0 + 1e-4, 1.0 + 1e-2], dtype=torch.float32)}  # first is below one bf16 ULP
    info = merge([agent], base=base, method="ram_plus", activity="changed", return_info=True)[1]
    assert info.statistics.active.tolist() == [1]


def test_global_vs_tensor_rho():
    base = {"a": torch.zeros(4), "b": torch.zeros(4)}
    x = {"a": torch.tensor([1.0, 1.0, 1.0, 0.0]), "b": torch.tensor([1.0, 0.0, 0.0, 0.0])}
    y = {"a": torch.tensor([1.0, 0.0, 0.0, 0.0]), "b": torch.tensor([1.0, 1.0, 0.0, 0.0])}
    g = merge([x, y], base=base, method="ram_plus", r=0.1, alpha=2.0)
    t = merge([x, y], base=base, method="ram_plus", r=0.1, alpha=2.0, rho_scope="tensor")
    # global: x active 4 (2 unique, 2 shared) -> rho 1 -> λ 1.1; y active 3 (1 unique) -> rho 2 -> λ 1.2
    assert g["a"].tolist() == pytest.approx([1.0, 1.1, 1.1, 0.0])
    assert g["b"].tolist() == pytest.approx([1.0, 1.2, 0.0, 0.0])
    # tensor "a": x has 2 unique 1 shared -> rho .5 -> 1.05; tensor "b": y has 1 unique 1 shared -> 1.1
    assert t["a"].tolist() == pytest.approx([1.0, 1.05, 1.05, 0.0])
    assert t["b"].tolist() == pytest.approx([1.0, 1.1, 0.0, 0.0])


def test_authors_script_and_mergekit_settings(base_sd):
    agents = make_agents(base_sd, [0.05, 0.5, 0.6])
    _, info = merge(agents, base=base_sd, r=0.2, alpha=1.0, return_info=True)
    assert all(v == pytest.approx(1.2) for v in info.lambdas.values())  # ρ > 1 for all three: λ = 1.2
    _, info = merge(agents, base=base_sd, r=0.1, alpha=0.2, rho_scope="tensor", return_info=True)
    assert info.lambdas is None  # per-tensor λ, at most 1.02


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        return self.head(self.norm(self.lin(self.embed(ids))))


def _agents_from(base: nn.Module, densities):
    agents = []
    for i, d in enumerate(densities):
        m = Tiny()
        m.load_state_dict(base.state_dict())
        g = torch.Generator().manual_seed(10 + i)
        with torch.no_grad():
            for p in m.parameters():
                p.add_((torch.rand(p.shape, generator=g) < d) * 0.05)
            m.norm.running_mean.add_(1.0 + i)  # buffers differ: taken from the base
            m.norm.num_batches_tracked += 5
        agents.append(m)
    return agents


def test_live_modules_new_module_inputs_untouched():
    torch.manual_seed(0)
    base = Tiny().eval()
    agents = [a.eval() for a in _agents_from(base, [0.1, 0.5, 0.6])]
    before = [snapshot(m) for m in [base, *agents]]
    merged = merge(agents, base=base)
    for m, s in zip([base, *agents], before):
        assert_bit_identical(snapshot(m), s)
    assert isinstance(merged, Tiny) and merged is not base
    assert merged.head.weight is merged.embed.weight  # still tied
    assert torch.equal(merged.norm.running_mean, base.norm.running_mean)
    assert merged.norm.num_batches_tracked == base.norm.num_batches_tracked
    params = [{k: v.detach().clone() for k, v in m.named_parameters()} for m in [base, *agents]]
    sd = merge(params[1:], base=params[0])
    merged_sd = snapshot(merged)
    assert_bit_identical({k: merged_sd[k] for k in sd}, sd)
    reloaded = Tiny().eval()
    reloaded.load_state_dict(merged_sd)
    assert_bit_identical(snapshot(reloaded), merged_sd)
    ids = torch.arange(16).view(2, 8)
    assert torch.equal(merged(ids), reloaded(ids))
    assert not torch.equal(merged(ids), base(ids))


def test_inplace_returns_the_base():
    torch.manual_seed(0)
    base = Tiny()
    agents = _agents_from(base, [0.1, 0.5])
    expected = merge(agents, base=base)
    out = merge(agents, base=base, inplace=True)
    assert out is base
    assert_bit_identical(snapshot(base), snapshot(expected))


def test_mapping_names_agents(base_sd):
    agents = make_agents(base_sd, [0.1, 0.5])
    _, info = merge({"coder": agents[0], "tools": agents[1]}, base=base_sd, return_info=True)
    assert set(info.lambdas) == {"coder", "tools"}


def test_merge_front_door_ram_equals_ram_merge(base_sd):
    agents = make_agents(base_sd, [0.1, 0.5])
    assert_bit_identical(
        merge(agents, base=base_sd, method="ram_plus_soft", r=0.2),
        merge(agents, base=base_sd, method="ram_plus_soft", r=0.2),
    )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_module_merges_on_cuda():
    torch.manual_seed(0)
    base = Tiny()
    agents = _agents_from(base, [0.1, 0.5, 0.6])
    cpu = merge(agents, base=base)
    gpu = merge([a.cuda() for a in agents], base=base.cuda())
    assert next(gpu.parameters()).is_cuda
    for k, v in snapshot(cpu).items():
        torch.testing.assert_close(snapshot(gpu)[k].cpu(), v)


def test_merge_task_vectors_equals_merging_onto_a_base(base_sd):
    from ram_live import merge_task_vectors

    agents = make_agents(base_sd, [0.1, 0.5, 0.6])
    taus = [{k: a[k] - base_sd[k] for k in base_sd} for a in agents]
    tau_star = merge_task_vectors(taus, method="ram", eps=0.0)
    expected = merge([{k: base_sd[k] + t[k] for k in t} for t in taus], base=base_sd, method="ram", eps=0.0)
    for k in base_sd:
        torch.testing.assert_close(base_sd[k] + tau_star[k], expected[k])


def test_agents_carrying_their_base(base_sd):
    from ram_live.io.sources import StateDictSource

    class Snapshot(StateDictSource):
        def __init__(self, sd, name, base):
            super().__init__(sd, name)
            self._base = base

        def base_source(self):
            return self._base

    base = StateDictSource(base_sd, "base")
    agents = make_agents(base_sd, [0.1, 0.5])
    carried = merge([Snapshot(a, f"s{i}", base) for i, a in enumerate(agents)])
    assert_bit_identical(carried, merge(agents, base=base_sd))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compiled_kernels_give_the_same_bits_and_counts(base_sd, dtype, no_native):
    base = {k: v.to(dtype) for k, v in base_sd.items()}
    base["layers.0.b"][:3] = -0.0
    agents = make_agents(base, [0.05, 0.5, 0.6], scale=0.05)
    agents[0]["layers.0.b"][0] = 0.0  # +0 against the base's -0: unchanged under "changed", τ = 0
    cases = [
        dict(method="ram"),
        dict(method="ram_plus"),
        dict(method="ram_plus_soft", r=0.3),
        dict(method="ram_plus", rho_scope="tensor", alpha=0.2),
        dict(method="ram_plus", activity="changed"),
        dict(method="ram_plus", eps=0.02),
        dict(method="ram", shared="sign"),
        dict(method="ram_plus", shared="sign"),
    ]
    for case in cases:
        eager, e_info = merge(agents, base=base, chunk_numel=100, return_info=True, compile=False, **case)
        fused, f_info = merge(agents, base=base, chunk_numel=100, return_info=True, compile=True, **case)
        assert f_info.extra["compiled"] and "compiled" in f_info.extra["kernels"], case
        assert_bit_identical(fused, eager)
        assert f_info.lambdas == e_info.lambdas, case
        if e_info.statistics is not None:
            assert torch.equal(f_info.statistics.active, e_info.statistics.active), case
            assert torch.equal(f_info.statistics.unique, e_info.statistics.unique), case


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("variant", ["ram", "ram_plus"])
def test_compiled_kernels_reject_non_finite_inputs(base_sd, bad, variant, no_native):
    from ram_live.errors import NonFiniteError

    agents = make_agents(base_sd, [0.3, 0.3])
    agents[1]["layers.1.w"][2, 3] = bad
    before = snapshot(agents[1])
    with pytest.raises(NonFiniteError, match=r"'layers\.1\.w' of agent 'agent_1' holds (nan|inf) at flat index 35"):
        merge(agents, base=base_sd, method=variant, compile=True, chunk_numel=64)
    assert_bit_identical(agents[1], before)


def test_compiled_path_falls_back_for_float64_and_mixed_dtypes(base_sd):
    wide = {k: v.double() for k, v in base_sd.items()}
    agents = make_agents(wide, [0.2, 0.4])
    assert_bit_identical(merge(agents, base=wide, compile=True), merge(agents, base=wide))
    mixed = make_agents(base_sd, [0.2, 0.4], dtype=torch.bfloat16)
    for activity in ("abs", "changed"):
        assert_bit_identical(
            merge(mixed, base=base_sd, compile=True, activity=activity), merge(mixed, base=base_sd, activity=activity)
        )


def test_reused_statistics_give_the_bits_of_a_fresh_merge_in_one_pass(base_sd):
    from ram_live import probe

    agents = make_agents(base_sd, [0.05, 0.5, 0.6])
    _, first = merge(agents, base=base_sd, return_info=True)
    assert first.passes == 1 and first.extra["single_read"] == first.tensors  # in memory: one read
    assert first.statistics.numel == sum(t.numel() for t in base_sd.values())
    report = probe(agents, base=base_sd)
    assert torch.equal(report.statistics().active, first.statistics.active)
    assert torch.equal(report.statistics().unique, first.statistics.unique)
    for variant, r in [("ram_plus", 0.2), ("ram_plus_soft", 0.05)]:
        fresh, f_info = merge(agents, base=base_sd, method=variant, r=r, return_info=True)
        for stats in (first.statistics, report.statistics()):
            reused, r_info = merge(agents, base=base_sd, method=variant, r=r, return_info=True, statistics=stats)
            assert_bit_identical(reused, fresh)
            assert r_info.passes == 1 and r_info.lambdas == f_info.lambdas
    # ignored where no global counts are needed
    assert_bit_identical(
        merge(agents, base=base_sd, method="ram", statistics=first.statistics),
        merge(agents, base=base_sd, method="ram"),
    )


def test_statistics_of_other_inputs_are_refused(base_sd):
    from ram_live.errors import ConfigError

    agents = make_agents(base_sd, [0.05, 0.5])
    _, info = merge(agents, base=base_sd, return_info=True)
    smaller = {k: v for k, v in base_sd.items() if k != "layers.1.w"}
    cases = [
        (
            dict(models={"agent_1": agents[1], "agent_0": agents[0]}),
            r"agents \['agent_0', 'agent_1'\], this merge has \['agent_1', 'agent_0'\]",
        ),
        (dict(models=agents[:1]), r"this merge has \['agent_0'\]"),
        (dict(models=agents, eps=1e-3), "counted with Activity"),
        (dict(models=agents, activity="changed"), "counted with Activity"),
        (dict(models=[{k: a[k] for k in smaller} for a in agents], base=smaller), "entries, this merge has"),
        (dict(models=agents, statistics=info), "takes RamStatistics"),
    ]
    for kw, match in cases:
        kw = {"base": base_sd, "statistics": info.statistics, **kw}
        with pytest.raises(ConfigError, match=match):
            merge(**kw)


def test_reused_statistics_of_changed_or_swapped_weights_are_refused_before_output(base_sd, tmp_path):
    from ram_live import probe
    from ram_live.errors import ConfigError

    agents = make_agents(base_sd, [0.05, 0.5])
    _, info = merge(agents, base=base_sd, return_info=True)
    assert (
        len(info.statistics.fingerprint) == 32
        and probe(agents, base=base_sd).statistics().fingerprint == info.statistics.fingerprint
    )
    trained = {k: v.clone() for k, v in agents[1].items()}
    trained["layers.1.w"].view(-1)[-1] += 0.5  # the agent trained on: same names, same shapes
    out = tmp_path / "merged.safetensors"
    for models in ([agents[0], trained], agents[::-1]):
        with pytest.raises(ConfigError, match="counted over other weights"):
            merge(models, base=base_sd, statistics=info.statistics, out=out)
        assert not out.exists()  # nothing written


@pytest.mark.parametrize("method", ["task_arithmetic", "ram"])
def test_parameters_tied_by_storage_are_both_written(method):
    """Two Parameters on one storage (tied by address, not by being one Parameter): the merged module's copy of
    each holds the merged values (the copy makes them two tensors; only the canonical name is merged)."""
    torch.manual_seed(0)

    def tied() -> nn.Sequential:
        net = nn.Sequential(nn.Linear(4, 4, bias=False), nn.ReLU(), nn.Linear(4, 4, bias=False))
        net[2].weight = nn.Parameter(net[0].weight.data)
        return net

    base = tied()
    agents = []
    for t in range(2):
        agent = tied()
        with torch.no_grad():
            agent[0].weight.copy_(base[0].weight + 0.1 * (t + 1))
        agents.append(agent)
    merged = merge(agents, base=base, method=method)
    assert torch.equal(merged[2].weight, merged[0].weight)
    moved = {"task_arithmetic": 0.1 + 0.2, "ram": (0.1 + 0.2) / 2}[method]  # the sum; the mean of the two
    assert torch.allclose(merged[0].weight, base[0].weight + moved, atol=1e-6)
