"""The registry and the baselines: hand cases, PEFT parity, determinism."""

import re
from dataclasses import dataclass

import pytest
import torch
from peft.utils import merge_utils as pmu

import ram_live
from ram_live import ConfigError, MethodExistsError, UnknownMethodError, merge, register_method
from ram_live.methods import _REGISTRY, dare_generator
from tests.conftest import assert_bit_identical, make_agents


def _taus(base, agents, key):
    return [a[key] - base[key] for a in agents]


def test_registry_lists_every_method():
    assert set(ram_live.available_methods()) >= {
        "linear",
        "task_arithmetic",
        "ties",
        "dare_linear",
        "dare_ties",
        "ram",
        "ram_plus",
        "ram_plus_soft",
    }


def test_register_user_method_and_taken_name(base_sd):
    @dataclass(frozen=True)
    class MaxConfig:
        pass

    try:

        @register_method("abs_max_test", MaxConfig)
        def abs_max(deltas, ctx, config):
            return deltas.gather(0, deltas.abs().argmax(0, keepdim=True)).squeeze(0)

        agents = make_agents(base_sd, [0.5, 0.5])
        out = merge(agents, base=base_sd, method="abs_max_test")
        t = torch.stack(_taus(base_sd, agents, "layers.0.w"))
        expected = base_sd["layers.0.w"] + t.gather(0, t.abs().argmax(0, keepdim=True)).squeeze(0)
        torch.testing.assert_close(out["layers.0.w"], expected)
        with pytest.raises(MethodExistsError):
            register_method("abs_max_test", MaxConfig, abs_max)
        with pytest.raises(MethodExistsError):
            register_method("ram", MaxConfig, abs_max)
    finally:
        _REGISTRY.pop("abs_max_test", None)


def test_unknown_method_and_option(base_sd):
    agents = make_agents(base_sd, [0.5])
    with pytest.raises(UnknownMethodError, match="available"):
        merge(agents, base=base_sd, method="slerp")
    with pytest.raises(ConfigError, match="'densty'.*density"):
        merge(agents, base=base_sd, method="ties", densty=0.2)
    with pytest.raises(ConfigError, match="density"):
        merge(agents, base=base_sd, method="ties", density=1.5)
    with pytest.raises(ConfigError, match="weights has 3 entries for 1 agents"):
        merge(agents, base=base_sd, method="task_arithmetic", weights=[1, 2, 3])


def test_linear_and_task_arithmetic_hand_case():
    base = {"w": torch.tensor([1.0, 1.0])}
    a, b = {"w": torch.tensor([2.0, 1.0])}, {"w": torch.tensor([1.0, 4.0])}
    assert merge([a, b], base=base, method="linear")["w"].tolist() == [1.5, 2.5]
    assert merge([a, b], base=base, method="linear", weights=[3, 1])["w"].tolist() == [1.75, 1.75]
    assert merge([a, b], base=base, method="task_arithmetic", scale=0.5)["w"].tolist() == [1.5, 2.5]
    assert merge([a, b], base=base, method="task_arithmetic")["w"].tolist() == [2.0, 4.0]


def test_ties_hand_case():
    base = {"w": torch.zeros(4)}
    a = {"w": torch.tensor([0.4, -0.2, 0.0, 0.01])}
    b = {"w": torch.tensor([-0.1, -0.3, 0.5, 0.02])}
    out = merge([a, b], base=base, method="ties", density=0.5)["w"]
    # trim to top-2: a -> [.4, -.2, 0, 0], b -> [0, -.3, .5, 0]; signs: +, -, +, (0 -> +)
    assert out.tolist() == pytest.approx([0.4, -0.25, 0.5, 0.0])


WEIGHTS = [0.7, 1.3, 0.5]


@pytest.mark.parametrize("majority", ["total", "frequency"])
def test_ties_equals_peft(base_sd, majority):
    agents = make_agents(base_sd, [1.0, 1.0, 1.0], scale=0.1)
    out = merge(agents, base=base_sd, method="ties", density=0.3, weights=WEIGHTS, majority_sign=majority)
    for k in base_sd:
        expected = pmu.ties(_taus(base_sd, agents, k), torch.tensor(WEIGHTS), 0.3, majority)
        torch.testing.assert_close(out[k], base_sd[k] + expected, rtol=1.3e-6, atol=1e-6)


