"""Task arithmetic, linear and DARE-linear on the device (ram_live/kernels/device/linear.py, philox.py): the op's
Triton kernel (under Triton's interpreter on CPU tensors) and its torch implementation against the CPU merge, bit
for bit; DARE's masks the same in both, reproducible per seed; invalid entries counted."""

import importlib.util

import pytest
import torch


from conftest import interpreter  # noqa: E402
import ram_live  # noqa: E402
from ram_live.functional import stable_seed  # noqa: E402
from device_helpers import bits as _bits, flat_inputs  # noqa: E402
from ram_live.kernels.device import linear, philox  # noqa: E402

pytestmark = interpreter

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton's interpreter")
IMPLEMENTATIONS = [pytest.param("triton", marks=needs_triton), "torch"]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _op(implementation, base, agents, weights, scale=1.0, densities=(), seeds=()):
    out, invalid = torch.empty_like(base), torch.zeros((), dtype=torch.int64)
    run = linear._triton_linear if implementation == "triton" else linear._torch_linear
    run(out, base, agents, weights, scale, list(densities), list(seeds), invalid)
    return out, int(invalid)


def _cpu_merge(base, agents, **options) -> torch.Tensor:
    return ram_live.merge([{"w": a} for a in agents], base={"w": base}, **options)["w"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_task_arithmetic_and_linear_give_the_cpu_bits(implementation, dtype, k):
    base, agents = _inputs(1500, k, dtype, seed=k)
    raw = [0.5 + t for t in range(k)]
    weights = torch.tensor(raw, dtype=torch.float64)
    cases = [
        ({"method": "task_arithmetic"}, torch.ones(k, dtype=torch.float64), 1.0),
        ({"method": "task_arithmetic", "weights": raw, "scale": 0.37}, weights, 0.37),
        ({"method": "linear", "weights": raw}, weights / float(weights.sum()), 1.0),
        ({"method": "linear", "weights": [-0.25] * k, "normalize": False}, torch.full((k,), -0.25).double(), 1.0),
    ]
    for options, w, scale in cases:
        out, invalid = _op(implementation, base, agents, w, scale)
        assert torch.equal(_bits(out), _bits(_cpu_merge(base, agents, **options))), options
        assert invalid == 0


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_sums_of_five_agents_differ_from_the_cpu_at_most_in_its_reduction_tail(implementation):
    """The CPU's sum over dim 0 adds the last entries of each chunk (fewer than 64) in another order when K >= 5;
    the device adds agent by agent everywhere: float32 results there may differ by a rounding."""
    base, agents = _inputs(1500, 5, torch.float32, seed=9)
    out, _ = _op(implementation, base, agents, torch.ones(5, dtype=torch.float64))
    expected = _cpu_merge(base, agents, method="task_arithmetic")
    assert torch.equal(out[:-64], expected[:-64])
    assert (_bits(out[-64:]) - _bits(expected[-64:])).abs().max() <= 2


@needs_triton
def test_philox_in_torch_is_tritons_rand():
    import triton
    import triton.language as tl

    @triton.jit
    def draw(out, seed, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offs, tl.rand(seed, offs), mask=offs < n)

    for seed in (7, 2**40 + 123, stable_seed("dare", 0, "agent_0", "w")):
        drawn = torch.empty(3000)
        draw[(3,)](drawn, seed, 3000, BLOCK=1024)
        assert torch.equal(drawn, philox.uniform(seed, 0, 3000, torch.device("cpu")))
        assert torch.equal(drawn[1000:1300], philox.uniform(seed, 1000, 1300, torch.device("cpu")))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dare_linear_kernel_and_torch_draw_the_same_masks(dtype):
    base, agents = _inputs(3000, 3, dtype, seed=2)
    seeds = [stable_seed("dare", 5, f"agent_{t}", "w") for t in range(3)]
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    densities = [0.3, 1.0, 0.7]
    out, invalid = _op("triton", base, agents, weights, 0.9, densities, seeds)
    expected, _ = _op("torch", base, agents, weights, 0.9, densities, seeds)
    assert torch.equal(_bits(out), _bits(expected)) and invalid == 0
    again, _ = _op("triton", base, agents, weights, 0.9, densities, seeds)
    assert torch.equal(_bits(again), _bits(out))
    other, _ = _op("triton", base, agents, weights, 0.9, densities, [s + 1 for s in seeds])
    assert not torch.equal(_bits(other), _bits(out))


def test_dare_drop_keeps_density_and_rescales():
    base = torch.zeros(20000)
    agents = [torch.ones(20000), torch.ones(20000)]
    out, _ = _op("torch", base, agents, torch.ones(2, dtype=torch.float64), 1.0, [0.25, 1.0], [11, 12])
    kept = out - 1.0  # agent 1 kept whole; agent 0 adds 1 / 0.25 where it survives
    assert set(kept.unique().tolist()) == {0.0, 4.0}
    assert abs(float((kept == 4.0).float().mean()) - 0.25) < 0.01
    mask = philox.keep_mask(11, 0, 20000, 0.25, base.device)
    assert torch.equal(kept == 4.0, mask.bool())


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # numpy, in the interpreter
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_invalid_entries_are_counted(implementation):
    base, agents = _inputs(2000, 3, torch.float16)
    agents[1][17] = float("nan")
    agents[2][40] = float("inf")
    _, invalid = _op(implementation, base, agents, torch.ones(3, dtype=torch.float64))
    assert invalid >= 2
    _, invalid = _op(implementation, base, agents[:1], torch.ones(1, dtype=torch.float64), scale=1e9)
    assert invalid > 0  # float16 overflows


def test_more_agents_than_kernel_arguments_take_the_torch_implementation():
    base, agents = _inputs(700, 9, torch.bfloat16)
    out, invalid = torch.empty_like(base), torch.zeros((), dtype=torch.int64)
    torch.ops.ram_live.linear_merge_(out, base, agents, torch.ones(9, dtype=torch.float64), 1.0, [], [], invalid)
    assert torch.equal(_bits(out), _bits(_cpu_merge(base, agents, method="task_arithmetic")))


def _inputs(n: int, k: int, dtype: torch.dtype, seed: int = 0):
    return flat_inputs(n, k, dtype, seed, share=0.6)
