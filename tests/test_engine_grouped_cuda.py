"""The grouped device merges (ram_live/engine/grouped.py) on a real GPU (``pytest -m cuda``; benchmarks/gpu_check.py
runs this): many tensors of odd sizes and two dtypes in one launch each, one of them 8 bytes off a 16-byte boundary
(merged on its own), against the CPU merge bit for bit, with RAM+'s counts. Kept apart from the interpreter's tests,
which set ``TRITON_INTERPRET=1`` for their whole process."""

import os

import pytest
import torch

import ram_live

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter's process, not the GPU's"),
]
SHAPES = {"a": ((1536, 257), torch.bfloat16), "b": ((1 << 20) + 3,), "c": ((7,), torch.float32), "d": ((300, 4099),)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _state(seed: int, base: dict | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, (shape, *dtype) in SHAPES.items():
        dtype = dtype[0] if dtype else (torch.bfloat16 if key == "b" else torch.float32)
        if base is None:
            out[key] = torch.randn(shape, generator=g).to(dtype)
        else:
            step = 0.01 * torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < 0.5)
            out[key] = (base[key].float() + step).to(dtype)
    holder = torch.zeros(1002)
    holder[2:] = torch.randn(1000, generator=g) if base is None else base["f"] + 0.1 * (torch.arange(1000) % 3 == 0)
    out["f"] = holder[2:]
    return out


@pytest.mark.parametrize(
    "options",
    [{"method": "ram"}, {"method": "ram_plus"}, {"method": "task_arithmetic", "scale": 0.7}, {"method": "ties"}],
    ids=str,
)
def test_cuda_grouped_merge_equals_cpu_merge(options, monkeypatch):
    from ram_live.kernels.device import common, group_baseline_triton, group_ties_triton, group_triton

    launched = []
    for module, name in [
        (group_triton, "launch_ram_merge_group"),
        (group_triton, "launch_activity_counts_group"),
        (group_baseline_triton, "launch_linear_merge_group"),
        (group_ties_triton, "launch_ties_group"),
    ]:

        def counted(outs, bases, *args, _real=getattr(module, name)):
            launched.append(len(bases))
            _real(outs, bases, *args)

        monkeypatch.setattr(module, name, counted)
    base = _state(0)
    agents = [_state(10 + t, base) for t in range(3)]
    expected, cpu = ram_live.merge(agents, base=base, return_info=True, **options)
    on_gpu = [{k: v.cuda() for k, v in a.items()} for a in agents]
    gpu_base = {k: v.cuda() for k, v in base.items()}
    gpu_base["f"] = torch.zeros(1002, device="cuda")[2:].copy_(base["f"])  # 8 bytes off a 16-byte boundary
    merged, info = ram_live.merge(on_gpu, base=gpu_base, return_info=True, **options)
    assert info.extra["kernels"] == {"device": 5}
    # a, b in one bfloat16 launch; c, d in one float32 launch; f (off the boundary) its own; RAM+ counts likewise
    assert sorted(launched) == ([2, 2, 2, 2] if options["method"] == "ram_plus" else [2, 2])
    assert common.unbuilt_kernels() == {}  # Triton built every kernel: not the torch fallback's bits
    for key in expected:
        assert torch.equal(_bits(merged[key].cpu()), _bits(expected[key])), key
    if cpu.statistics is not None:
        assert info.statistics.active.tolist() == cpu.statistics.active.tolist()
        assert info.lambdas == cpu.lambdas
