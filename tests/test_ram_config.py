"""RAM's one config: ``RamConfig(lam=Unit() | RhoClip(r, alpha) | RhoSoft(r) | Given({agent: λ}), ...)``.

Every spelling of a RAM merge — the config (``merge(config=...)``, ``ram_merge``), the short method names with flat
keywords (``merge(method="ram_plus", r=0.2)``, the search's ``result.best``), the flat mapping (``to_dict``), the
schedule and callbacks, verl's ``ram.*`` keys, the CLI flags — gives the bits the removed spellings
(``ram_merge(options=RamOptions(...))``) gave: their sha256 digests were taken with the code before the change
(``tests/test_merge_digests.py``'s fixtures and digest). A method name and a config cannot disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math

import pytest
import torch
from safetensors.torch import load_file

import ram_live
import ram_live.methods.ram.lambdas
from ram_live import ConfigError, Given, RamConfig, RhoClip, RhoSoft, Unit, merge, probe, ram_merge
from ram_live.cli import main
from ram_live.cli.parser import PROBE_OPTIONS, build_parser
from ram_live.methods import get_method, make_config
from ram_live.methods.ram.config import FLAT_NAMES, flat_fields
from ram_live.methods.ram.rules import RAM_METHODS
from ram_live.training.schedule import RAMSchedule
from tests.conftest import assert_bit_identical, make_agents
from tests.test_merge_digests import _digest, _models

LAMBDAS = {"a0": 2.0, "a1": 0.5, "a2": 1.25}

#: name -> (the removed spelling's RamOptions fields, the one config, the digest the removed spelling gave)
CASES = {
    "ram_plus_default": ({}, RamConfig(), "138ec9f763116edde05e1c34df53a84c24c5651ee198e115aff07e958f9da3ad"),
    "authors": (
        dict(variant="ram_plus", r=0.2, alpha=1.0),
        RamConfig(lam=RhoClip(r=0.2, alpha=1.0)),
        "b4731ff32f6b83b35be0c6afe4bbf321098e12533fe680795eac7895b61fd767",
    ),
    "ramplus_tl": (
        dict(variant="ram_plus", r=0.1, alpha=0.2, rho_scope="tensor"),
        RamConfig(lam=RhoClip(r=0.1, alpha=0.2), rho_scope="tensor"),
        "2964de94f62b3941f16baf095e909ec2461d2d6cb611fbe13510a61ae6081fab",
    ),
    "soft": (
        dict(variant="ram_plus_soft", r=0.3, eps=0.002),
        RamConfig(lam=RhoSoft(r=0.3), eps=0.002),
        "74017d83dc45b397049b9224e959343c90862b29c021909d4bf27538509ca6e6",
    ),
    "ram_eps0": (
        dict(variant="ram", eps=0.0),
        RamConfig(lam=Unit(), eps=0.0),
        "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    ),
    "uncapped_changed": (
        dict(variant="ram_plus", r=0.3, activity="changed", alpha=math.inf),
        RamConfig(lam=RhoClip(r=0.3, alpha=math.inf), activity="changed"),
        "6a3c2a52bd56fa828b57c0019150d69e9f489a4fe068ace768ece2295887d36e",
    ),
    "exclude": (
        dict(variant="ram_plus", exclude=("a2",)),
        RamConfig(exclude=("a2",)),
        "2b904e44ee09737162adf7cce38eeaa90276dc0d079c606129a18e84b9c14586",
    ),
    "given": (
        dict(variant="ram", lambdas=LAMBDAS),
        RamConfig(lam=Given(LAMBDAS)),
        "965d260469bb2e372ad1fa9b1a9be5377ad9f846b58f184dd1f9f2dd3033b5d2",
    ),
    "given_plus": (
        dict(variant="ram_plus", lambdas=LAMBDAS),
        RamConfig(lam=Given(LAMBDAS)),
        "965d260469bb2e372ad1fa9b1a9be5377ad9f846b58f184dd1f9f2dd3033b5d2",
    ),
    "sign": (
        dict(variant="ram", shared="sign"),
        RamConfig(lam=Unit(), shared="sign"),
        "1ac5cb10ce5ab3b72f352cb2b0974f12dec23b99cdfcd1a723ba4b26b7b45477",
    ),
    "soft_sign_tensor": (
        dict(variant="ram_plus_soft", r=0.5, shared="sign", rho_scope="tensor"),
        RamConfig(lam=RhoSoft(r=0.5), shared="sign", rho_scope="tensor"),
        "89ee41e5da350ba66f5b479c4f08589aa09842328f4765f89cdffe51c8634e60",
    ),
}


def _sha(result_info) -> str:
    result, info = result_info
    lam = {n: round(float(v), 12) for n, v in sorted((info.lambdas or {}).items())}
    return _digest(result, repr(lam))


@pytest.mark.parametrize("name", list(CASES))
def test_every_spelling_gives_the_removed_spellings_digest(name):
    old, config, digest = CASES[name]
    base, agents, _ = _models(torch.float32)
    flat = {k: v for k, v in old.items() if k != "variant"}
    method = old.get("variant", "ram_plus")
    assert _sha(merge(agents, base, config=config, return_info=True)) == digest
    assert _sha(ram_merge(agents, base, config, return_info=True)) == digest
    assert _sha(merge(agents, base, method=method, return_info=True, **flat)) == digest  # the flat keywords
    short, options = config.flat()
    assert RamConfig.from_flat(short, **options) == config == RamConfig.from_flat(method, **flat)
    assert RamConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert _sha(merge(agents, base, method=short, return_info=True, **options)) == digest
    info = merge(agents, base, config=config, return_info=True)[1]
    assert info.method == config.method and info.config == config
    assert make_config(method, **flat) == config


def test_a_method_name_and_a_config_cannot_disagree():
    base, agents, _ = _models(torch.float32)
    with pytest.raises(ConfigError, match=r"method='ram' and config with lam=RhoClip\(r=0.1, alpha=2.0\) disagree"):
        merge(agents, base, method="ram", config=RamConfig())  # ran RAM+ and reported "ram" before
    with pytest.raises(ConfigError, match="disagree"):
        merge(agents, base, method="ram_plus", config=RamConfig(lam=RhoSoft()))
    with pytest.raises(ConfigError, match="takes a RamConfig"):
        merge(agents, base, method="ram", config=ram_live.TiesConfig())
    with pytest.raises(ConfigError, match="not both"):
        merge(agents, base, method="ram_plus", config=RamConfig(), alpha=1.0)
    given = RamConfig(lam=Given(LAMBDAS))  # given λ: every short name runs it, as lambdas= did
    assert all(RamConfig(lam=Given(LAMBDAS)).agrees(m) for m in RAM_METHODS)
    assert_bit_identical(merge(agents, base, method="ram_plus_soft", config=given), merge(agents, base, config=given))
    assert merge(agents, base, config=RamConfig(lam=Unit()), return_info=True)[1].method == "ram"
    assert merge(agents, base, config=ram_live.TiesConfig(density=0.5), return_info=True)[1].method == "ties"


def test_flat_keywords_per_short_name():
    assert RamConfig.flat_names("ram") == ("eps", "activity", "lambdas", "exclude", "shared")
    assert RamConfig.flat_names("ram_plus") == (
        "eps",
        "activity",
        "r",
        "alpha",
        "rho_scope",
        "lambdas",
        "exclude",
        "shared",
    )
    assert "alpha" not in RamConfig.flat_names("ram_plus_soft")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) 'r' for method 'ram'"):
        RamConfig.from_flat("ram", r=0.2)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) 'alpha' for method 'ram_plus_soft'"):
        merge({"a": {"w": torch.ones(2)}}, base={"w": torch.zeros(2)}, method="ram_plus_soft", alpha=1.0)
    with pytest.raises(ConfigError, match="rho_scope='tensor' needs a λ rule that uses ρ"):
        RamConfig(lam=Unit(), rho_scope="tensor")
    assert RamConfig.from_flat("ram_plus", r=0.7, lambdas={"a": 2}) == RamConfig(lam=Given({"a": 2.0}))
    assert RamConfig(lam=RhoClip(r=0.2, alpha=1.0), exclude=["b"]).flat() == (
        "ram_plus",
        {"r": 0.2, "alpha": 1.0, "exclude": ["b"]},
    )
    assert RamConfig(lam=Unit()).flat(defaults=True) == (
        "ram",
        {"eps": 1e-5, "activity": "abs", "exclude": [], "shared": "mean"},
    )
    assert RamConfig().to_dict() == {"method": "ram_plus"}


def test_lambda_rules_values_and_bounds():
    rho = 2.0
    assert Unit().value(rho) == 1.0 and Unit().bound() == 1.0
    assert RhoClip(r=0.1, alpha=1.0).value(rho) == 1.1 and RhoClip(r=0.3, alpha=2.0).bound() == pytest.approx(1.6)
    assert RhoClip(r=0.1, alpha=math.inf).value(math.inf) == 1.0 and RhoClip(alpha=math.inf).bound() == math.inf
    assert RhoSoft(r=0.3).value(rho) == 1.0 + 0.3 * (2.0 / 3.0) and RhoSoft(r=0.3).value(math.inf) == 1.3
    assert Given({"a": -3.0, "b": 0.5}).bound() == 3.0
    assert ram_live.methods.ram.lambdas.ram_lambda(rho, "ram_plus_soft", 0.3, 2.0) == RhoSoft(r=0.3).value(rho)
    for bad, match in [
        (lambda: RhoClip(r=-1), r"^r must be >= 0.0"),
        (lambda: RhoSoft(r=math.nan), "^r must be"),
        (lambda: Given([1.0]), "lambdas must be a mapping"),
        (lambda: RamConfig(lam="ram"), "lam must"),
        (lambda: RamConfig(eps=-1.0), "^eps must"),
        (lambda: RamConfig(shared="vote"), "shared"),
        (lambda: RamConfig(exclude="a"), "exclude"),
    ]:
        with pytest.raises(ConfigError, match=match):
            bad()
    a = RamConfig(lam=Given({"a": 1.0, "b": 2.0}), exclude=["c"])
    b = RamConfig(lam=Given({"b": 2, "a": 1.0}), exclude=("c",))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


@dataclasses.dataclass(frozen=True)
class RhoCapOne:
    """A λ rule of one's own (the test of "adding a λ rule is one class"): λ = 1 + r·min(ρ, 1)."""

    r: float = 0.2
    method = None
    uses_rho = True

    def value(self, rho: float) -> float:
        return 1.0 + self.r * min(max(rho, 0.0), 1.0)

    def bound(self) -> float:
        return 1.0 + self.r


