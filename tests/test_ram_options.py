"""RamOptions, RAM's options declared once: the fields are RamPlusConfig's (+ variant), every entry point (ram_merge,
RAMSchedule, the Lightning and transformers callbacks, verl's ram group, the CLI) takes one and gives the bits its
keyword spellings give, invalid values are ConfigErrors naming the option everywhere, and the CLI's RAM flags are
the dataclass fields."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from ram_live import RamOptions, merge, probe, ram_merge
from ram_live.cli.parser import METHOD_NAMES, PROBE_OPTIONS, build_parser
from ram_live.cli import main
from ram_live.errors import ConfigError
from ram_live.methods import RAM_VARIANTS, RamPlusConfig, make_config
from ram_live.training.schedule import RAMSchedule
from tests.conftest import assert_bit_identical, make_agents
from tests.reference import ref_ram

CASES = [
    dict(variant="ram_plus", r=0.2, alpha=1.0),
    dict(variant="ram_plus", r=0.1, alpha=0.2, rho_scope="tensor"),
    dict(variant="ram_plus_soft", r=0.3, eps=0.02),
    dict(variant="ram", eps=0.0),
    dict(variant="ram_plus", activity="changed", alpha=math.inf),
    dict(variant="ram_plus", exclude=("agent_2",)),
    dict(variant="ram", lambdas={"agent_0": 2.0, "agent_1": 0.5, "agent_2": 1.25}),
]


def test_fields_are_ram_plus_config_fields_with_its_defaults():
    own = {f.name: f.default for f in dataclasses.fields(RamOptions)}
    config = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
              for f in dataclasses.fields(RamPlusConfig)}
    assert own.pop("variant") == "ram_plus"
    assert own == config
    meta = {f.name: f.metadata for f in dataclasses.fields(RamOptions)}
    assert meta["variant"]["choices"] == RAM_VARIANTS
    for name in ("activity", "rho_scope"):  # every choice the CLI offers is one the config takes, and only those
        for choice in meta[name]["choices"]:
            RamPlusConfig(**{name: choice})
        with pytest.raises(ConfigError, match=name):
            RamPlusConfig(**{name: "other"})
    assert all(m["help"] for m in meta.values())


def test_config_as_kwargs_to_dict_round_trip():
    opts = RamOptions(variant="ram_plus_soft", r=0.3, lambdas={"a": 2}, exclude=["b"])
    assert opts.lambdas == {"a": 2.0} and isinstance(opts.lambdas["a"], float) and opts.exclude == ("b",)
    cfg = make_config(opts.variant, **opts.method_options())
    assert type(cfg).__name__ == "RamPlusSoftConfig" and (cfg.r, cfg.lambdas, cfg.exclude) == (0.3, {"a": 2.0}, ("b",))
    assert type(make_config("ram", **RamOptions(variant="ram", r=0.5).method_options())).__name__ == "RamConfig"
    assert "r" not in RamOptions(variant="ram").method_options()
    text = json.dumps(opts.to_dict())
    assert RamOptions.from_mapping(json.loads(text)) == opts
    assert RamOptions.of(opts, r=0.5) == dataclasses.replace(opts, r=0.5) and opts.r == 0.3
    assert RamOptions.of(None, variant="ram") == RamOptions(variant="ram")


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_ram_merge_options_equal_keywords_and_merge(base_sd, case):
    agents = make_agents(base_sd, [0.1, 0.3, 0.5])
    opts = RamOptions(**case)
    by_options, info = ram_merge(agents, base=base_sd, options=opts, return_info=True)
    assert_bit_identical(by_options, ram_merge(agents, base=base_sd, **case))
    assert_bit_identical(by_options, ram_merge(agents, base=base_sd, options=opts.to_dict()))
    assert_bit_identical(by_options, merge(agents, base=base_sd, method=opts.variant, **opts.method_options()))
    assert info.method == opts.variant and info.config == make_config(opts.variant, **opts.method_options())
    if set(case) <= {"variant", "r", "alpha", "eps", "rho_scope"}:  # what the reference implements
        expected, _ = ref_ram(base_sd, agents, variant=opts.variant, r=opts.r, alpha=opts.alpha, eps=opts.eps,
                              scope=opts.rho_scope)
        for k in expected:
            torch.testing.assert_close(by_options[k], expected[k], rtol=0, atol=1e-6)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _schedule_merge(tmp_path, name, make):
    """Agent 'a' snapshotted by one schedule, agent 'b' merged by ``make(store)``'s schedule: the merged tensors
    and the state dicts of base, a and b."""
    store = tmp_path / name
    base = _net(0)
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    a, b = _net(0), _net(0)
    with torch.no_grad():
        for i, (pa, pb) in enumerate(zip(a.parameters(), b.parameters())):
            pa.add_(torch.randn(pa.shape, generator=torch.Generator().manual_seed(i)) * 0.1
                    * (torch.rand(pa.shape, generator=torch.Generator().manual_seed(9 + i)) < 0.5))
            pb.add_(torch.randn(pb.shape, generator=torch.Generator().manual_seed(20 + i)) * 0.1
                    * (torch.rand(pb.shape, generator=torch.Generator().manual_seed(40 + i)) < 0.6))
    sa = RAMSchedule(store, "a", durable=False)
    sa.attach(_net(0))
    sa.snapshot(a, 2)
    sched = make(store)
    sched.attach(_net(0))
    result = sched.merge(b, 2)
    return result, base_sd, {"a": a.state_dict(), "b": b.state_dict()}, sched


SCHEDULE_CASES = [dict(variant="ram_plus", r=0.2, alpha=1.0), dict(variant="ram_plus_soft", rho_scope="tensor"),
                  dict(variant="ram", activity="changed"), dict(variant="ram", lambdas={"a": 1.5, "b": 0.5})]


@pytest.mark.parametrize("case", SCHEDULE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_schedule_and_callbacks_take_options_and_give_the_keywords_bits(tmp_path, case):
    from ram_live.integrations.lightning import RAMCallback
    from ram_live.integrations.transformers import RAMTrainerCallback

    opts = RamOptions(**case)
    kw = dict(durable=False, merge_every=2)
    cb = dict(kw, importance=None)
    r1, base_sd, sds, s1 = _schedule_merge(tmp_path, "s1", lambda s: RAMSchedule(s, "b", ram=opts, **kw))
    r2, _, _, s2 = _schedule_merge(tmp_path, "s2", lambda s: RAMSchedule(s, "b", **case, **kw))
    r3, _, _, s3 = _schedule_merge(tmp_path, "s3", lambda s: RAMCallback(s, "b", ram=opts, **cb).schedule)
    r4, _, _, s4 = _schedule_merge(tmp_path, "s4", lambda s: RAMTrainerCallback(s, "b", **case, **cb).schedule)
    expected, info = ram_merge(sds, base=base_sd, options=opts, return_info=True)
    for r, s in ((r1, s1), (r2, s2), (r3, s3), (r4, s4)):
        assert s.ram == opts and s.variant == opts.variant and s.r == opts.r
        assert_bit_identical(r.tensors, expected)
        if opts.lambdas is not None:
            assert r.lambdas == opts.lambdas
        elif info.lambdas is not None:
            assert r.lambdas == info.lambdas
    with pytest.raises(AttributeError, match=r"RAMSchedule.r is read from \.ram"):
        s1.r = 0.5  # would be ignored otherwise: the merges read schedule.ram


def test_trainer_callback_saves_options_in_its_checkpoint_args(tmp_path):
    from ram_live.integrations.transformers import RAMTrainerCallback

    opts = RamOptions(variant="ram_plus", r=0.2, alpha=math.inf, exclude=("c",))
    cb = RAMTrainerCallback(tmp_path / "store", "a", ram=opts)
    args = json.loads(json.dumps(cb.state()["args"]))  # as trainer_state.json holds them
    assert args["ram"] == opts.to_dict()
    assert RAMTrainerCallback(**args).schedule.ram == opts
    old = {k: v for k, v in args.items() if k != "ram"}  # a checkpoint written before RamOptions: flat keys
    assert RAMTrainerCallback(**old, variant="ram", eps=0.0).schedule.ram == RamOptions(variant="ram", eps=0.0)


def test_verl_ram_group_is_ram_options(tmp_path):
    from ram_live.integrations.verl.config import RAMVerlOptions, options_from_mapping

    common = {"store": str(tmp_path / "s"), "agent": "a", "base": str(tmp_path / "base")}
    opts = options_from_mapping({**common, "variant": "ram_plus_soft", "r": 0.3, "exclude": ["b"]})
    assert opts.ram == RamOptions(variant="ram_plus_soft", r=0.3, exclude=("b",))
    assert (opts.variant, opts.r, opts.alpha, opts.rho_scope) == ("ram_plus_soft", 0.3, 2.0, "global")
    assert set(RamOptions.names()) <= set(RAMVerlOptions.keys()) and "ram" not in RAMVerlOptions.keys()
    assert options_from_mapping(common).ram == RamOptions()
    with pytest.raises(AttributeError, match=r"RAMVerlOptions.r is read from \.ram"):
        opts.r = 0.5


INVALID = [("activity", "sometimes"), ("rho_scope", "layer"), ("variant", "ties"), ("r", -1.0),
           ("alpha", math.nan), ("eps", -1e-5), ("lambdas", [1.0]), ("exclude", "a")]


@pytest.mark.parametrize("name,value", INVALID)
def test_invalid_option_is_config_error_naming_it_everywhere(tmp_path, base_sd, name, value):
    from ram_live.integrations.lightning import RAMCallback
    from ram_live.integrations.transformers import RAMTrainerCallback
    from ram_live.integrations.verl.config import options_from_mapping

    agents = make_agents(base_sd, [0.1, 0.3])
    store = str(tmp_path / "store")
    entry_points = [
        lambda: RamOptions(**{name: value}),
        lambda: RamOptions.from_mapping({name: value}),
        lambda: ram_merge(agents, base=base_sd, **{name: value}),
        lambda: ram_merge(agents, base=base_sd, options={name: value}),
        lambda: RAMSchedule(store, "a", **{name: value}),
        lambda: RAMSchedule(store, "a", ram={name: value}),
        lambda: RAMCallback(store, "a", **{name: value}),
        lambda: RAMTrainerCallback(store, "a", ram={name: value}),
    ]
    for call in entry_points:
        with pytest.raises(ConfigError, match=rf"\b{name}\b"):
            call()
    with pytest.raises(ConfigError, match=rf"ram\.{name}\b"):
        options_from_mapping({"store": store, "agent": "a", "base": store, name: value})


def test_unknown_option_names_it_and_the_entry_point(tmp_path, base_sd):
    from ram_live.integrations.lightning import RAMCallback

    agents = make_agents(base_sd, [0.1, 0.3])
    with pytest.raises(ConfigError, match="'rr'"):
        ram_merge(agents, base=base_sd, rr=0.2)
    with pytest.raises(ConfigError, match="'rr'"):
        ram_merge(agents, base=base_sd, options={"rr": 0.2})
    with pytest.raises(ConfigError, match="RAMSchedule: unknown option.*'snapshot_evry'"):
        RAMSchedule(tmp_path / "s", "a", snapshot_evry=2)
    with pytest.raises(ConfigError, match="RAMCallback: unknown option.*'alfa'.*its options are: .*snapshot_activity"):
        RAMCallback(tmp_path / "s", "a", alfa=2)
    with pytest.raises(ConfigError, match="method="):
        ram_merge(agents, base=base_sd, method="ties")


def _ram_group(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    group = next(g for g in parser._action_groups if g.title == "RAM options")
    return {a.dest: a for a in group._group_actions}


def test_cli_ram_flags_are_the_dataclass_fields():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    fields = {f.name: f for f in dataclasses.fields(RamOptions)}
    expected = {"probe": set(PROBE_OPTIONS), "merge": set(fields) - {"variant"},
                "merge-adapters": set(fields) - {"variant"}}
    for command, names in expected.items():
        flags = _ram_group(sub[command])
        assert set(flags) == names, command
        for name, action in flags.items():
            meta = fields[name].metadata
            assert action.option_strings == ["--" + name.replace("_", "-")]
            assert action.help == meta["help"] and action.choices == meta["choices"]
            assert action.default == (fields[name].default if command == "probe" else argparse.SUPPRESS)
    # --method is the variant; probe takes RamOptions (options=, or its four fields as keywords)
    assert set(RAM_VARIANTS) <= set(METHOD_NAMES)
    params = inspect.signature(probe).parameters
    assert "options" in params and not set(PROBE_OPTIONS) & set(params)


def test_cli_merge_and_probe_flags_give_the_options_bits(files, capsys):
    tmp, base, agents, paths = files
    named = dict(zip(["coder", "tools", "memory"], agents))
    b = str(tmp / "base.safetensors")
    opts = RamOptions(r=0.2, alpha=1.0, rho_scope="tensor", activity="changed", exclude=("memory",))
    out = tmp / "m.safetensors"
    assert main(["merge", *paths, "--base", b, "--out", str(out), "--quiet", "--r", "0.2", "--alpha", "1.0",
                 "--rho-scope", "tensor", "--activity", "changed", "--exclude", "memory"]) == 0
    assert_bit_identical(load_file(out), ram_merge(named, base=base, options=opts))
    out2 = tmp / "l.safetensors"
    lam = {"coder": 1.5, "tools": 0.5, "memory": 1.0}
    assert main(["merge", *paths, "--base", b, "--out", str(out2), "--quiet", "--method", "ram",
                 "--lambdas", json.dumps(lam)]) == 0
    assert_bit_identical(load_file(out2), ram_merge(named, base=base, variant="ram", lambdas=lam))
    assert main(["probe", *paths, "--base", b, "--json", "--r", "0.2", "--alpha", "1.0", "--eps", "0.001"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == probe(named, base=base, r=0.2, alpha=1.0, eps=0.001).to_dict()
    for argv, what in [(["--eps", "-1"], "eps"), (["--method", "ties", "--r", "0.2"], "--r"),
                       (["--r", "0.2", "-O", "r=0.3"], "r: given both")]:
        assert main(["merge", *paths, "--base", b, "--out", str(tmp / "x"), *argv]) == 2
        assert what in capsys.readouterr().err
    assert not (tmp / "x").exists()


def test_probe_takes_ram_options_and_names_what_it_does_not_read():
    from ram_live.probe import PROBE_OPTIONS as read

    assert PROBE_OPTIONS == read  # the parser's copy (it imports no torch) is the probe's list
    base_sd = {"w": torch.zeros(64)}
    agents = {"a": {"w": torch.linspace(0, 1e-4, 64)}, "b": {"w": torch.linspace(1e-4, 0, 64)}}
    by_options = probe(agents, base_sd, options=RamOptions(eps=2e-5, r=0.3, alpha=1.0)).to_dict()
    assert by_options == probe(agents, base_sd, eps=2e-5, r=0.3, alpha=1.0).to_dict()
    assert by_options != probe(agents, base_sd).to_dict()
    with pytest.raises(ConfigError, match=r"probe: option\(s\) 'exclude' do not change a probe"):
        probe(agents, base_sd, exclude=["a"])
    with pytest.raises(ConfigError, match=r"probe: unknown option\(s\) 'rr'"):
        probe(agents, base_sd, rr=0.2)
    with pytest.raises(ConfigError, match=r"^eps must be >= 0.0"):
        probe(agents, base_sd, eps=-1.0)


def test_options_and_configs_with_lambdas_hash_by_value():
    a = RamOptions(lambdas={"a": 1.0, "b": 2.0}, exclude=["c"])
    b = RamOptions(lambdas={"b": 2, "a": 1.0}, exclude=("c",))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert hash(a) != hash(RamOptions(lambdas={"a": 1.0, "b": 3.0}, exclude=["c"]))
    cfg = RamPlusConfig(lambdas={"a": 0.5})
    assert hash(cfg) == hash(RamPlusConfig(lambdas={"a": 0.5})) and cfg.lambdas == {"a": 0.5}
    assert json.loads(json.dumps(a.to_dict()))["lambdas"] == {"a": 1.0, "b": 2.0}
