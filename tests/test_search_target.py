"""ram_live.selection.target: whatever an evaluation does to what it is handed, every candidate of a search is
scored on its own merge (never on a stale one), and merge(**candidate) re-makes what was scored."""

from __future__ import annotations

import pytest
import torch

from ram_live import merge, search

from conftest import make_agents, module_of, snapshot

pytestmark = pytest.mark.filterwarnings("ignore::ram_live.ExtrapolationWarning")

SPACE = [
    {"method": "ram"},
    {"method": "task_arithmetic", "scale": 0.5},
    {"method": "ram_plus", "r": 0.5},
    {"method": "task_arithmetic", "scale": 2.0},
    {"method": "ties", "density": 0.3},
]


def _rebind_float64(sd):
    for k in list(sd):
        sd[k] = sd[k].double()


def _rebind_clone(sd):
    for k in list(sd):
        sd[k] = sd[k].clone().mul_(3.0)


def _delete_keys(sd):
    for k in list(sd)[::2]:
        del sd[k]


def _clear(sd):
    sd.clear()


def _free_storage(sd):
    for v in sd.values():
        v.untyped_storage().resize_(0)  # as an evaluation that offloads what it was handed might


def _set_data_other_shape(sd):
    for k in list(sd):
        sd[k].data = torch.zeros(1)


def _in_place(sd):
    for v in sd.values():
        v.mul_(-7.0)


def _requires_grad(sd):
    for v in sd.values():
        v.requires_grad_(True)


DICT_EDITS = [
    _rebind_float64,
    _rebind_clone,
    _delete_keys,
    _clear,
    _free_storage,
    _set_data_other_shape,
    _in_place,
    _requires_grad,
]


@pytest.mark.parametrize("edit", DICT_EDITS, ids=[f.__name__.strip("_") for f in DICT_EDITS])
def test_an_evaluation_that_edits_the_dict_it_is_handed_never_scores_a_stale_merge(base_sd, edit):
    agents = dict(zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05)))
    seen = []

    def evaluate(merged):
        seen.append(snapshot(merged))
        score = float(sum(v.double().sum() for v in merged.values()))
        edit(merged)
        return score

    result = search(agents, base=base_sd, evaluate=evaluate, budget=len(SPACE), space=SPACE)
    assert len(seen) == len(SPACE)
    for trial, state in zip(result.history, seen):
        again = merge(agents, base=base_sd, **trial.candidate)
        assert sorted(state) == sorted(again)
        assert all(torch.equal(state[k], again[k]) for k in again), trial.label()
    scores = [t.score for t in result.history]
    assert len(set(scores)) == len(scores)  # different merges, different scores


def _replace_parameter(m):
    m.embed.weight = torch.nn.Parameter(torch.zeros_like(m.embed.weight))


def _convert_dtype(m):
    m.double()


def _delete_parameter(m):
    del m.head.weight


def _swap_submodule(m):
    m.layers = torch.nn.Module()


def _in_place_module(m):
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(-7.0)


def _training_flag(m):
    m.layers.train(False)


def _set_data_same_shape(m):
    m.embed.weight.data = torch.zeros_like(m.embed.weight)


def _set_data_transposed(m):
    w = getattr(m.layers, "0").w
    w.data = w.data.t()  # a square weight: same shape and dtype, other strides


def _add_submodule(m):
    m.extra = torch.nn.Linear(2, 2)


def _register_parameter(m):
    m.head.register_parameter("scale", torch.nn.Parameter(torch.ones(())))


def _replace_parameters_dict(m):
    m.embed._parameters = {k: torch.nn.Parameter(torch.zeros_like(v)) for k, v in m.embed._parameters.items()}


class _Doubled(torch.nn.Module):
    def forward(self, x):
        return 2 * x


def _swap_class(m):
    m.head.__class__ = _Doubled


def _free_module_storage(m):
    for p in m.parameters():
        p.untyped_storage().resize_(0)


MODULE_EDITS = [
    _replace_parameter,
    _convert_dtype,
    _delete_parameter,
    _swap_submodule,
    _in_place_module,
    _training_flag,
    _set_data_same_shape,
    _set_data_transposed,
    _add_submodule,
    _register_parameter,
    _replace_parameters_dict,
    _swap_class,
    _free_module_storage,
]


@pytest.mark.parametrize("edit", MODULE_EDITS, ids=[f.__name__.strip("_") for f in MODULE_EDITS])
def test_an_evaluation_that_edits_the_module_it_is_handed_never_scores_a_stale_merge(base_sd, edit):
    base = module_of(base_sd)
    agents = {n: module_of(a) for n, a in zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05))}
    seen, flags = [], []

    def evaluate(module):
        seen.append(snapshot(module))
        flags.append([type(m) for m in module.modules()] + [m.training for m in module.modules()])
        score = float(sum(p.detach().double().sum() for p in module.parameters()))
        edit(module)
        return score

    result = search(agents, base=base, evaluate=evaluate, budget=len(SPACE), space=SPACE)
    for trial, state in zip(result.history, seen):
        again = merge(agents, base=base, **trial.candidate).state_dict()
        assert sorted(state) == sorted(again)
        assert all(torch.equal(state[k], again[k]) and state[k].dtype == again[k].dtype for k in again), trial.label()
    assert all(f == [type(m) for m in base.modules()] + [m.training for m in base.modules()] for f in flags)
    assert all(torch.equal(v, base_sd[k]) for k, v in base.state_dict().items())  # the base is untouched


