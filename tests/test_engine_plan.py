"""ram_live.engine.plan's PlanCache: merges over unchanged sources plan once per set of agents, give the bits of a
merge that plans anew, and reuse without the digest check only the counts they took themselves."""

import dataclasses

import pytest
import torch

from ram_live.api import input_sources
from ram_live.engine import plan as plan_mod
from ram_live.engine import run as run_mod
from ram_live.engine.plan import PlanCache
from ram_live.engine.run import run_merge
from ram_live.errors import ConfigError
from ram_live.io.sinks import StateDictSink
from ram_live.methods import get_method, make_config

from conftest import make_agents


def _merge(base, agents, method, plans=None, statistics=None, **options):
    sink = StateDictSink()
    info = run_merge(
        base, agents, get_method(method), make_config(method, **options), sink, plans=plans, statistics=statistics
    )
    return sink.finish(), info


def test_a_cache_plans_once_per_set_of_agents_and_gives_a_fresh_plans_bits(base_sd, monkeypatch):
    agents, base = input_sources(dict(zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6]))), base_sd)
    built = []
    real = plan_mod.planned
    monkeypatch.setattr(plan_mod, "planned", lambda b, a: built.append(len(a)) or real(b, a))
    cache = PlanCache()
    for options in ({"method": "ram"}, {"method": "ties", "density": 0.3}, {"method": "ram", "exclude": ["b"]}):
        cached, _ = _merge(base, agents, plans=cache, **options)
        fresh, _ = _merge(base, agents, **options)
        assert all(torch.equal(cached[k], fresh[k]) for k in fresh), options
    assert built == [3, 2]  # the cache's plans: one per set of agents (the fresh merges plan in run_merge)


def test_counts_a_cache_took_skip_the_digest_check_and_counts_from_elsewhere_do_not(base_sd, monkeypatch):
    agents, base = input_sources(dict(zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6]))), base_sd)
    cache = PlanCache()
    _, info = _merge(base, agents, "ram_plus", plans=cache)
    assert cache.trusts(info.statistics, base, agents)
    assert not cache.trusts(info.statistics, base, agents[:2])  # counted over other sources
    digests = []
    real = run_mod.inputs_digest
    monkeypatch.setattr(run_mod, "inputs_digest", lambda: digests.append(1) or real())
    again, _ = _merge(base, agents, "ram_plus", plans=cache, statistics=info.statistics, r=0.3)
    assert digests == []  # counted over these very sources: not digested again
    fresh, _ = _merge(base, agents, "ram_plus", r=0.3)
    assert all(torch.equal(again[k], fresh[k]) for k in fresh)
    copy = dataclasses.replace(info.statistics)  # equal counts, not the object the cache took
    assert not cache.trusts(copy, base, agents)
    digests.clear()
    _merge(base, agents, "ram_plus", plans=cache, statistics=copy, r=0.3)
    assert len(digests) == 1
    other = {k: v.clone() for k, v in base_sd.items()}
    other["embed.weight"][0, 0] += 1.0  # counted over other weights: refused, cache or not
    agents2, base2 = input_sources(dict(zip("abc", make_agents(other, [0.2, 0.4, 0.6]))), other)
    with pytest.raises(ConfigError, match="other weights"):
        _merge(base2, agents2, "ram_plus", plans=PlanCache(), statistics=info.statistics, r=0.3)


def test_a_cache_keeps_what_it_is_given_only_for_plans_it_made(base_sd):
    agents, base = input_sources(dict(zip("abc", make_agents(base_sd, [0.2, 0.4, 0.6]))), base_sd)
    cache = PlanCache()
    plan, _ = cache.plan(base, agents)
    made = []
    assert cache.kept(plan, "x", lambda: made.append(1) or "kept") == "kept"
    assert cache.kept(plan, "x", lambda: made.append(1) or "again") == "kept" and made == [1]
    other = plan_mod.build_plan(base, agents)  # equal, but not the cache's (a rank's share is a new plan each time)
    assert cache.kept(other, "x", lambda: "fresh") == "fresh"
    assert cache.kept(other, "x", lambda: "fresh again") == "fresh again"
