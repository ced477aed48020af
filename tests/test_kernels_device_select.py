"""TIES' trim thresholds selected on the device (ram_live/kernels/device/select.py): the radix select's three digit
passes, by the Triton kernel (under Triton's interpreter on CPU tensors) and by the torch implementation, give every
agent's k-th largest |τ| exactly as ``magnitude_threshold`` (``kthvalue``) does, ties and edge densities included."""

import importlib.util
import math

import pytest
import torch


from conftest import interpreter  # noqa: E402
from ram_live.functional import magnitude_threshold  # noqa: E402
from ram_live.kernels.device import select  # noqa: E402

pytestmark = interpreter

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton's interpreter")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _inputs(n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A base and four agents: sparse small changes, dense ones over several octaves, many equal |τ| (one bf16
    step), and an agent equal to the base."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g).to(dtype)
    sparse = base.float() + 1e-3 * torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.3)
    octaves = base.float() + torch.randn(n, generator=g) * torch.logspace(-6, 0, n)[torch.randperm(n, generator=g)]
    steps = base.float() + torch.sign(torch.randn(n, generator=g)) * 2.0**-8
    return base, [sparse.to(dtype), octaves.to(dtype), steps.to(dtype), base.clone()]


def _expected(base, agents, densities) -> list[float]:
    out = []
    for agent, density in zip(agents, densities):
        threshold = magnitude_threshold(agent.float() - base.float(), density)
        out.append(0.0 if threshold is None else threshold)
    return out


def _run(implementation: str, base, agents, densities) -> select.MagnitudeSelection:
    ranks = [select.selection_rank(d, base.numel()) for d in densities]
    hist = torch.zeros(3, len(agents), select.NBINS, dtype=torch.int32)
    run = select._triton_histogram if implementation == "triton" else select._torch_histogram
    for p in range(3):
        run(base, agents, ranks, p, hist)
    return select.MagnitudeSelection(tuple(ranks), hist)


@pytest.mark.parametrize("implementation", [pytest.param("triton", marks=needs_triton), "torch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_thresholds_equal_kthvalue(implementation, dtype):
    base, agents = _inputs(3000, dtype)
    for densities in ([0.2, 0.2, 0.2, 0.2], [0.9, 0.05, 0.5, 0.3], [1e-4, 0.999, 0.25, 1.0]):
        selection = _run(implementation, base, agents, densities)
        assert selection.thresholds(base.device).tolist() == _expected(base, agents, densities), densities


@needs_triton
def test_kernel_and_torch_histograms_are_the_same_counts():
    base, agents = _inputs(2500, torch.bfloat16, seed=3)
    densities = [0.3, 0.1, 0.6, 0.2]
    triton_run, torch_run = _run("triton", base, agents, densities), _run("torch", base, agents, densities)
    assert torch.equal(triton_run.histograms, torch_run.histograms)
    # pass 0 counts every entry once per selecting agent (bit 31 of |τ| is 0: every digit has a bin)
    assert triton_run.histograms[0].sum(dim=1).tolist() == [2500] * 4


def test_edge_densities_need_no_selection():
    base, agents = _inputs(100, torch.float32)
    selection = select.select_magnitudes(base, agents, [1.0, 0.001, 1.5, 0.0])
    assert selection.ranks == (-1, 0, -1, 0) and selection.histograms is None
    assert selection.thresholds(base.device).tolist() == [0.0, math.inf, 0.0, math.inf]
    assert select.selection_rank(0.5, 7) == 3 and select.selection_rank(0.0, 10**9) == 0


@needs_triton
def test_select_op_runs_three_passes_on_the_device_tensors():
    base, agents = _inputs(1200, torch.float16, seed=5)
    densities = [0.5, 0.2, 0.01, 0.7]
    selection = select.select_magnitudes(base, agents, densities)  # the custom op, Triton under the interpreter
    assert selection.histograms.shape == (3, 4, select.NBINS) and selection.histograms.dtype == torch.int32
    assert selection.thresholds(base.device).tolist() == _expected(base, agents, densities)


def test_fake_implementation_traces_without_data():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        base = torch.empty(1 << 20, dtype=torch.bfloat16)
        selection = select.select_magnitudes(base, [torch.empty_like(base)] * 3, [0.2, 0.2, 0.2])
    assert selection.ranks == (209715,) * 3 and selection.histograms.shape == (3, 3, select.NBINS)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_threshold_kernel_selects_kthvalue_once_per_tensor(dtype):
    """The merge's thresholds, written by one program from the three histograms, are ``kthvalue``'s bits; agents
    that select nothing keep what the tensor held."""
    base, agents = _inputs(3000, dtype, seed=3)
    densities = [0.3, 0.01, 1.0, 0.2]
    selection = _run("triton", base, agents, densities)
    got = select.triton_thresholds(selection.histograms, list(selection.ranks))
    expected = _expected(base, agents, densities)
    assert [got[t].item() for t in (0, 1, 3)] == [expected[t] for t in (0, 1, 3)]
    assert expected[1] > 0 and selection.ranks[2] == -1


@needs_triton
def test_histograms_with_several_steps_per_program(monkeypatch):
    """Two programs for the tensor (one multiprocessor): each walks several whole blocks unmasked, one takes the
    partial last block; every pass counts what the torch implementation counts."""
    from ram_live.kernels.device import common

    monkeypatch.setattr(common, "_multiprocessors", lambda device: 1)
    n = 8 * 512 * 3 + 7
    base, agents = _inputs(n, torch.float32, seed=6)
    ranks = [select.selection_rank(d, n) for d in (0.2, 0.05, 0.5, 0.3)]
    hists = []
    for run in (select._triton_histogram, select._torch_histogram):
        hist = torch.zeros(3, len(agents), select.NBINS, dtype=torch.int32)
        for p in range(3):
            run(base, agents, ranks, p, hist)
        hists.append(hist)
    assert torch.equal(hists[0], hists[1]) and int(hists[0][0].sum()) == 4 * n  # pass 0 counts every entry
