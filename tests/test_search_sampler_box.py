"""The sampler's boxes as the evidence comes in (sampler_box.grown) and where a sampled arm's sampler runs among its
moves (budget.Arm.steps)."""

from __future__ import annotations

import pytest

from ram_live.selection.budget import AFTER_SAMPLER, arms_of
from ram_live.selection.result import Trial
from ram_live.selection.sampler_box import GROWN_HIGH, Box, Dim, grown
from ram_live.selection.space import parse_space


def _trial(index: int, score: float, fidelity: float = 1.0) -> Trial:
    t = Trial(index, "sampled:task_arithmetic", "task_arithmetic", {}, score, 0.0, 0.0, 1.0, "baseline")
    t.fidelity = fidelity
    return t


def _box(high: float = 3.0, names: tuple[str, ...] = ("w:a", "w:b")) -> Box:
    return Box("task_arithmetic", [Dim(n, 0.0, high) for n in names], dict, lambda t: None)


def test_the_weights_box_grows_to_twice_the_best_points_largest_weight():
    observed = [({"w:a": 2.6, "w:b": 0.4}, _trial(0, 0.9)), ({"w:a": 0.5, "w:b": 2.9}, _trial(1, 0.5))]
    wider = grown(_box(), [], observed)
    assert [(d.name, d.low, d.high) for d in wider.dims] == [("w:a", 0.0, 5.2), ("w:b", 0.0, 5.2)]
    assert wider.arm == "task_arithmetic" and wider.build is dict
    # the best point's largest weight is what counts (not the worse point's 2.9); capped at GROWN_HIGH
    assert grown(_box(), [], [({"w:a": 7.0, "w:b": 1.0}, _trial(0, 0.9))]).dims[0].high == GROWN_HIGH == 8.0
    # a candidate the race stopped is no best point: its weights do not grow the box
    stopped = [({"w:a": 2.9, "w:b": 0.1}, _trial(0, 0.95, fidelity=1 / 3)), ({"w:a": 1.0, "w:b": 1.0}, _trial(1, 0.8))]
    assert grown(_box(), [], stopped).dims[0].high == 3.0


def test_the_box_is_kept_when_no_wider_is_wanted_or_its_bound_was_given():
    box = _box()
    assert grown(box, [], [({"w:a": 1.4, "w:b": 1.0}, _trial(0, 0.9))]) is box  # 2 x 1.4 <= 3: as it was
    assert grown(box, [], []) is box
    given = parse_space({"task_arithmetic": None, "ta_weights": {"high": 3}})
    assert grown(box, given, [({"w:a": 2.9, "w:b": 1.0}, _trial(0, 0.9))]) is box
    density = Box("ties", [Dim("density", 0.05, 1.0), Dim("scale", 0.25, 3.0)], dict, lambda t: None)
    assert grown(density, [], [({"density": 0.9, "scale": 2.9}, _trial(0, 0.9))]) is density
    lam = Box("ram", [Dim("lam:a", 0.0, 3.0)], dict, lambda t: None)
    assert grown(lam, [], [({"lam:a": 2.5}, _trial(0, 0.9))]).dims[0].high == 5.0


def test_a_sampled_ram_arm_runs_its_sampler_before_leave_one_out_and_activity():
    ram = next(a for a in arms_of(parse_space(None))[1] if a.name == "ram")
    ram.sampled = True
    kinds = [f.kind for f in ram.steps]
    assert kinds.index("sampled") < kinds.index("leave_one_out") < kinds.index("activity")
    assert set(AFTER_SAMPLER) == {"leave_one_out", "activity"}
    ram.sampled = False  # the moves: as before, the finite moves before the ascents
    kinds = [f.kind for f in ram.steps]
    assert "sampled" not in kinds and kinds.index("leave_one_out") < kinds.index("shared_weights")


def test_an_optuna_study_per_box_a_grown_box_is_told_every_point_again():
    optuna = pytest.importorskip("optuna")
    from ram_live.selection.sampler import OptunaProposer

    proposer = OptunaProposer(optuna.samplers.RandomSampler(seed=0))
    observed = [({"w:a": 2.6, "w:b": 0.4}, _trial(0, 0.9)), ({"w:a": 0.5, "w:b": 1.0}, _trial(1, 0.5))]
    point = proposer.propose(_box(), observed)
    assert all(0.0 <= v <= 3.0 for v in point.values())
    proposer.tell(point, None)
    wider = grown(_box(), [], observed)
    proposer.propose(wider, observed)
    assert len(proposer.studies) == 2
    study = next(s for key, (s, _, _) in proposer.studies.items() if key[1][2] == 5.2)
    assert [t.params for t in study.trials[:2]] == [{"w:a": 2.6, "w:b": 0.4}, {"w:a": 0.5, "w:b": 1.0}]
    assert study.trials[0].distributions["w:a"].high == 5.2