def _bf16_taus(seed=0, n=3):
    """Task vectors holding bf16 values (8 significant bits: many ties at TIES' k-th magnitude), as float32."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"a": (256, 256), "b": (64, 512), "c": (1024,), "d": (128, 96)}
    return shapes, [
        {k: (torch.randn(s, generator=g) * 0.02).bfloat16().float() for k, s in shapes.items()} for _ in range(n)
    ]


@pytest.mark.filterwarnings("ignore:The density 1.0")
@pytest.mark.parametrize("density, low, high", [(0.2, 0.03, 0.06), (0.5, 0.02, 0.04)])
def test_ties_on_bf16_ties_differs_from_peft_only_at_the_tied_entries(density, low, high):
    """TIES keeps every entry tied with the k-th magnitude, PEFT's topk exactly k of them (docs/methods.md, "TIES'
    tie rule"): the results are equal at every column where no agent has an entry tied at its threshold, the
    kept sets differ exactly by tied entries, PEFT given ram_live's trim gives ram_live's result, and the
    difference on bf16 values is the measured few per cent of the merged task vector."""
    from ram_live import functional as F

    shapes, agents = _bf16_taus()
    base = {k: torch.zeros(s) for k, s in shapes.items()}
    ours = merge(agents, base=base, method="ties", density=density, weights=WEIGHTS)
    num = den = 0.0
    extra = 0
    for key in shapes:
        taus = [a[key] for a in agents]
        peft = pmu.ties(taus, torch.tensor(WEIGHTS), density, "total")
        tied_any = torch.zeros(shapes[key], dtype=torch.bool)
        trimmed = []
        for t in taus:
            k = int(density * t.numel())
            threshold = F.magnitude_threshold(t, density)
            tied, kept = t.abs() == threshold, t.abs() >= threshold
            peft_kept = pmu.prune(t, density, "magnitude") != 0
            assert int(peft_kept.sum()) == k and int(kept.sum()) >= k  # PEFT: exactly k; ours: at least k
            assert bool((peft_kept & ~kept).sum() == 0) and bool(((kept & ~peft_kept) & ~tied).sum() == 0)
            extra += int(kept.sum()) - k
            tied_any |= tied
            trimmed.append(t * kept)
        away = ~tied_any
        assert torch.equal(ours[key][away], peft[away]), key  # bit-equal away from the thresholds
        # the whole difference is the trim: PEFT's election on ram_live's trim is ram_live's result
        torch.testing.assert_close(ours[key], pmu.ties(trimmed, torch.tensor(WEIGHTS), 1.0, "total"), rtol=0, atol=0)
        num += float((ours[key] - peft).norm() ** 2)
        den += float(peft.norm() ** 2)
    assert extra > 0  # bf16 values do tie at the thresholds
    assert low < (num / den) ** 0.5 < high, (num / den) ** 0.5  # 4.2 % at density 0.2, 2.8 % at 0.5


def test_ties_on_float32_without_ties_equals_peft_bit_for_bit():
    from ram_live import functional as F

    g = torch.Generator().manual_seed(5)
    taus = [torch.randn(128, 96, generator=g) * 0.02 for _ in WEIGHTS]
    ours = merge(
        [{"w": t} for t in taus], base={"w": torch.zeros(128, 96)}, method="ties", density=0.2, weights=WEIGHTS
    )["w"]
    for t in taus:
        assert int((t.abs() >= F.magnitude_threshold(t, 0.2)).sum()) == int(0.2 * t.numel())  # no ties: k kept
    assert torch.equal(ours, pmu.ties(taus, torch.tensor(WEIGHTS), 0.2, "total"))


def test_task_arithmetic_equals_peft(base_sd):
    agents = make_agents(base_sd, [1.0, 0.3, 0.6], scale=0.1)
    out = merge(agents, base=base_sd, method="task_arithmetic", weights=WEIGHTS)
    for k in base_sd:
        expected = pmu.task_arithmetic(_taus(base_sd, agents, k), torch.tensor(WEIGHTS))
        torch.testing.assert_close(out[k], base_sd[k] + expected, rtol=1.3e-6, atol=1e-6)


def _peft_dare_pruned(base, agents, key, density, seed):
    """PEFT's own random pruning, with the global generator seeded as ram_live seeds agent t's generator."""
    pruned = []
    for t, tau in enumerate(_taus(base, agents, key)):
        torch.manual_seed(dare_generator(seed, f"agent_{t}", key, torch.device("cpu")).initial_seed())
        pruned.append(pmu.prune(tau, density, method="random", rescale=True))
    return pruned


def test_dare_linear_equals_peft_with_the_same_masks(base_sd):
    agents = make_agents(base_sd, [1.0, 1.0, 1.0], scale=0.1)
    out = merge(agents, base=base_sd, method="dare_linear", density=0.4, weights=WEIGHTS, seed=7, chunk_numel=60)
    for k in base_sd:
        pruned = _peft_dare_pruned(base_sd, agents, k, 0.4, 7)
        expected = pmu.task_arithmetic(pruned, torch.tensor(WEIGHTS))
        torch.testing.assert_close(out[k], base_sd[k] + expected, rtol=1.3e-6, atol=1e-6)


def test_dare_ties_equals_peft_with_the_same_masks(base_sd):
    agents = make_agents(base_sd, [1.0, 1.0, 1.0], scale=0.1)
    out = merge(agents, base=base_sd, method="dare_ties", density=0.4, weights=WEIGHTS, seed=3)
    for k in base_sd:
        pruned = torch.stack(_peft_dare_pruned(base_sd, agents, k, 0.4, 3))
        sign = pmu.calculate_majority_sign_mask(pruned, method="total")
        w = pmu.reshape_weight_task_tensors(pruned, torch.tensor(WEIGHTS))
        expected = pmu.disjoint_merge(pruned * w, sign)
        torch.testing.assert_close(out[k], base_sd[k] + expected, rtol=1.3e-6, atol=1e-6)


def test_dare_is_deterministic_and_seeded(base_sd):
    agents = make_agents(base_sd, [1.0, 1.0], scale=0.1)
    a = merge(agents, base=base_sd, method="dare_ties", density=0.5, seed=1)
    b = merge(agents, base=base_sd, method="dare_ties", density=0.5, seed=1)
    c = merge(agents, base=base_sd, method="dare_ties", density=0.5, seed=2)
    assert_bit_identical(a, b)
    assert not torch.equal(a["layers.0.w"], c["layers.0.w"])


def test_mergekit_ties_convention_divides_by_weights():
    base = {"w": torch.zeros(2)}
    a, b = {"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([3.0, -1.0])}
    peft_style = merge([a, b], base=base, method="ties", density=1.0, weights=[1.0, 3.0])["w"]
    mk_style = merge(
        [a, b], base=base, method="ties", density=1.0, weights=[1.0, 3.0], elect_on="weighted", divide_by="weights"
    )["w"]
    # column 1: unweighted sum 0 -> "+" elected (PEFT) keeps a; weighted sum -2 -> "-" elected keeps b
    assert peft_style.tolist() == pytest.approx([(1 + 9) / 2, 1.0])
    assert mk_style.tolist() == pytest.approx([(1 + 9) / 4, -1.0])


@pytest.mark.parametrize("name", ["ram", "ram_plus", "ram_plus_soft"])
def test_streaming_path_equals_stacked_combine(base_sd, name):
    import dataclasses

    method = ram_live.get_method(name)
    stacked = dataclasses.replace(method, name=f"{name}_stacked_test", accumulator=None, kernels=None)
    _REGISTRY[stacked.name] = stacked
    try:
        agents = make_agents(base_sd, [0.1, 0.5, 0.7], scale=0.05)
        a = merge(agents, base=base_sd, method=name, chunk_numel=50)
        b, info = merge(agents, base=base_sd, method=stacked.name, chunk_numel=50, return_info=True)
        assert info.extra["kernels"] == {"eager": len(base_sd)}  # the stacked combine, no fast path
        for k in base_sd:
            torch.testing.assert_close(a[k], b[k], rtol=2e-7, atol=1e-7)
    finally:
        _REGISTRY.pop(stacked.name)


NON_FINITE = [float("nan"), float("inf"), -float("inf"), 1e39, pytest.param(10**400, id="10**400")]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize(
    "method, option",
    [
        ("linear", "weights"),
        ("task_arithmetic", "weights"),
        ("task_arithmetic", "scale"),
        ("ties", "weights"),
        ("ties", "scale"),
        ("ties", "density"),
        ("dare_linear", "weights"),
        ("dare_linear", "scale"),
        ("dare_ties", "density"),
        ("ram", "eps"),
        ("ram_plus", "r"),
        ("ram_plus", "alpha"),
        ("ram_plus_soft", "r"),
    ],
)
def test_non_finite_options_are_refused(method, option, value):
    base = {"w": torch.zeros(4, 4)}
    agents = [{"w": torch.ones(4, 4)}, {"w": 2 * torch.ones(4, 4)}]
    given = [value, 1.0] if option == "weights" else value
    name = "weights[0]" if option == "weights" else option
    if option == "alpha" and value == float("inf"):  # alpha=math.inf is RAM+ without the clip (documented)
        assert merge(agents, base=base, method=method, alpha=value)["w"].isfinite().all()
        return
    with pytest.raises(ConfigError, match=rf"{re.escape(name)} must be a finite number.*got {re.escape(repr(value))}"):
        merge(agents, base=base, method=method, **{option: given})


@pytest.mark.parametrize("option", ["r", "alpha", "eps"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e39])
def test_ram_merge_refuses_non_finite_options(option, value):
    base = {"w": torch.zeros(4, 4)}
    agents = [{"w": torch.ones(4, 4)}, {"w": 2 * torch.ones(4, 4)}]
    if option == "alpha" and value == float("inf"):  # no clip (documented)
        assert ram_live.RhoClip(alpha=value).alpha == value
        return
    with pytest.raises(ConfigError, match=rf"^{option} must be a finite number"):  # checked by the config
        ram_live.merge(agents, base=base, **{option: value})
    with pytest.raises(ConfigError, match=rf"^{option} must be a finite number"):
        (ram_live.RamConfig if option == "eps" else ram_live.RhoClip)(**{option: value})


def test_range_checks_still_apply():
    with pytest.raises(ConfigError, match=r"^r must be >= 0.0, got -1$"):
        ram_live.RhoClip(r=-1)
    with pytest.raises(ConfigError, match=r"^density must be in \[0.0, 1.0\], got 1.5$"):
        ram_live.TiesConfig(density=1.5)
    with pytest.raises(ConfigError, match=r"^scale must be a finite number.*got '2'$"):
        ram_live.TaskArithmeticConfig(scale="2")
    assert ram_live.TaskArithmeticConfig(weights=(1, 2.5), scale=-2).scale == -2
    with pytest.raises(ConfigError, match=r"^weights\[1\] must be a finite number.*got inf$"):
        ram_live.LinearConfig(weights=torch.tensor([1.0, float("inf")]))


def test_weights_of_tensors_and_numpy():
    np = pytest.importorskip("numpy")
    base = {"w": torch.zeros(2)}
    agents = [{"w": torch.ones(2)}, {"w": 2 * torch.ones(2)}]
    for weights in ([1, 3], torch.tensor([1.0, 3.0]), np.array([1.0, 3.0], dtype=np.float32)):
        assert merge(agents, base=base, method="linear", weights=weights)["w"].tolist() == [1.75, 1.75]


@pytest.mark.parametrize("weights", [{"agent_0": 1.0, "agent_1": 1.0}, "12", 1.0])
def test_weights_must_be_a_sequence(weights):
    base = {"w": torch.zeros(4, 4)}
    agents = [{"w": torch.ones(4, 4)}, {"w": 2 * torch.ones(4, 4)}]
    with pytest.raises(ConfigError, match="weights must be a sequence of numbers, one per agent"):
        merge(agents, base=base, method="linear", weights=weights)


def test_weights_entries_must_be_numbers():
    with pytest.raises(ConfigError, match=r"^weights\[1\] must be a finite number.*got 'x'$"):
        ram_live.LinearConfig(weights=[1.0, "x"])


def test_unknown_option_with_a_config_object():
    base = {"w": torch.zeros(4, 4)}
    agents = [{"w": torch.ones(4, 4)}, {"w": 2 * torch.ones(4, 4)}]
    with pytest.raises(ConfigError, match=r"unknown option\(s\) 'zz' for method 'ram_plus'; its options are: .*alpha"):
        merge(agents, base=base, method="ram_plus", zz=1)
    with pytest.raises(ConfigError, match=r"in the config or as keywords of method='ram_plus', not both"):
        merge(agents, base=base, method="ram_plus", config=ram_live.RamConfig(), r=0.2)
    out = merge(
        agents, base=base, method="task_arithmetic", config=ram_live.TaskArithmeticConfig(scale=2.0), weights=[1.0, 0.5]
    )
    assert out["w"].unique().tolist() == [4.0]


def test_linear_weights_that_sum_to_zero_or_near_float32s_limit(base_sd):
    """Weights are normalised in float64: a sum past float32's range is fine; a sum of 0 is refused."""
    agents = make_agents(base_sd, [0.5, 0.5])
    with pytest.raises(ConfigError, match="weights sum to 0.0 and normalize=True"):
        merge(agents, base=base_sd, method="linear", weights=[1.0, -1.0])
    assert_bit_identical(
        merge(agents, base=base_sd, method="linear", weights=[3e38, 3e38]),
        merge(agents, base=base_sd, method="linear", weights=[1.0, 1.0]),
    )


def test_float64_inputs_keep_their_weights_exact():
    base = {"w": torch.tensor([0.0, 1.0], dtype=torch.float64)}
    agent = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    out = merge([agent], base=base, method="task_arithmetic", weights=[1 / 3])["w"]
    assert out.tolist() == [1 / 3, 1 + 1 / 3]
    mean = merge([agent] * 7, base=base, method="linear")["w"]  # float64 rounding, not float32's 1e-8
    assert (mean - agent["w"]).abs().max() < 1e-15
