"""A device merge's tensors in one launch per device and dtypes (ram_live/engine/grouped.py), run on CPU tensors
under Triton's interpreter: the CPU merge's bits, one launch per group, tensors that cannot join a group (an
address off a 16-byte boundary, a sink that writes as it goes) merged one by one, and errors that still name the
tensor and the agent."""

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreter  # noqa: E402
import ram_live  # noqa: E402
from ram_live.engine import checks  # noqa: E402
from ram_live.errors import NonFiniteError  # noqa: E402
from ram_live.kernels.device import group_baseline_triton, group_ties_triton, group_triton  # noqa: E402
from device_helpers import bits  # noqa: E402

pytestmark = interpreter


def _state(seed: int, base: dict | None = None) -> dict:
    """bfloat16 and float32 tensors of odd sizes, one of them an offset view (8 bytes off a 16-byte boundary)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"a": ((33, 17), torch.bfloat16), "b": ((1025,), torch.bfloat16), "c": ((7,), torch.float32),
              "d": ((300, 41), torch.float32), "e": ((5000,), torch.bfloat16)}  # fmt: skip
    out = {}
    for key, (shape, dtype) in shapes.items():
        if base is None:
            out[key] = torch.randn(shape, generator=g).to(dtype)
        else:
            step = 0.01 * torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < 0.6)
            out[key] = (base[key].float() + step).to(dtype)
    holder = torch.zeros(18, dtype=torch.float32)  # "f": 12 bytes into its storage
    holder[3:18] = torch.randn(15, generator=g) if base is None else base["f"] + 0.1
    out["f"] = holder[3:18]
    return out


@pytest.fixture
def launches(monkeypatch):
    """The grouped launches of the test: the number of tensors of each."""
    seen = []
    for module, name in [
        (group_triton, "launch_ram_merge_group"),
        (group_triton, "launch_activity_counts_group"),
        (group_baseline_triton, "launch_linear_merge_group"),
        (group_baseline_triton, "launch_dare_ties_group"),
        (group_ties_triton, "launch_ties_group"),
    ]:

        def counted(outs, bases, *args, _real=getattr(module, name)):
            seen.append(len(bases))
            _real(outs, bases, *args)

        monkeypatch.setattr(module, name, counted)
    return seen


MERGES = [
    {"method": "ram"},
    {"method": "ram_plus"},
    {"method": "task_arithmetic", "scale": 0.7, "weights": [0.5, 1.5, 1.0]},
    {"method": "linear", "weights": [0.2, 0.3, 0.5]},
    {"method": "ties", "density": 0.2},
    {"method": "ties", "densities": [0.1, 1.0, 0.4], "elect_on": "weighted", "divide_by": "weights"},
    {"method": "ties", "density": 0.3, "majority_sign": "frequency", "divide_by": "none", "scale": 0.5},
]


@pytest.mark.parametrize("options", MERGES, ids=lambda o: o["method"])
def test_grouped_merge_gives_the_cpu_merge_bits(options, launches, monkeypatch):
    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(3)}
    expected = ram_live.merge(agents, base=base, **options)
    monkeypatch.setattr(checks, "deferred_device", lambda dev: dev.type != "meta")
    merged, info = ram_live.merge(agents, base=base, return_info=True, **options)
    assert info.extra["kernels"] == {"device": 6}
    # bfloat16 a, b, e in one launch; float32 c, d in another; f on its own (RAM+: its counts likewise first; TIES:
    # c's 7 entries keep none at density 0.1, another trim pattern: its own group)
    expected_launches = {"ram_plus": [2, 2, 3, 3], "ties": [2, 3]}.get(options["method"], [2, 3])
    if options.get("densities") == [0.1, 1.0, 0.4]:
        expected_launches = [1, 1, 3]
    assert sorted(launches) == expected_launches
    for key in expected:
        assert torch.equal(bits(merged[key]), bits(expected[key])), key


def test_grouped_merge_of_modules_with_shared_sign(launches, on_device):
    from device_helpers import module_agents

    base, agents = module_agents(torch.bfloat16)
    merged = ram_live.merge(agents, base=base, method="ram", shared="sign")
    assert launches == [3]
    checks_off = pytest.MonkeyPatch()
    checks_off.setattr(checks, "deferred_device", lambda dev: False)
    try:
        expected = ram_live.merge(agents, base=base, method="ram", shared="sign")
    finally:
        checks_off.undo()
    for (key, p), q in zip(merged.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(bits(p), bits(q)), key


def test_a_sink_that_writes_as_it_goes_merges_tensor_by_tensor(launches, on_device, tmp_path):
    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(2)}
    path = ram_live.merge(agents, base=base, method="ram", out=tmp_path / "merged.safetensors")
    assert launches == []
    from safetensors.torch import load_file

    written = load_file(path)
    in_memory = ram_live.merge(agents, base=base, method="ram")
    assert sorted(launches) == [2, 3]
    for key in base:
        assert torch.equal(bits(written[key]), bits(in_memory[key])), key


def test_sources_that_make_a_tensor_per_read_and_sink_subclasses_merge_tensor_by_tensor(launches, on_device):
    """merge_task_vectors' zero base makes a tensor per read (held for a group, a model's worth would add up), and a
    sink's subclass may write as it goes: neither is grouped, and both give the grouped merge's bits."""
    from ram_live.io.sinks import StateDictSink

    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(2)}
    deltas = {name: {k: (a[k].float() - base[k].float()).to(a[k].dtype) for k in base} for name, a in agents.items()}
    ram_live.merge_task_vectors(deltas, method="ram")
    assert launches == []

    class Writing(StateDictSink):
        pass

    from ram_live.api import input_sources
    from ram_live.engine.run import run_merge
    from ram_live.methods import get_method, make_config

    sources, base_source = input_sources(agents, base)
    sink = Writing()
    run_merge(base_source, sources, get_method("ram"), make_config("ram"), sink)
    assert launches == []
    grouped = ram_live.merge(agents, base=base, method="ram")
    assert sorted(launches) == [2, 3]
    for key, value in sink.finish().items():
        assert torch.equal(bits(value), bits(grouped[key])), key


def test_an_invalid_entry_in_a_group_names_its_tensor_and_agent(launches, on_device):
    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(3)}
    agents["agent_2"]["b"][1024] = float("inf")
    with pytest.raises(NonFiniteError, match="agent 'agent_2'") as caught:
        ram_live.merge(agents, base=base, method="ram")
    assert caught.value.key == "b" and launches


@pytest.mark.parametrize(
    "options",
    [
        {"method": "dare_linear", "density": 0.4, "seed": 3},
        {"method": "dare_ties", "densities": [0.3, 1.0, 0.6], "elect_on": "weighted", "divide_by": "weights"},
        {"method": "dare_ties", "density": 0.5, "majority_sign": "frequency", "divide_by": "none", "scale": 0.5},
    ],
    ids=lambda o: "-".join(map(str, o.values()))[:40],
)
def test_grouped_dare_gives_the_one_tensor_launches_bits(options, launches, on_device, monkeypatch):
    """DARE's device masks (Philox, seeded per agent and tensor) are the kernels' own, not the CPU's: a grouped launch
    gives the bits of a launch per tensor."""
    from ram_live.engine import passes

    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(3)}
    merged = ram_live.merge(agents, base=base, **options)
    assert sorted(launches) == [2, 3]
    with monkeypatch.context() as m:
        m.setattr(passes, "merge_groups", lambda *args: (set(), {}))
        one_by_one = ram_live.merge(agents, base=base, **options)
    for key in base:
        assert torch.equal(bits(merged[key]), bits(one_by_one[key])), key
    assert not torch.equal(merged["d"], base["d"])


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_grouped_counts_are_the_one_tensor_counts(eps, launches, on_device, monkeypatch):
    """The counts of one launch are those of a launch per tensor (the CPU's single read does not keep the
    histogram), and the λ and the inputs' fingerprint are the CPU merge's."""
    from ram_live.engine import passes

    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(3)}
    agents["agent_1"]["d"] = base["d"].clone()  # an agent that changed nothing there
    _, info = ram_live.merge(agents, base=base, method="ram_plus", eps=eps, return_info=True)
    assert sorted(launches) == [2, 2, 3, 3]
    with monkeypatch.context() as m:
        m.setattr(passes, "count_groups", lambda *args: {})
        _, one_by_one = ram_live.merge(agents, base=base, method="ram_plus", eps=eps, return_info=True)
        m.setattr(checks, "deferred_device", lambda dev: False)
        _, cpu = ram_live.merge(agents, base=base, method="ram_plus", eps=eps, return_info=True)
    for field in ("active", "unique", "histogram"):
        assert getattr(info.statistics, field).tolist() == getattr(one_by_one.statistics, field).tolist(), field
    assert info.statistics.histogram.sum() == sum(t.numel() for t in base.values())
    assert info.statistics.active.tolist() == cpu.statistics.active.tolist()
    assert info.statistics.fingerprint == cpu.statistics.fingerprint
    assert info.lambdas == cpu.lambdas


def test_an_invalid_entry_met_by_the_grouped_counts_names_its_tensor(launches, on_device):
    base = _state(0)
    agents = {f"agent_{t}": _state(10 + t, base) for t in range(3)}
    agents["agent_0"]["e"][4999] = float("nan")
    with pytest.raises(NonFiniteError, match="agent 'agent_0'") as caught:
        ram_live.merge(agents, base=base, method="ram_plus")
    assert caught.value.key == "e" and len(launches) == 2  # the counts' launches only: nothing merged


def test_programs_cover_each_tensor_once():
    per = 1024 * group_triton.SPAN
    numels = [0, 1, per, per + 1, 3 * per - 5]
    programs, firsts = group_triton.program_tensors(numels, per, torch.device("cpu"))
    assert programs.tolist() == [1, 2, 3, 3, 4, 4, 4]
    assert firsts == (0, 0, 1, 2, 4)


@pytest.mark.parametrize("as_module", [False, True], ids=["dict", "module"])
def test_a_search_merges_its_candidates_in_grouped_launches(as_module, launches, on_device):
    """The search's reused outputs (a scratch module, a dict of tensors) hold their outputs: each candidate is one
    launch per group, RAM+ reusing the counts the first candidate took, with the one-shot merge's bits."""
    from device_helpers import module_agents
    from ram_live.selection.target import Merger

    if as_module:
        base, agents = module_agents(torch.bfloat16)
        groups = [3]  # Net's three bfloat16 tensors
    else:
        whole = _state(0)
        base = {k: v for k, v in whole.items() if k != "f"}
        agents = {f"agent_{t}": {k: v for k, v in _state(10 + t, whole).items() if k != "f"} for t in range(3)}
        groups = [2, 3]  # float32 c, d; bfloat16 a, b, e
    merger = Merger(agents, base)
    candidates = [{"method": "ram_plus", "r": 0.3}, {"method": "ram_plus", "r": 0.6}, {"method": "task_arithmetic"}]
    for i, candidate in enumerate(candidates):
        launches.clear()
        merged, info, _ = merger.merge(candidate)
        assert sorted(launches) == sorted(groups * (2 if i == 0 else 1)), candidate  # the first counts too
        assert info.extra["kernels"] == {"device": sum(groups)}
        expected = ram_live.merge(agents, base=base, **candidate)
        if as_module:
            merged, expected = merged.state_dict(), expected.state_dict()
        for key, value in expected.items():
            assert torch.equal(bits(merged[key]), bits(value)), (candidate, key)
    assert merger.statistics_passes == 1


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "one by one"])
def test_a_merged_value_past_float16_names_float16(grouped, on_device, launches, tmp_path):
    """Every input finite, the merged value past 65504: the recheck names the dtype the merge wrote, not the
    float32 it computed in (a grouped launch, and a launch per tensor where the sink writes as it goes)."""
    from ram_live.errors import NonFiniteError

    base = {"w": torch.zeros(64, 16, dtype=torch.float16), "b": torch.zeros(16, dtype=torch.float16)}
    agents = [{k: v.clone() for k, v in base.items()} for _ in range(2)]
    for a in agents:
        a["w"][3, 5] = 6e4
    out = None if grouped else tmp_path / "m.safetensors"
    with pytest.raises(NonFiniteError, match=r"tensor 'w': the merged value overflows torch\.float16") as err:
        ram_live.merge(agents, base=base, method="task_arithmetic", scale=2.0, out=out)
    assert err.value.key == "w"
    assert bool(launches) is grouped