def test_a_lambda_rule_of_ones_own_is_one_class():
    base, agents, _ = _models(torch.float32)
    digest = CASES["authors"][2]  # RhoClip(r=0.2, alpha=1.0): the same λ
    assert _sha(merge(agents, base, config=RamConfig(lam=RhoCapOne()), return_info=True)) == digest
    with pytest.raises(ConfigError, match="no flat spelling"):
        RamConfig(lam=RhoCapOne()).flat()


def test_removed_names_are_gone():
    for name in ("RamOptions", "RamPlusConfig", "RamPlusSoftConfig", "HoldsRamOptions", "RamFields"):
        assert not hasattr(ram_live, name)
    for module in ("ram_live.options", "ram_live.methods.checks"):
        with pytest.raises(ImportError):
            importlib.import_module(module)
    configs = {get_method(m).config_cls for m in RAM_METHODS}
    assert configs == {RamConfig}  # one config class for the three short names


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _schedule_merge(tmp_path, name, make):
    store = tmp_path / name
    base = _net(0)
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    a, b = _net(0), _net(0)
    with torch.no_grad():
        for i, (pa, pb) in enumerate(zip(a.parameters(), b.parameters())):
            pa.add_(
                torch.randn(pa.shape, generator=torch.Generator().manual_seed(i))
                * 0.1
                * (torch.rand(pa.shape, generator=torch.Generator().manual_seed(9 + i)) < 0.5)
            )
            pb.add_(
                torch.randn(pb.shape, generator=torch.Generator().manual_seed(20 + i))
                * 0.1
                * (torch.rand(pb.shape, generator=torch.Generator().manual_seed(40 + i)) < 0.6)
            )
    sa = RAMSchedule(store, "a", durable=False)
    sa.attach(_net(0))
    sa.snapshot(a, 2)
    sched = make(store)
    sched.attach(_net(0))
    return sched.merge(b, 2), base_sd, {"a": a.state_dict(), "b": b.state_dict()}, sched


