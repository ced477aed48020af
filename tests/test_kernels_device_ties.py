"""TIES and DARE-TIES on the device (ram_live/kernels/device/ties.py): the op's Triton kernel (under Triton's
interpreter on CPU tensors, thresholds from the radix select's histograms) and its torch implementation against the
CPU merge, bit for bit, over the election options; DARE-TIES' masks the same in both; invalid entries counted, also
where the election hides a NaN input."""

import importlib.util
import itertools

import pytest
import torch


from conftest import interpreter  # noqa: E402
import ram_live  # noqa: E402
from ram_live.functional import stable_seed  # noqa: E402
from device_helpers import bits as _bits, flat_inputs  # noqa: E402
from ram_live.kernels.device import select, ties  # noqa: E402

pytestmark = interpreter

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton's interpreter")
IMPLEMENTATIONS = [pytest.param("triton", marks=needs_triton), "torch"]


def _op(implementation, base, agents, weights, densities=None, drop=(), seeds=(), scale=1.0, **election):
    """The op with a trim (``densities``) or DARE's drop (``drop``), as TIES / DARE-TIES call it."""
    k = len(agents)
    selection = select.select_magnitudes(base, agents, densities) if densities is not None else None
    out, invalid = torch.empty_like(base), torch.zeros((), dtype=torch.int64)
    run = ties._triton_ties if implementation == "triton" else ties._torch_ties
    run(
        out, base, agents, weights,
        None if selection is None else selection.histograms, [] if selection is None else list(selection.ranks),
        list(drop), list(seeds), scale,
        ties.MAJORITY.index(election.get("majority_sign", "total")),
        election.get("elect_on", "unweighted") == "weighted",
        ties.DIVIDE.index(election.get("divide_by", "count")),
        invalid,
    )  # fmt: skip
    assert k == len(agents)
    return out, int(invalid)


ELECTIONS = [
    {},
    {"majority_sign": "frequency"},
    {"elect_on": "weighted", "divide_by": "weights"},
    {"majority_sign": "frequency", "elect_on": "weighted", "divide_by": "none"},
]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_ties_gives_the_cpu_bits(implementation, dtype, k):
    base, agents = _inputs(1200, k, dtype, seed=k)
    raw = [0.75 - 0.5 * t for t in range(k)]  # one negative weight from k = 3
    settings = itertools.cycle([(1.0, [0.2] * k), (1.7, [0.6, 1.0, 0.0005][:k])])
    for election, (scale, densities) in zip(ELECTIONS, settings):
        options = dict(election, weights=raw, scale=scale, densities=densities)
        weights = torch.tensor(raw, dtype=torch.float64)
        out, invalid = _op(implementation, base, agents, weights, densities, scale=scale, **election)
        expected = ram_live.merge([{"w": a} for a in agents], base={"w": base}, method="ties", **options)["w"]
        assert torch.equal(_bits(out), _bits(expected)), options
        assert invalid == 0


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_ties_of_four_agents_gives_the_cpu_bits(implementation):
    base, agents = _inputs(2000, 4, torch.bfloat16, seed=11)
    out, _ = _op(implementation, base, agents, torch.ones(4, dtype=torch.float64), [0.3, 0.2, 0.5, 0.1])
    cpu = ram_live.merge([{"w": a} for a in agents], base={"w": base}, method="ties", densities=[0.3, 0.2, 0.5, 0.1])
    assert torch.equal(_bits(out), _bits(cpu["w"]))


@needs_triton
@pytest.mark.parametrize("election", ELECTIONS[:3], ids=str)
def test_dare_ties_kernel_and_torch_draw_the_same_masks(election):
    base, agents = _inputs(2500, 3, torch.bfloat16, seed=4)
    seeds = [stable_seed("dare", 0, f"agent_{t}", "w") for t in range(3)]
    weights = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    drop = [0.5, 0.3, 1.0]
    out, invalid = _op("triton", base, agents, weights, drop=drop, seeds=seeds, **election)
    expected, _ = _op("torch", base, agents, weights, drop=drop, seeds=seeds, **election)
    assert torch.equal(_bits(out), _bits(expected)) and invalid == 0
    undropped, _ = _op("torch", base, agents, weights, **election)
    assert not torch.equal(_bits(out), _bits(undropped))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_invalid_inputs_and_outputs_are_counted(implementation):
    base, agents = _inputs(1000, 3, torch.float16)
    agents[0][5] = float("nan")
    agents[2][9] = float("-inf")
    out, invalid = _op(implementation, base, agents, torch.ones(3, dtype=torch.float64), [0.5, 0.5, 0.5])
    assert invalid >= 2 and not bool(torch.isfinite(out[5]))
    base, agents = _inputs(1000, 2, torch.float16)
    _, invalid = _op(implementation, base, agents, torch.ones(2, dtype=torch.float64), [1.0, 1.0], scale=1e9)
    assert invalid > 0  # float16 overflows


def _inputs(n: int, k: int, dtype: torch.dtype, seed: int = 0):
    return flat_inputs(n, k, dtype, seed, share=0.7)


@pytest.mark.parametrize(
    "ranks, k, one",
    [
        ([3, 0, -1, 5, 0, -1], 3, True),  # each agent: selects, keeps nothing, keeps all, in both tensors
        ([3, 0, -1, 5, 1, -1], 3, False),  # the second agent keeps nothing in one tensor, selects in the other
        ([-1, 2, 0, 2], 2, False),  # the first agent keeps all, then nothing
        ([7, 7, 9, 1], 2, True),
    ],
)
def test_a_grouped_ties_launch_takes_one_trim_pattern(ranks, k, one):
    from ram_live.kernels.device.ties import _one_pattern

    rows = [ranks[i : i + k] for i in range(0, len(ranks), k)]
    assert _one_pattern(ranks, k) is one
    assert one == (len({tuple((r > 0, r == 0) for r in row) for row in rows}) == 1)  # the rule it stands for
