"""The baselines' device path (ram_live/methods/baseline_device.py): whole merges through the engine with the device
path switched on for CPU tensors (``engine.checks.deferred_device``; the kernels under Triton's interpreter), bit
for bit against the CPU merge, errors naming tensor and agent; and the shape of each path on fake CUDA tensors
(tests/device_trace.py): per tensor one launch (TIES: the radix select's three passes, its histogram's zeroing and
the merge), no host sync, nothing that grows with the tensor."""

import importlib.util
import warnings

import pytest
import torch


from conftest import interpreter  # noqa: E402
import ram_live  # noqa: E402
from ram_live.engine import checks  # noqa: E402
from ram_live.errors import NonFiniteError  # noqa: E402
from ram_live.functional import stable_seed  # noqa: E402
from ram_live.kernels.device import linear, ties  # noqa: E402
from device_helpers import bits as _bits, module_agents as _agents  # noqa: E402

pytestmark = interpreter

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton's interpreter")


MERGES = [
    {"method": "task_arithmetic", "scale": 0.6, "weights": [1.0, 0.5, 2.0]},
    {"method": "linear"},
    {"method": "ties", "density": 0.3},
    {"method": "ties", "densities": [0.2, 1.0, 0.5], "elect_on": "weighted", "divide_by": "weights"},
    {"method": "ties", "density": 0.4, "majority_sign": "frequency", "divide_by": "none", "scale": 0.5},
]


@needs_triton
@pytest.mark.parametrize("options", MERGES, ids=lambda o: "-".join(map(str, o.values()))[:48])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_engine_device_path_equals_cpu_merge(options, dtype, monkeypatch):
    base, agents = _agents(dtype)
    expected, cpu_info = ram_live.merge(agents, base=base, return_info=True, **options)
    monkeypatch.setattr(checks, "deferred_device", lambda dev: dev.type != "meta")
    merged, info = ram_live.merge(agents, base=base, return_info=True, **options)
    assert cpu_info.extra["kernels"] == {"eager": 3} and info.extra["kernels"] == {"device": 3}
    for (name, p), q in zip(merged.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(_bits(p), _bits(q)), name


@needs_triton
@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_engine_dare_draws_the_seeded_device_masks(method, on_device):
    base, agents = _agents(torch.bfloat16)
    options = {"density": 0.4, "seed": 3, "weights": [1.0, 2.0, 0.5], "scale": 0.8}
    merged, info = ram_live.merge(agents, base=base, method=method, return_info=True, **options)
    assert info.extra["kernels"] == {"device": 3}
    again = ram_live.merge(agents, base=base, method=method, **options)
    weights = torch.tensor(options["weights"], dtype=torch.float64)
    for key, value in merged.state_dict().items():
        assert torch.equal(_bits(value), _bits(again.state_dict()[key])), key
        flat = [m.state_dict()[key].reshape(-1) for m in (base, *agents)]
        seeds = [stable_seed("dare", 3, f"agent_{t}", key) for t in range(3)]
        expected, invalid = torch.empty_like(flat[0]), torch.zeros((), dtype=torch.int64)
        if method == "dare_linear":
            linear._torch_linear(expected, flat[0], flat[1:], weights, 0.8, [0.4] * 3, seeds, invalid)
        else:
            drop = ([0.4] * 3, seeds)
            ties._torch_ties(expected, flat[0], flat[1:], weights, None, [], *drop, 0.8, 0, False, 0, invalid)
        assert torch.equal(_bits(value.reshape(-1)), _bits(expected)), key


@needs_triton
@pytest.mark.parametrize("method", ["task_arithmetic", "ties", "dare_ties"])
def test_device_errors_name_tensor_and_agent_and_leave_inputs_whole(method, on_device):
    base, agents = _agents(torch.float32)
    with torch.no_grad():
        agents[1].b.weight[3, 4] = float("nan")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    with pytest.raises(NonFiniteError, match="agent 'agent_1'") as caught:
        ram_live.merge(agents, base=base, method=method)
    assert caught.value.key == "b.weight"
    with pytest.raises(NonFiniteError, match="agent 'agent_1'"):
        ram_live.merge(agents, base=base, method=method, inplace=True)
    for k, v in base.state_dict().items():
        assert torch.equal(v, before[k]), k


@needs_triton
def test_in_place_device_merge_equals_the_out_of_place_one(on_device):
    base, agents = _agents(torch.bfloat16)
    expected = ram_live.merge(agents, base=base, method="ties", density=0.3)
    ram_live.merge(agents, base=base, method="ties", density=0.3, inplace=True)
    for (name, p), q in zip(base.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(_bits(p), _bits(q)), name


def test_cpu_tensors_keep_the_cpu_path():
    from ram_live.methods.ties import ties_prepare, TiesConfig

    base, agents = _agents(torch.float32, k=2)
    _, info = ram_live.merge(agents, base=base, method="ties", return_info=True)
    assert info.extra["kernels"] == {"eager": 3}

    class View:  # a prepare hook's view without a stream: not the device path
        key, numel, agents, device = "w", 4, ("x", "y"), torch.device("cpu")

        def delta(self, index):
            return torch.tensor([0.1, -0.4, 0.2, 0.0]) * (index + 1)

    assert ties_prepare(TiesConfig(density=0.5), View(), torch.ones(2)) == [pytest.approx(0.2), pytest.approx(0.4)]


# ------------------------------------------------------------------------------------------ fake CUDA tensors

#: launches per tensor of each path: TIES zeroes its histograms, runs three digit passes and the merge
LAUNCHES = {"TA": 1, "linear": 1, "TIES": 5, "DARE-linear": 1, "DARE-TIES": 1}
#: bytes per tensor over the floor (K + 2) x numel x 2: TIES reads the inputs once per digit pass too
BYTES = {"TA": 1.01, "linear": 1.01, "TIES": 3.5, "DARE-linear": 1.01, "DARE-TIES": 1.01}


@pytest.fixture(scope="module")
def fake_cuda():
    import device_trace as trace

    with warnings.catch_warnings(), trace.FakeCuda() as fc:
        warnings.simplefilter("ignore")
        yield trace, fc


@pytest.mark.parametrize("label", list(LAUNCHES))
def test_device_path_shape_per_tensor(fake_cuda, label, monkeypatch):
    trace, fc = fake_cuda
    # normalize=True reads Σ w on the host once per merge, which fake tensors hold as 0: an error there
    monkeypatch.setitem(trace.METHODS, "linear", {"method": "linear", "normalize": False, "weights": [0.5] * trace.K})
    monkeypatch.setitem(trace.METHODS, "DARE-linear", {"method": "dare_linear", "density": 0.5})
    monkeypatch.setitem(trace.BYTES_TARGET, "linear", 2.0)
    monkeypatch.setitem(trace.BYTES_TARGET, "DARE-linear", 10.0)
    row = trace.measure(fc, label, False)
    assert row.problems == []
    numel = trace.SIZES[1][0] * trace.SIZES[1][1]
    for size, cost in row.per.items():
        assert cost.launches == LAUNCHES[label] and cost.syncs == 0 and not cost.single_block, (size, cost)
    large = row.per[numel]
    assert large.bytes <= BYTES[label] * (trace.K + 2) * numel * 2
