import math

import pytest
import torch

from ram_live import functional as F


def test_ram_combine_hand_case():
    d = torch.tensor([[0.5, 0.0, 0.2, 0.0, -0.3],
                      [0.0, 0.0, 0.4, 0.0, 0.1],
                      [0.0, 0.0, 0.0, 0.7, 0.2]])
    assert torch.allclose(F.ram_combine(d), torch.tensor([0.5, 0.0, 0.3, 0.7, 0.0]), atol=1e-7)
    lam = torch.tensor([1.1, 1.2, 1.3])
    expected = torch.tensor([0.55, 0.0, 0.3, 0.91, 0.0])
    assert torch.allclose(F.ram_combine(d, lam), expected, atol=1e-6)


def test_apply_activity_is_strict_at_eps():
    eps = 1e-5
    at = torch.tensor(eps, dtype=torch.float32)
    above = torch.nextafter(at, torch.tensor(1.0))
    d = torch.tensor([[at, -at, above, -above, 0.0]])
    F.apply_activity_(d, eps)
    assert d.tolist()[0][:2] == [0.0, 0.0]
    assert d[0, 2] == above and d[0, 3] == -above


def test_statistics_counts():
    d = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]])
    active, unique, hist = F.ram_statistics(d)
    assert active.tolist() == [2, 2] and unique.tolist() == [1, 1] and hist.tolist() == [1, 2, 1]


@pytest.mark.parametrize("unique,active,expected", [(2, 6, 2.0), (0, 5, math.inf), (0, 0, math.inf), (4, 4, 0.0)])
def test_rho(unique, active, expected):
    assert F.rho(unique, active) == expected


def test_lambda_variants():
    assert F.ram_lambda(1.5, "ram", 0.1, 2.0) == 1.0
    assert F.ram_lambda(1.5, "ram_plus", 0.1, 2.0) == pytest.approx(1.15)
    assert F.ram_lambda(5.0, "ram_plus", 0.1, 2.0) == pytest.approx(1.2)  # clipped at alpha
    assert F.ram_lambda(math.inf, "ram_plus", 0.1, 2.0) == pytest.approx(1.2)
    assert F.ram_lambda(5.0, "ram_plus", 0.2, 1.0) == pytest.approx(1.2)  # the authors' script
    assert F.ram_lambda(1.0, "ram_plus_soft", 0.1, 2.0) == pytest.approx(1.05)
    assert F.ram_lambda(math.inf, "ram_plus_soft", 0.1, 2.0) == pytest.approx(1.1)


def test_magnitude_threshold_keeps_top_k():
    d = torch.tensor([0.1, -0.5, 0.3, -0.2, 0.05])
    thr = F.magnitude_threshold(d, 0.4)  # k = int(0.4 * 5) = 2
    rows = F.trim_(d.clone().unsqueeze(0), [thr])
    assert rows[0].tolist() == pytest.approx([0.0, -0.5, 0.3, 0.0, 0.0])
    assert F.magnitude_threshold(d, 1.0) is None
    assert F.trim_(d.clone().unsqueeze(0), [F.magnitude_threshold(d, 0.1)]).count_nonzero() == 0


def test_ties_combine_hand_case():
    d = torch.tensor([[0.4, -0.2, 0.0], [-0.1, -0.3, 0.5], [0.2, 0.1, 0.0]])
    out = F.ties_combine(d, torch.ones(3))
    # column 0: sum 0.5 > 0 -> mean(0.4, 0.2); column 1: sum -0.4 -> mean(-0.2, -0.3); column 2: only 0.5
    assert torch.allclose(out, torch.tensor([0.3, -0.25, 0.5]))


def test_dare_drop_is_seeded_and_rescaled():
    d = torch.ones(2, 1000)
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    out = F.dare_drop_(d.clone(), 0.25, gens, torch.empty(1000))
    assert set(out.unique().tolist()) <= {0.0, 4.0}
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    assert torch.equal(out, F.dare_drop_(d.clone(), 0.25, gens, torch.empty(1000)))
    assert not torch.equal(out[0], out[1])


def test_stable_seed_is_stable():
    assert F.stable_seed("dare", 0, "a", "w") == F.stable_seed("dare", 0, "a", "w")
    assert F.stable_seed("dare", 0, "a", "w") != F.stable_seed("dare", 0, "b", "w")
    assert F.stable_seed(1, 2) == 5051128224166061352  # pinned: masks must not change across releases
