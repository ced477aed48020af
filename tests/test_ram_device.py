"""RAM's device path (ram_live/methods/ram/device.py) against the CPU merge, bit for bit: the custom ops alone (Triton
kernels under Triton's interpreter, and the torch implementation), then whole merges through the engine with the
device path switched on for CPU tensors (``engine.checks.deferred_device``), so that the deferred checks, the
counts kept on the device and the digest run as they do on a GPU."""

import itertools

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreter  # noqa: E402
import ram_live  # noqa: E402
from ram_live.engine import checks  # noqa: E402
from ram_live.errors import NonFiniteError  # noqa: E402
from ram_live.functional.activity import apply_activity_  # noqa: E402
from ram_live.methods.ram import device  # noqa: E402
from ram_live.methods.ram.accumulators import RamAccumulator, WeightedRamAccumulator  # noqa: E402
from device_helpers import bits as _bits, flat_inputs as _inputs, module_agents as _agents  # noqa: E402

pytestmark = interpreter

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _accumulated(base, agents, importances, lambdas, eps, sign, dtype):
    """The eager accumulator over the whole tensor: the CPU path's bits."""
    n, k = base.numel(), len(agents)
    cls = WeightedRamAccumulator if importances else RamAccumulator
    acc = cls(n, k, base.device, torch.float32, None if lambdas is None else lambdas.tolist(), sign=sign)
    base_f = base.float()
    acc.begin(n)
    for t, agent in enumerate(agents):
        delta = apply_activity_(agent.float() - base_f, eps)
        acc.add(t, delta, importance=importances[t].float()) if importances else acc.add(t, delta)
    return acc.merged(base_f).to(dtype)


