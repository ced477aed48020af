"""The shape of each CUDA merge path, traced on fake CUDA tensors on a CPU build of torch (tests/device_trace.py):
per tensor, launches and aten calls that do not grow with its size, no host sync in the RAM family, its bytes
within the method's bound of the copy floor, no single-block selection on a whole tensor."""

import warnings

import pytest
import torch

import device_trace as trace

RAM_FAMILY = [("RAM", False), ("RAM+", False), ("RAM curvature", False)]
COMPILED = [("RAM", True), ("RAM+", True), ("RAM curvature", True)]
BASELINES = [("TA", False), ("TIES", False), ("DARE-TIES", False)]


@pytest.fixture(scope="module")
def fake_cuda():
    import ram_live.methods.dare as dare

    saved = getattr(dare, "dare_generator", None)
    if saved is not None:  # a CPU build has no CUDA generator; the mask's draw is the same op
        dare.dare_generator = lambda seed, agent, key, device: saved(seed, agent, key, torch.device("cpu"))
    with warnings.catch_warnings(), trace.FakeCuda() as fc:
        warnings.simplefilter("ignore")
        yield fc
    if saved is not None:
        dare.dare_generator = saved


@pytest.mark.parametrize("label,compile", RAM_FAMILY + COMPILED + BASELINES)
def test_device_path_is_near_floor_shaped(fake_cuda, label, compile):
    row = trace.measure(fake_cuda, label, compile)
    assert row.problems == []
    large = row.per[max(row.per)]
    if label in trace.RAM_FAMILY:
        assert large.syncs == 0 and large.launches <= trace.MAX_LAUNCHES