SCHEDULE_CASES = [
    RamConfig(lam=RhoClip(r=0.2, alpha=1.0)),
    RamConfig(lam=RhoSoft(), rho_scope="tensor"),
    RamConfig(lam=Unit(), activity="changed"),
    RamConfig(lam=Given({"a": 1.5, "b": 0.5})),
]


@pytest.mark.parametrize("config", SCHEDULE_CASES, ids=lambda c: c.method + repr(c.flat()[1]))
def test_schedule_and_callbacks_take_the_config(tmp_path, config):
    from ram_live.integrations.lightning import RAMCallback
    from ram_live.integrations.transformers import RAMTrainerCallback

    kw = dict(durable=False, merge_every=2)
    cb = dict(kw, importance=None)
    r1, base_sd, sds, s1 = _schedule_merge(tmp_path, "s1", lambda s: RAMSchedule(s, "b", ram=config, **kw))
    r2, _, _, s2 = _schedule_merge(tmp_path, "s2", lambda s: RAMSchedule(s, "b", ram=config.to_dict(), **kw))
    r3, _, _, s3 = _schedule_merge(tmp_path, "s3", lambda s: RAMCallback(s, "b", ram=config, **cb).schedule)
    r4, _, _, s4 = _schedule_merge(tmp_path, "s4", lambda s: RAMTrainerCallback(s, "b", ram=config, **cb).schedule)
    expected, info = ram_merge(sds, base_sd, config, return_info=True)
    for r, s in ((r1, s1), (r2, s2), (r3, s3), (r4, s4)):
        assert s.ram == config and r.variant == config.method
        assert_bit_identical(r.tensors, expected)
        if isinstance(config.lam, Given):
            assert r.lambdas == config.lam.lambdas
        elif info.lambdas is not None:
            assert r.lambdas == info.lambdas