@pytest.mark.parametrize("implementation", ["triton", "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_op_gives_the_accumulators_bits(implementation, dtype):
    run = device._triton_merge if implementation == "triton" else device._torch_merge
    cases = itertools.product((1, 2, 3, 5), (False, True), (False, True), (False, True), (0.0, 1e-3))
    for k, scaled, sign, weighted, eps in cases:
        base, agents = _inputs(1500, k, dtype, seed=k)
        g = torch.Generator().manual_seed(7)
        importances = [torch.rand(1500, generator=g) * (torch.rand(1500, generator=g) < 0.8) for _ in agents]
        importances = importances if weighted else []
        lambdas = torch.rand(k, generator=g) + 0.5 if scaled else None
        out, invalid = torch.empty_like(base), torch.zeros((), dtype=torch.int64)
        run(out, base, agents, importances, lambdas, eps, sign, invalid)
        expected = _accumulated(base, agents, importances, lambdas, eps, sign, dtype)
        assert torch.equal(_bits(out), _bits(expected)), (k, scaled, sign, weighted, eps)
        assert int(invalid) == 0


def test_merge_op_counts_invalid_entries():
    base, agents = _inputs(3000, 3, torch.bfloat16)
    agents[1][17] = float("nan")
    importances = [torch.ones(3000) for _ in agents]
    importances[2][5] = -1.0
    for run in (device._triton_merge, device._torch_merge):
        out, invalid = torch.empty_like(base), torch.zeros((), dtype=torch.int64)
        run(out, base, agents, importances, None, 0.0, False, invalid)
        assert int(invalid) == 2  # the NaN result and the negative importance
    big = torch.full((1500,), 60000.0, dtype=torch.float16)
    out, invalid = torch.empty_like(big), torch.zeros((), dtype=torch.int64)
    device._triton_merge(out, big, [big * 0 - 60000, big], [], torch.tensor([3.0, 1.0]), 0.0, False, invalid)
    assert int(invalid) == 1500  # 60000 + 3 * 120000 is beyond float16: every entry


@pytest.mark.parametrize("k", [1, 3, 8])
def test_counts_op_equals_torch_counts(k):
    for dtype, eps in itertools.product((torch.bfloat16, torch.float32), (0.0, 1e-3)):
        base, agents = _inputs(5000, k, dtype, seed=k)
        counts = [torch.zeros(3 * k + 1, dtype=torch.int64) for _ in range(2)]
        invalid = [torch.zeros((), dtype=torch.int64) for _ in range(2)]
        device._triton_counts(base, agents, eps, counts[0], invalid[0])
        device._torch_counts(base, agents, eps, counts[1], invalid[1])
        assert torch.equal(counts[0], counts[1])
        masks = torch.stack([apply_activity_(a.float() - base.float(), eps) != 0 for a in agents])
        assert counts[0][:k].tolist() == masks.sum(1).tolist()
        assert counts[0][k : 2 * k].tolist() == (masks & (masks.sum(0) == 1)).sum(1).tolist()
        assert counts[0][2 * k :].tolist() == torch.bincount(masks.sum(0), minlength=k + 1).tolist()
        assert int(invalid[0]) == int(invalid[1]) == 0
    agents[0][3] = float("inf")
    device._triton_counts(base, agents, 0.0, counts[0], invalid[0])
    assert int(invalid[0]) == 1


MERGES = [
    {"method": "ram"},
    {"method": "ram_plus"},
    {"method": "ram_plus", "shared": "sign"},
    {"method": "ram_plus_soft", "eps": 1e-3, "activity": "abs"},
    {"method": "ram_plus", "lambdas": {"agent_0": 1.5, "agent_1": 0.5, "agent_2": 2.0}},
]


@pytest.mark.parametrize("options", MERGES, ids=lambda o: "-".join(str(v) for v in o.values())[:40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_engine_device_path_equals_cpu_merge(options, dtype, monkeypatch):
    base, agents = _agents(dtype)
    expected, cpu_info = ram_live.merge(agents, base=base, return_info=True, **options)
    monkeypatch.setattr(checks, "deferred_device", lambda dev: dev.type != "meta")
    merged, info = ram_live.merge(agents, base=base, return_info=True, **options)
    assert info.extra["kernels"] == {"device": 3}
    for (name, p), q in zip(merged.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(_bits(p), _bits(q)), name
    if cpu_info.statistics is not None:
        assert torch.equal(info.statistics.active, cpu_info.statistics.active)
        assert torch.equal(info.statistics.unique, cpu_info.statistics.unique)
        assert info.statistics.fingerprint == cpu_info.statistics.fingerprint
        assert info.lambdas == cpu_info.lambdas


def test_engine_device_path_with_importances(on_device):
    base, agents = _agents(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    importance = {
        f"agent_{t}": {k: torch.rand(p.shape, generator=g) for k, p in base.named_parameters()} for t in range(3)
    }
    merged = ram_live.merge(agents, base=base, method="ram_plus", importance=importance)
    checks_off = pytest.MonkeyPatch()
    checks_off.setattr(checks, "deferred_device", lambda dev: False)
    try:
        expected = ram_live.merge(agents, base=base, method="ram_plus", importance=importance)
    finally:
        checks_off.undo()
    for p, q in zip(merged.state_dict().values(), expected.state_dict().values()):
        assert torch.equal(_bits(p), _bits(q))


def test_device_errors_name_tensor_and_agent_and_leave_inputs_whole(on_device):
    base, agents = _agents(torch.float32)
    with torch.no_grad():
        agents[1].b.weight[3, 4] = float("nan")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    for method in ("ram", "ram_plus"):
        with pytest.raises(NonFiniteError, match="agent 'agent_1'") as caught:
            ram_live.merge(agents, base=base, method=method)
        assert caught.value.key == "b.weight"
    with pytest.raises(NonFiniteError, match="agent 'agent_1'"):
        ram_live.merge(agents, base=base, method="ram", inplace=True)
    for k, v in base.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_device_overflow_in_place_is_refused_before_writing(on_device):
    base, agents = _agents(torch.float16)
    with torch.no_grad():
        base.a.weight.fill_(60000.0)
        agents[0].a.weight.fill_(-60000.0)  # τ = -120000: a float32 value, far outside float16 once scaled
    before = base.a.weight.clone()
    with pytest.raises(NonFiniteError, match="a.weight"):
        ram_live.merge(agents[:1], base=base, method="ram_plus", lambdas={"agent_0": 3.0}, inplace=True)
    assert torch.equal(base.a.weight, before)


def test_reused_statistics_are_checked_against_the_inputs_on_the_device(on_device):
    base, agents = _agents(torch.bfloat16)
    _, info = ram_live.merge(agents, base=base, method="ram_plus", return_info=True)
    again, second = ram_live.merge(agents, base=base, method="ram_plus", statistics=info.statistics, return_info=True)
    assert second.passes == 1
    with torch.no_grad():
        agents[0].a.weight[0, 0] += 1.0
    with pytest.raises(ram_live.ConfigError, match="counted over other weights"):
        ram_live.merge(agents, base=base, method="ram_plus", statistics=info.statistics)


def test_engine_device_path_under_inference_mode(on_device):
    """λ made under ``torch.inference_mode`` (an inference tensor, without a version counter) merges on the device
    path with the CPU merge's bits."""
    base, agents = _agents(torch.bfloat16)
    expected = ram_live.merge(agents, base=base, method="ram_plus")
    with torch.inference_mode():
        merged = ram_live.merge(agents, base=base, method="ram_plus")
    for (name, p), q in zip(merged.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(_bits(p), _bits(q)), name
