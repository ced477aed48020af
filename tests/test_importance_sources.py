"""``importance=`` has two explicit states (ram_live/importance/sources.py): None is plain RAM, bit for bit, even on
snapshots that carry importances; a value weighs, and ``"stored"`` is exactly the snapshots' own importance
sources passed by hand. "stored" with an agent without them, and ``importance=False``, are ConfigErrors."""

from __future__ import annotations

import pytest
import torch

from ram_live import merge, ram_merge
from ram_live.errors import ConfigError
from ram_live.importance import STORED, ConstantImportance, importance_sources, resolve_importance
from ram_live.store import SnapshotStore


def _store(tmp_path, with_importance=("a0", "a1", "a2")):
    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(32, 16, generator=g), "v": torch.randn(200, generator=g)}
    store = SnapshotStore(tmp_path / "store", durable=False)
    for i in range(3):
        name = f"a{i}"
        agent = {k: t.clone() for k, t in base.items()}
        mask = torch.rand(32, 16, generator=g) < 0.5  # half the entries each: many shared ones
        agent["w"] = torch.where(mask, agent["w"] + 0.1 * torch.randn(32, 16, generator=g), agent["w"])
        agent["v"][i * 40 : i * 40 + 100] += 0.3 * (i + 1)
        imp = {"w": torch.rand(32, 16, generator=g) ** 3, "v": torch.rand(200, generator=g)}
        store.writer(name, base=base).snapshot(agent, step=1, importance=imp if name in with_importance else None)
    return store


def test_none_on_snapshots_with_importances_is_plain_ram_bit_for_bit(tmp_path):
    store = _store(tmp_path)
    snaps = store.latest_all()
    assert all(s.importance is not None for s in snaps.values())
    got, info = merge(snaps, method="ram", return_info=True)
    plain = merge({n: s.to_state_dict() for n, s in snaps.items()}, base=store.base_source(), method="ram")
    assert "importance" not in info.extra
    for key in ("w", "v"):
        assert torch.equal(got[key], plain[key]), key
    got_plus = ram_merge(snaps)  # ram_merge passes importance= on to merge: None there too
    plain_plus = ram_merge({n: s.to_state_dict() for n, s in snaps.items()}, store.base_source())
    assert all(torch.equal(got_plus[k], plain_plus[k]) for k in ("w", "v"))


def test_stored_is_the_snapshots_sources_passed_by_hand(tmp_path):
    store = _store(tmp_path)
    snaps = store.latest_all()
    stored, info = merge(snaps, method="ram", importance="stored", return_info=True)
    assert info.extra["importance"] == "stored"
    by_hand, info2 = merge(
        snaps, method="ram", importance={n: s.importance for n, s in snaps.items()}, return_info=True
    )
    assert info2.extra["importance"] == "given"
    plain = merge(snaps, method="ram")
    for key in ("w", "v"):
        assert torch.equal(stored[key].view(-1).view(torch.int32), by_hand[key].view(-1).view(torch.int32)), key
    assert not torch.equal(stored["w"], plain["w"])  # the importances weigh the shared entries
    via_ram_merge = ram_merge(snaps, importance=STORED)
    by_hand_plus = ram_merge(snaps, importance={n: s.importance for n, s in snaps.items()})
    assert all(torch.equal(via_ram_merge[k], by_hand_plus[k]) for k in ("w", "v"))


def test_stored_with_an_agent_without_importances_names_it(tmp_path):
    store = _store(tmp_path, with_importance=("a0", "a2"))
    with pytest.raises(ConfigError, match=r"agent\(s\) 'a1' carry no stored importances"):
        merge(store.latest_all(), method="ram", importance="stored")
    sd = {n: s.to_state_dict() for n, s in store.latest_all().items()}  # not snapshots at all: every agent named
    with pytest.raises(ConfigError, match=r"'a0', 'a1', 'a2' carry no stored importances"):
        merge(sd, base=store.base_source(), importance="stored")


def test_stored_asks_nothing_of_an_excluded_agent(tmp_path):
    """``exclude=`` leaves an agent out as if not passed: "stored" then needs no importances of it, as a mapping
    without it does, and both give the same bits."""
    store = _store(tmp_path, with_importance=("a0", "a2"))
    snaps = store.latest_all()
    stored, info = merge(snaps, method="ram", importance="stored", exclude=["a1"], return_info=True)
    by_hand = merge(snaps, method="ram", importance={n: snaps[n].importance for n in ("a0", "a2")}, exclude=["a1"])
    assert info.extra["importance"] == "stored"
    assert all(torch.equal(stored[k], by_hand[k]) for k in ("w", "v"))


@pytest.mark.parametrize("value", [False, True, "store", "adam"])
def test_false_and_other_strings_are_config_errors(tmp_path, value):
    store = _store(tmp_path)
    match = "None is plain RAM" if isinstance(value, bool) else "the one string it takes is 'stored'"
    with pytest.raises(ConfigError, match=match):
        merge(store.latest_all(), method="ram", importance=value)


def test_resolve_importance_states():
    class Agent:
        def __init__(self, name, importance=None):
            self.name, self.importance = name, importance

    agents = [Agent("a"), Agent("b")]
    assert resolve_importance(None, agents) == (None, None)
    given, how = resolve_importance({"a": 1.0, "b": 0.5}, agents)
    assert how == "given" and isinstance(given["a"], ConstantImportance) and given["b"].value == 0.5
    marker = object()
    stored, how = resolve_importance("stored", [Agent("a", marker), Agent("b", marker)])
    assert how == "stored" and stored == {"a": marker, "b": marker}
    with pytest.raises(ConfigError, match="unknown agent"):
        importance_sources({"c": 1.0}, ["a", "b"])