def test_trainer_callback_saves_the_config_in_its_checkpoint_args(tmp_path):
    from ram_live.integrations.transformers import RAMTrainerCallback

    config = RamConfig(lam=RhoClip(r=0.2, alpha=math.inf), exclude=("c",))
    cb = RAMTrainerCallback(tmp_path / "store", "a", ram=config)
    args = json.loads(json.dumps(cb.state()["args"]))  # as trainer_state.json holds them
    assert args["ram"] == {"method": "ram_plus", "r": 0.2, "alpha": math.inf, "exclude": ["c"]}
    assert RAMTrainerCallback(**args).schedule.ram == config


def test_verl_ram_keys_map_onto_the_config(tmp_path):
    from ram_live.integrations.verl.config import RAM_KEYS, RAMVerlOptions, options_from_mapping

    common = {"store": str(tmp_path / "s"), "agent": "a", "base": str(tmp_path / "base")}
    opts = options_from_mapping({**common, "variant": "ram_plus_soft", "r": 0.3, "exclude": ["b"]})
    assert opts.ram == RamConfig(lam=RhoSoft(r=0.3), exclude=("b",))
    assert options_from_mapping({**common, "variant": "ram", "lambdas": {"a": 2}}).ram == RamConfig(lam=Given({"a": 2}))
    assert set(RAM_KEYS) == {"variant", *FLAT_NAMES} and set(RAM_KEYS) <= set(RAMVerlOptions.keys())
    assert options_from_mapping(common).ram == RamConfig()
    with pytest.raises(ConfigError, match=r"ram\.unknown option\(s\) 'alpha' for method 'ram_plus_soft'"):
        options_from_mapping({**common, "variant": "ram_plus_soft", "alpha": 1.0})


INVALID = [
    ("activity", "sometimes"),
    ("rho_scope", "layer"),
    ("r", -1.0),
    ("alpha", math.nan),
    ("eps", -1e-5),
    ("lambdas", [1.0]),
    ("exclude", "a"),
]


@pytest.mark.parametrize("name,value", INVALID)
def test_invalid_option_is_config_error_naming_it_everywhere(tmp_path, base_sd, name, value):
    from ram_live.integrations.transformers import RAMTrainerCallback
    from ram_live.integrations.verl.config import options_from_mapping

    agents = make_agents(base_sd, [0.1, 0.3])
    store = str(tmp_path / "store")
    for call in [
        lambda: RamConfig.from_flat("ram_plus", **{name: value}),
        lambda: merge(agents, base=base_sd, method="ram_plus", **{name: value}),
        lambda: RAMSchedule(store, "a", ram={name: value}),
        lambda: RAMTrainerCallback(store, "a", ram={name: value}),
    ]:
        with pytest.raises(ConfigError, match=rf"\b{name}\b"):
            call()
    with pytest.raises(ConfigError, match=rf"ram\.{name}\b"):
        options_from_mapping({"store": store, "agent": "a", "base": store, name: value})


def test_flat_ram_options_outside_the_config_are_refused(tmp_path, base_sd):
    from ram_live.integrations.lightning import RAMCallback

    agents = make_agents(base_sd, [0.1, 0.3])
    with pytest.raises(ConfigError, match=r"ram_merge takes the RAM options in config=RamConfig\(...\).*\(r\)"):
        ram_merge(agents, base=base_sd, r=0.2)
    with pytest.raises(ConfigError, match="method="):
        ram_merge(agents, base=base_sd, method="ties")
    with pytest.raises(ConfigError, match="RAMSchedule: unknown option.*'variant'.*ram=RamConfig"):
        RAMSchedule(tmp_path / "s", "a", variant="ram")
    with pytest.raises(ConfigError, match="RAMCallback: unknown option.*'alpha'.*ram=RamConfig"):
        RAMCallback(tmp_path / "s", "a", alpha=2)
    with pytest.raises(ConfigError, match=r"RAMSchedule: unknown option\(s\) 'rr' for method 'ram_plus'"):
        RAMSchedule(tmp_path / "s", "a", ram={"rr": 2})


