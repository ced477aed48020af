"""search(..., importance=): the curvature-aware family (variants by label), the winner's importances held by
reference in .best, and merge(models, base=base, **result.best) reproducing it bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from ram_live import merge, search
from ram_live.errors import ConfigError


def _setup():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(30, 20, generator=g), "b": torch.randn(20, generator=g)}
    agents, raw = {}, {}
    for i in range(3):
        a = {
            k: v + 0.1 * torch.randn(v.shape, generator=g) * (torch.rand(v.shape, generator=g) < 0.5)
            for k, v in base.items()
        }
        agents[f"a{i}"] = a
        raw[f"a{i}"] = {k: torch.rand(v.shape, generator=g) ** 3 for k, v in base.items()}
    corrected = {
        a: {k: v / (1 - 0.999 ** (10 * (i + 1))) for k, v in d.items()} for i, (a, d) in enumerate(raw.items())
    }
    return base, agents, raw, corrected


def _target(base, agents, imp):
    """A held-out score that the importance-weighted merge of ``imp`` maximises (its distance to it)."""
    goal = merge(agents, base=base, method="ram", importance=imp)
    return lambda m: -sum(float((m[k] - goal[k]).abs().sum()) for k in goal)


def test_the_family_wins_when_it_should_and_best_reproduces_it():
    base, agents, raw, corrected = _setup()
    variants = {"raw": raw, "bias_corrected": corrected}
    result = search(agents, base=base, evaluate=_target(base, agents, corrected), budget=30, importance=variants)
    fam = [t for t in result.history if t.family == "importance"]
    assert [t.importance for t in fam[:2]] == ["raw", "bias_corrected"]
    assert fam[0].options["importance"] is raw and fam[1].options["importance"] is corrected
    assert result.best == {"method": "ram", "importance": corrected}
    assert result.best["importance"] is corrected  # by reference
    assert result.best_score == 0.0
    again = merge(agents, base=base, **result.best)
    want = merge(agents, base=base, method="ram", importance=corrected)
    assert all(torch.equal(again[k], want[k]) for k in want)
    saved = json.loads(json.dumps(result.to_dict()))
    assert saved["best"] == {"method": "ram", "importance": "bias_corrected"}
    assert "importance=bias_corrected" in result.table().replace("'", "")


def test_one_mapping_is_the_variant_given_and_plain_ram_wins_when_it_should():
    base, agents, raw, _ = _setup()
    plain = merge(agents, base=base, method="ram")
    score = lambda m: -sum(float((m[k] - plain[k]).abs().sum()) for k in plain)  # noqa: E731
    result = search(
        agents,
        base=base,
        evaluate=score,
        budget=12,
        importance=raw,
        space={"ram_plus": [{"r": 0.0, "alpha": 2.0}, {"r": 0.5, "alpha": 2.0}], "importance": True},
    )
    fam = [t for t in result.history if t.family == "importance"]
    assert [t.importance for t in fam] == ["given", "given"]
    assert fam[0].method == "ram" and fam[0].options == {"importance": raw}
    # then the best RAM-side candidate so far (ram_plus r=0, = plain RAM) with the importances added
    assert fam[1].method == "ram_plus" and fam[1].options == {"r": 0.0, "alpha": 2.0, "importance": raw}
    assert fam[1].options["importance"] is raw
    assert result.best_score == 0.0 and "importance" not in result.best


def test_family_without_importance_is_an_error():
    base, agents, _, _ = _setup()
    with pytest.raises(ConfigError, match="no importance="):
        search(agents, base=base, evaluate=lambda m: 0.0, budget=4, space=["ram", "importance"])


def test_search_of_store_snapshots_with_importance_stored_and_best_reproduces(tmp_path):
    from ram_live.store import SnapshotStore

    base, agents, raw, _ = _setup()
    store = SnapshotStore(tmp_path / "store")
    for name, a in agents.items():
        store.writer(name, base=base).snapshot(a, step=1, importance=raw[name])
    snaps = store.latest_all()
    stored = merge(snaps, method="ram", importance="stored")
    plain = merge(snaps, method="ram")  # None: plain RAM, though the snapshots carry importances
    assert not torch.equal(stored["w"], plain["w"])
    for goal, uses in ((stored, True), (plain, False)):
        score = lambda m, goal=goal: -sum(float((m[k] - goal[k]).abs().sum()) for k in goal)  # noqa: E731
        result = search(snaps, evaluate=score, budget=10, space=["ram", "importance"], importance="stored")
        assert [t.importance for t in result.history if t.family == "importance"][:1] == ["stored"]
        assert result.best_score == 0.0
        assert (result.best.get("importance") == "stored") == uses
        if not uses:
            assert result.best == {"method": "ram"}
        again = merge(store.latest_all(), **result.best)
        assert all(torch.equal(again[k], goal[k]) for k in goal)
    untouched = search(snaps, evaluate=lambda m: 0.0, budget=4, space=["ram"])  # None: no importance family
    assert all(t.family != "importance" and "importance" not in t.options for t in untouched.history)


def test_search_stored_without_importances_or_false_is_a_config_error(tmp_path):
    from ram_live.store import SnapshotStore

    base, agents, raw, _ = _setup()
    store = SnapshotStore(tmp_path / "store")
    for name, a in agents.items():
        store.writer(name, base=base).snapshot(a, step=1, importance=raw[name] if name != "a1" else None)
    with pytest.raises(ConfigError, match="'a1' carry no stored importances"):
        search(store.latest_all(), evaluate=lambda m: 0.0, budget=4, importance="stored")
    with pytest.raises(ConfigError, match="None is plain RAM"):
        search(agents, base=base, evaluate=lambda m: 0.0, budget=4, importance=False)