def test_an_evaluation_that_leaves_the_output_alone_gets_the_same_tensors_every_time(base_sd):
    """The reuse the search relies on for memory: no edits, no new allocation (same storage every candidate)."""
    agents = dict(zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05)))
    base = module_of(base_sd)
    for base_in in (base_sd, base):
        pointers = []

        def evaluate(merged):
            sd = merged.state_dict() if isinstance(merged, torch.nn.Module) else merged
            pointers.append({k: v.data_ptr() for k, v in sd.items()})
            return 0.0

        search(
            {n: module_of(a) if base_in is base else a for n, a in agents.items()},
            base=base_in,
            evaluate=evaluate,
            budget=len(SPACE),
            space=SPACE,
        )
        assert all(p == pointers[0] for p in pointers)


class _Buffered(torch.nn.Module):
    def __init__(self, sd):
        super().__init__()
        self.inner = module_of(sd)
        self.register_buffer("scale", torch.ones(()), persistent=False)

    def forward(self):
        return sum(p.sum() for p in self.inner.parameters()) * self.scale


def test_state_outside_the_state_dict_does_not_reach_the_next_candidate(base_sd):
    """Non-persistent buffers, gradients and hooks an evaluation leaves on the scratch module: every candidate is
    still scored as a fresh merge would be."""
    base = _Buffered(base_sd)
    agents = {n: _Buffered(a) for n, a in zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05))}

    def score(module):
        return float(module().detach()) + float(sum(0 if p.grad is None else p.grad.sum() for p in module.parameters()))

    def evaluate(module):
        value = score(module)
        module.scale.mul_(2.0)
        module().backward()  # leaves .grad
        module.register_forward_hook(lambda m, i, o: o * 10)
        return value

    result = search(agents, base=base, evaluate=evaluate, budget=len(SPACE), space=SPACE)
    for trial in result.history:
        assert trial.score == score(merge(agents, base=base, **trial.candidate)), trial.label()


def test_each_slice_of_a_race_sees_the_merge_itself(base_sd):
    """An evaluation that rebinds or scales entries inside prompt_scores: the race's later slices are scored on
    the candidate merged anew, not on what the earlier call left."""
    from search_evals import PromptEval

    agents = dict(zip(("coder", "tools", "memory"), make_agents(base_sd, [0.3, 0.3, 0.3], scale=0.05)))
    targets = {"math": merge(agents, base=base_sd, method="ram", lambdas={"coder": 2.0, "tools": 0.5, "memory": 3.0})}

    class Rebinds(PromptEval):
        def prompt_scores(self, merged, indices):
            self.calls.append(snapshot(merged))
            out = super().prompt_scores(merged, indices)
            merged["head.weight"] = merged["head.weight"] * 0.9
            merged["embed.weight"].mul_(0.5)
            del merged["layers.0.w"]
            return out

    ev = Rebinds(targets, per_task=36)  # slices of 4/12/36 prompts: the race stops none on fewer than 4
    clean = PromptEval(targets, per_task=36)
    raced = search(agents, base=base_sd, evaluate=ev, budget="6x", fidelity="halving")
    reference = search(agents, base=base_sd, evaluate=clean, budget="6x", fidelity="halving")
    assert [(t.candidate, t.score, t.fidelity) for t in raced.history] == [
        (t.candidate, t.score, t.fidelity) for t in reference.history
    ]
    assert any(t.fidelity < 1 for t in raced.history)


class _TiedByStorage(torch.nn.Module):
    """Two Parameters on one storage (tied by address, not one Parameter under two names)."""

    def __init__(self, sd):
        super().__init__()
        self.inner = module_of(sd)
        self.out = torch.nn.Parameter(torch.empty(0))
        self.out.data = self.inner.embed.weight.data


def test_a_weight_tied_by_storage_is_written_in_the_scratch_module(base_sd):
    base = _TiedByStorage(base_sd)
    agents = {n: _TiedByStorage(a) for n, a in zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05))}
    seen = []

    def evaluate(module):
        seen.append(snapshot(module))
        return 0.0

    result = search(agents, base=base, evaluate=evaluate, budget=3, space=SPACE[:3])
    for trial, state in zip(result.history, seen):
        assert torch.equal(state["out"], state["inner.embed.weight"]), trial.label()
        assert torch.equal(state["out"], merge(agents, base=base, **trial.candidate).out), trial.label()


def test_training_flags_and_buffers_follow_the_base_as_it_is_at_each_candidate(base_sd):
    base = _Buffered(base_sd)
    agents = {n: _Buffered(a) for n, a in zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05))}
    seen = []

    def evaluate(module):
        seen.append(([m.training for m in module.modules()], float(module.scale)))
        base.train(len(seen) % 2 == 0)  # the next candidate: the base's flags as they are then
        base.scale.fill_(float(len(seen) + 1))
        return 0.0

    search(agents, base=base, evaluate=evaluate, budget=len(SPACE), space=SPACE)
    for i, (flags, scale) in enumerate(seen):
        training = i == 0 or i % 2 == 0
        assert flags == [training] * len(flags) and scale == (1.0 if i == 0 else float(i + 1)), i


def test_a_base_buffer_of_another_shape_makes_a_new_scratch_module(base_sd):
    base = _Buffered(base_sd)
    agents = {n: _Buffered(a) for n, a in zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6], scale=0.05))}
    seen = []

    def evaluate(module):
        seen.append(module.scale.clone())
        base.scale = torch.full((len(seen) + 1,), 2.0)  # the base's non-persistent buffer, rebound to a new shape
        return 0.0

    search(agents, base=base, evaluate=evaluate, budget=3, space=SPACE[:3])
    assert [s.tolist() for s in seen] == [1.0, [2.0, 2.0], [2.0, 2.0, 2.0]]