def _ram_group(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    group = next(g for g in parser._action_groups if g.title == "RAM options")
    return {a.dest: a for a in group._group_actions}


def test_cli_ram_flags_are_the_config_fields():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    fields = {f.name: f for f in flat_fields()}
    assert tuple(fields) == FLAT_NAMES
    for command, names in {
        "probe": set(PROBE_OPTIONS),
        "merge": set(FLAT_NAMES),
        "merge-adapters": set(FLAT_NAMES),
    }.items():
        flags = _ram_group(sub[command])
        assert set(flags) == names, command
        for name, action in flags.items():
            meta = fields[name].metadata
            assert action.option_strings == ["--" + name.replace("_", "-")]
            assert action.help == meta["help"] and action.choices == meta["choices"]
            assert action.default == (fields[name].default if command == "probe" else argparse.SUPPRESS)


def test_cli_merge_and_probe_flags_give_the_configs_bits(files, capsys):
    tmp, base, agents, paths = files
    named = dict(zip(["coder", "tools", "memory"], agents))
    b = str(tmp / "base.safetensors")
    config = RamConfig(lam=RhoClip(r=0.2, alpha=1.0), rho_scope="tensor", activity="changed", exclude=("memory",))
    out = tmp / "m.safetensors"
    assert (
        main(
            [
                "merge",
                *paths,
                "--base",
                b,
                "--out",
                str(out),
                "--quiet",
                "--r",
                "0.2",
                "--alpha",
                "1.0",
                "--rho-scope",
                "tensor",
                "--activity",
                "changed",
                "--exclude",
                "memory",
            ]
        )
        == 0
    )
    assert_bit_identical(load_file(out), ram_merge(named, base, config))
    out2 = tmp / "l.safetensors"
    lam = {"coder": 1.5, "tools": 0.5, "memory": 1.0}
    assert (
        main(
            [
                "merge",
                *paths,
                "--base",
                b,
                "--out",
                str(out2),
                "--quiet",
                "--method",
                "ram",
                "--lambdas",
                json.dumps(lam),
            ]
        )
        == 0
    )
    assert_bit_identical(load_file(out2), ram_merge(named, base, RamConfig(lam=Given(lam))))
    assert main(["probe", *paths, "--base", b, "--json", "--r", "0.2", "--alpha", "1.0", "--eps", "0.001"]) == 0
    report = json.loads(capsys.readouterr().out)
    config = RamConfig(lam=RhoClip(r=0.2, alpha=1.0), eps=0.001)
    assert report == probe(named, base=base, config=config).to_dict()
    assert report == probe(named, base=base, r=0.2, alpha=1.0, eps=0.001).to_dict()


def test_probe_takes_the_config_or_its_keywords():
    base_sd = {"w": torch.zeros(64)}
    agents = {"a": {"w": torch.linspace(0, 1e-4, 64)}, "b": {"w": torch.linspace(1e-4, 0, 64)}}
    by_config = probe(agents, base_sd, config=RamConfig(lam=RhoClip(r=0.3, alpha=1.0), eps=2e-5)).to_dict()
    assert by_config == probe(agents, base_sd, eps=2e-5, r=0.3, alpha=1.0).to_dict()
    assert by_config != probe(agents, base_sd).to_dict()
    with pytest.raises(ConfigError, match=r"probe: option\(s\) 'exclude' do not change a probe"):
        probe(agents, base_sd, exclude=["a"])
    with pytest.raises(ConfigError, match="not both"):
        probe(agents, base_sd, config=RamConfig(), eps=0.0)
    with pytest.raises(ConfigError, match=r"^eps must be >= 0.0"):
        probe(agents, base_sd, eps=-1.0)


def test_mergekit_yaml_plans_give_the_config(tmp_path):
    pytest.importorskip("yaml")
    from ram_live.mergekit_yaml import MergekitPlan

    plan = MergekitPlan(
        "ramplus_tl",
        "ram_plus",
        {"a": "x"},
        "b",
        {"eps": 1e-5, "activity": "abs", "r": 0.1, "alpha": 0.2, "rho_scope": "tensor"},
    )
    assert plan.config() == RamConfig(lam=RhoClip(r=0.1, alpha=0.2), rho_scope="tensor")
    assert MergekitPlan("ram", "ram", {"a": "x"}, "b", {"eps": 1e-5, "activity": "abs"}).config() == RamConfig(
        lam=Unit()
    )
