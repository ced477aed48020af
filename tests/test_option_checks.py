"""ram_live.option_checks.finite_float: the one rule for a number the library is handed (a reward, a weight, an
evaluation's score, a search record's metric), with the reason it gives for each refusal."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from ram_live.option_checks import finite_float
from ram_live.training.search import search_metrics


@pytest.mark.parametrize(
    "value, want",
    [
        (3, 3.0),
        (-0.25, -0.25),
        (np.float32(0.5), 0.5),
        (np.int64(7), 7.0),
        (np.array(1.5), 1.5),
        (torch.tensor(2.5), 2.5),
        (Fraction(1, 4), 0.25),
        (Decimal("0.125"), 0.125),
        (10**300, 1e300),
    ],
)
def test_finite_numbers_are_taken_as_their_value(value, want):
    assert finite_float(value) == want and finite_float(value, one_element=True) == want


@pytest.mark.parametrize(
    "value, reason",
    [
        (True, "not a number"),
        (np.bool_(False), "not a number"),
        (torch.tensor(True), "not a number"),
        ("0.5", "not a number"),
        (None, "not a number"),
        (1 + 0j, "not a number"),
        ([1.0], "not a number"),
        (torch.empty((), device="meta"), r"not a number \(\w+: .*meta"),
        (Decimal("sNaN"), "not a number"),
        (math.nan, "not finite"),
        (-math.inf, "not finite"),
        (np.float32("inf"), "not finite"),
        (Decimal("NaN"), "not finite"),
        (10**400, "too large for a float"),
        (Fraction(10**400), "too large for a float"),
        (Decimal("1e400"), "too large for a float"),
    ],
)
def test_what_is_not_one_finite_real_number_is_refused_with_the_reason(value, reason):
    with pytest.raises(ValueError, match=f"^{reason}"):
        finite_float(value)


def test_one_element_takes_an_array_or_tensor_holding_exactly_one_value():
    for one in (np.array([0.5]), torch.tensor([[0.5]])):
        with pytest.raises(ValueError, match="^not a number$"):
            finite_float(one)
        assert finite_float(one, one_element=True) == 0.5
    for bad, reason in ((torch.tensor([1.0, 2.0]), "not a number"), (torch.tensor([math.nan]), "not finite")):
        with pytest.raises(ValueError, match=f"^{reason}$"):
            finite_float(bad, one_element=True)


def test_a_search_records_metrics_are_its_finite_numbers():
    record = {
        "best_score": 0.5,
        "evaluations": 4,
        "seconds": {"total": 2.0},
        "best_tasks": {"math": 0.25, "code": math.nan},
        "extrapolation": True,
        "agents": ["a", "b"],
        "best": {
            "method": "ties",
            "density": np.float64(0.3),
            "scale": Decimal("1.5"),
            "trim": "magnitude",
            "weights": [1, math.inf],
            "lambdas": {"a": 2, "b": None},
        },
    }
    assert search_metrics(record, prefix="") == {
        "best_score": 0.5,
        "evaluations": 4.0,
        "total_seconds": 2.0,
        "eval/math": 0.25,
        "method/ties": 1.0,
        "option/density": 0.3,
        "option/scale": 1.5,
        "weights/a": 1.0,
        "lambda/a": 2.0,
    }
