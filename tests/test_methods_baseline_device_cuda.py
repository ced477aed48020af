"""The baselines' device kernels compiled for a real GPU (``pytest -m cuda``; benchmarks/gpu_check.py runs these):
task arithmetic, linear and TIES against the CPU merge bit for bit, TIES' thresholds against ``kthvalue``, DARE's
Triton masks against the torch implementation's. Kept apart from the interpreter's tests, which set
``TRITON_INTERPRET=1`` for their whole process."""

import os

import pytest
import torch

import ram_live
from ram_live.functional import magnitude_threshold, stable_seed
from ram_live.kernels.device import linear, select, ties

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter's process, not the GPU's"),
]
N = (1 << 20) + 37  # several programs per multiprocessor, and a ragged last block


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _inputs(dtype: torch.dtype, k: int = 3) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(N, generator=g).to(dtype)
    agents = []
    for t in range(k):
        changed = torch.rand(N, generator=g) < (0.03, 0.46, 0.54, 0.3)[t % 4]
        agents.append((base.float() + 10.0 ** -(t + 2) * torch.randn(N, generator=g) * changed).to(dtype))
    return base, agents


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "options",
    [
        {"method": "task_arithmetic", "scale": 0.7, "weights": [1.0, 0.5, 2.0]},
        {"method": "linear"},
        {"method": "ties", "density": 0.2},
        {"method": "ties", "densities": [0.1, 1.0, 0.4], "elect_on": "weighted", "divide_by": "weights"},
        {"method": "ties", "density": 0.3, "majority_sign": "frequency", "divide_by": "none", "scale": 0.5},
    ],
    ids=lambda o: "-".join(map(str, o.values()))[:48],
)
def test_cuda_merge_equals_cpu_merge(dtype, options):
    base, agents = _inputs(dtype)
    expected = ram_live.merge([{"w": a} for a in agents], base={"w": base}, **options)["w"]
    merged, info = ram_live.merge(
        [{"w": a.cuda()} for a in agents], base={"w": base.cuda()}, return_info=True, **options
    )
    assert info.extra["kernels"] == {"device": 1}
    assert torch.equal(_bits(merged["w"].cpu()), _bits(expected))


def test_cuda_thresholds_equal_kthvalue():
    base, agents = _inputs(torch.bfloat16, k=4)
    densities = [0.2, 0.01, 0.5, 0.9]
    cuda = select.select_magnitudes(base.cuda(), [a.cuda() for a in agents], densities)
    expected = [magnitude_threshold(a.float() - base.float(), d) for a, d in zip(agents, densities)]
    assert cuda.thresholds(torch.device("cuda")).tolist() == expected


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_cuda_dare_masks_equal_the_torch_implementations(method):
    base, agents = _inputs(torch.bfloat16)
    base, agents = base.cuda(), [a.cuda() for a in agents]
    weights = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64, device="cuda")
    seeds = [stable_seed("dare", 1, f"agent_{t}", "w") for t in range(3)]
    outs = []
    for run in ("triton", "torch"):
        out, invalid = torch.empty_like(base), torch.zeros((), dtype=torch.int64, device="cuda")
        if method == "dare_linear":
            kernel = linear._triton_linear if run == "triton" else linear._torch_linear
            kernel(out, base, agents, weights, 0.9, [0.5, 0.3, 1.0], seeds, invalid)
        else:
            kernel = ties._triton_ties if run == "triton" else ties._torch_ties
            kernel(out, base, agents, weights, None, [], [0.5, 0.3, 1.0], seeds, 0.9, 0, False, 0, invalid)
        outs.append(out.cpu())
        assert int(invalid) == 0
    assert torch.equal(_bits(outs[0]), _bits(outs[1]))
