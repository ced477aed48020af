"""An agent that changed nothing (density 0, ρ = +∞: a GRPO run whose reward was always 0) is named in one
``UnchangedAgentWarning`` per merge and in ``MergeInfo.extra["unchanged"]``: from the counts where the merge counts,
else by comparing it with the base (every method); the merged values stay the merge of the other agents, bit for
bit (the spec: its λ scales no entry)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from ram_live import merge
from ram_live.errors import RamLiveWarning, UnchangedAgentWarning
from ram_live.engine.unchanged import quiet_unchanged, unchanged_agents

from conftest import assert_bit_identical, make_agents


def _merge_caught(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = merge(*args, **kwargs)
    return out, [w for w in caught if issubclass(w.category, UnchangedAgentWarning)]


@pytest.fixture
def trained(base_sd):
    return dict(zip(["coder", "tools"], make_agents(base_sd, [0.3, 0.5])))


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("method", ["ram_plus", "ram_plus_soft"])
def test_an_unchanged_agent_is_named_once_and_changes_nothing(base_sd, trained, method, native, monkeypatch):
    if not native:
        import ram_live.methods.ram.native as native_mod

        monkeypatch.setattr(native_mod, "_KERNELS", None)
    idle = {k: v.clone() for k, v in base_sd.items()}
    (merged, info), named = _merge_caught({**trained, "idle": idle}, base=base_sd, method=method, return_info=True)
    assert len(named) == 1 and named[0].message.agents == ("idle",)
    assert str(named[0].message).startswith(f"{method}: agent 'idle' changed no entry of the base (density 0")
    assert named[0].filename == __file__  # it points at the merge call, not into the library
    assert isinstance(named[0].message, RamLiveWarning) and isinstance(named[0].message, UserWarning)
    assert info.extra["unchanged"] == ["idle"]
    assert info.statistics.active.tolist()[2] == 0 and info.rho["idle"] == math.inf
    # its λ is the rule's at ρ = +∞, as before (1 + r·α; RAM+s: 1 + r), and scales no entry
    assert info.lambdas["idle"] == pytest.approx(1.2 if method == "ram_plus" else 1.1, abs=1e-12)
    (alone, info_alone), quiet = _merge_caught(trained, base=base_sd, method=method, return_info=True)
    assert quiet == [] and "unchanged" not in info_alone.extra
    assert_bit_identical(merged, alone)
    assert {n: info.lambdas[n] for n in trained} == info_alone.lambdas


def test_several_unchanged_agents_are_one_warning(base_sd, trained):
    idle = {k: v.clone() for k, v in base_sd.items()}
    agents = {"zero": idle, **trained, "also": {k: v.clone() for k, v in base_sd.items()}}
    (_, info), named = _merge_caught(agents, base=base_sd, return_info=True)
    assert len(named) == 1 and named[0].message.agents == ("zero", "also")
    assert "agents 'zero', 'also' changed no entry" in str(named[0].message)
    assert info.extra["unchanged"] == ["zero", "also"]


def test_plain_ram_names_it_where_the_merge_counts(base_sd, trained):
    """Plain RAM counts in place (the validation pass); an out-of-place plain RAM merge reads the weights once and
    counts nothing, so there it cannot tell (the training callbacks and verl, which count, name it for every
    method)."""
    idle = {k: v.clone() for k, v in base_sd.items()}
    agents = {**trained, "idle": idle}
    module = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(v.clone()) for k, v in base_sd.items()})
    flat = {n: {k.replace(".", "_"): v for k, v in a.items()} for n, a in agents.items()}
    (_, info), named = _merge_caught(flat, base=module, method="ram", inplace=True, return_info=True)
    assert len(named) == 1 and named[0].message.agents == ("idle",) and info.extra["unchanged"] == ["idle"]
    assert str(named[0].message).startswith("ram: agent 'idle'")
    want = merge(trained, base=base_sd, method="ram")
    assert_bit_identical({k: module[k.replace(".", "_")].detach() for k in base_sd}, want)


def test_quiet_unchanged_records_without_warning(base_sd, trained):
    idle = {k: v.clone() for k, v in base_sd.items()}
    with quiet_unchanged():
        (_, info), named = _merge_caught({**trained, "idle": idle}, base=base_sd, return_info=True)
    assert named == [] and info.extra["unchanged"] == ["idle"]
    (_, info), named = _merge_caught({**trained, "idle": idle}, base=base_sd, return_info=True)
    assert len(named) == 1  # the block is over: warned again


def test_warnings_as_errors_stop_an_in_place_merge_before_anything_is_written(base_sd, trained):
    idle = {k: v.clone() for k, v in base_sd.items()}
    module = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(v.clone()) for k, v in base_sd.items()})
    agents = {n: {k.replace(".", "_"): v for k, v in a.items()} for n, a in {**trained, "idle": idle}.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnchangedAgentWarning)
        with pytest.raises(UnchangedAgentWarning, match="'idle'"):
            merge(agents, base=module, inplace=True)
    for k, v in base_sd.items():
        assert torch.equal(module[k.replace(".", "_")].detach(), v), k


def test_unchanged_agents_reads_counts():
    assert unchanged_agents(["a", "b", "c"], [3, 0, 0.0]) == ["b", "c"]
    assert unchanged_agents(["a"], torch.tensor([1]).tolist()) == []


@pytest.mark.parametrize(
    "options",
    [
        {"method": "ram"},
        {"method": "ram_plus", "rho_scope": "tensor"},
        {"method": "ram_plus", "lambdas": {"coder": 1.5, "tools": 1.0, "idle": 2.0}},
        {"method": "ties", "density": 0.5},
        {"method": "task_arithmetic"},
        {"method": "dare_linear", "density": 0.5},
    ],
    ids=lambda o: "-".join(map(str, o.values()))[:30],
)
def test_a_merge_that_counts_nothing_still_names_an_unchanged_agent(base_sd, trained, options):
    idle = {k: v.clone() for k, v in base_sd.items()}
    (merged, info), named = _merge_caught({**trained, "idle": idle}, base=base_sd, return_info=True, **options)
    assert info.statistics is None
    assert len(named) == 1 and named[0].message.agents == ("idle",)
    assert named[0].filename == __file__
    assert info.extra["unchanged"] == ["idle"]
    _, none = _merge_caught(trained, base=base_sd, **{k: v for k, v in options.items() if k != "lambdas"})
    assert none == []


def test_identical_agents_stops_at_each_agents_first_changed_tensor(base_sd, trained):
    from ram_live.api import input_sources
    from ram_live.engine.plan import build_plan
    from ram_live.engine.reader import Reader
    from ram_live.engine.unchanged import identical_agents

    idle = {k: v.clone() for k, v in base_sd.items()}
    late = {k: v.clone() for k, v in base_sd.items()}
    last = list(late)[-1]
    late[last] = late[last] + 1.0  # changed only in its last tensor
    agents, base = input_sources({"coder": trained["coder"], "idle": idle, "late": late}, base_sd)
    plan = build_plan(base, agents)
    reader = Reader(base, agents, None)
    reads = []
    original = reader.read
    reader.read = lambda key: reads.append(key) or original(key)
    assert identical_agents(reader, plan.merge) == ["idle"]
    assert reads == list(plan.merge)  # "idle" is read to the end; nothing is read twice
    with torch.no_grad():
        idle[list(idle)[0]].view(-1)[0] += 1.0
    reads.clear()
    assert identical_agents(reader, plan.merge) == []
    assert len(reads) == len(plan.merge)  # "late" changes only in the last tensor
