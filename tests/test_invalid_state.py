"""The failure paths that were bare ``assert``s (removed by ``python -O``): each is now a library error."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from ram_live import ConfigError, InvalidStateError, RAMSchedule, RamLiveError, merge, register_method
from ram_live.methods import RamConfig, RunContext, _REGISTRY, get_method
from ram_live.methods.ram import given_lambdas
from ram_live.io.sinks import ModuleSink, SafetensorsSink
from ram_live.store import BaseMismatchError


def test_invalid_state_error_is_a_library_runtime_error():
    assert issubclass(InvalidStateError, RamLiveError) and issubclass(InvalidStateError, RuntimeError)


def test_a_schedule_whose_attach_failed_refuses_to_snapshot(tmp_path):
    RAMSchedule(tmp_path / "s", agent="a").attach(nn.Linear(4, 4))
    other = RAMSchedule(tmp_path / "s", agent="b")
    model = nn.Linear(4, 4)  # another base: the store refuses it after the schedule took it
    with pytest.raises(BaseMismatchError):
        other.attach(model)
    for _ in range(2):
        with pytest.raises(InvalidStateError, match=r"RAMSchedule\('b'\): attach\(model\) failed; call it again"):
            other.snapshot(model, 1)
    assert other.snapshots == 0 and not (tmp_path / "s" / "b").exists()


def test_sinks_finished_out_of_order(tmp_path):
    with pytest.raises(InvalidStateError, match=r"ModuleSink.finish\(\) before begin\(\), or after abort\(\)"):
        ModuleSink(nn.Linear(2, 2)).finish()
    sink = SafetensorsSink(tmp_path / "out.safetensors")
    with pytest.raises(
        InvalidStateError,
        match=rf"SafetensorsSink for {tmp_path / 'out.safetensors'}: cannot "
        r"finish before begin\(\)",
    ):
        sink.finish()
    assert not (tmp_path / "out.safetensors").exists()


def test_statistics_without_an_activity_rule_name_the_tensor():
    @dataclass(frozen=True)
    class CountsConfig:
        pass

    def prepare(config, view, weights):
        return view.statistics(None)  # a method's own prepare passing no rule

    register_method(
        "counts_without_rule_test", CountsConfig, lambda deltas, ctx, config: deltas.sum(0), prepare=prepare
    )
    try:
        base = {"w": torch.zeros(4)}
        with pytest.raises(ConfigError, match=r"tensor 'w': RAM counts need an activity rule \(an Activity\)"):
            merge([{"w": torch.ones(4)}], base=base, method="counts_without_rule_test")
    finally:
        _REGISTRY.pop("counts_without_rule_test", None)


def test_ram_lambdas_and_counts_missing():
    with pytest.raises(ConfigError, match=r"ram_plus: no lambdas to take \(lam=RhoClip"):
        given_lambdas(RamConfig(), ["a"])
    setup = get_method("ram_plus").setup
    with pytest.raises(InvalidStateError, match="ram_plus with rho_scope='global' needs the RAM counts"):
        setup(RamConfig(), RunContext(("a", "b"), None, torch.device("cpu")))


def test_native_importance_encoder_refuses_a_dense_count_other_than_the_size():
    from ram_live.store import native_codes as codes_native

    lib = codes_native.kernels()
    if lib is None:
        pytest.skip("no native importance kernels here")
    with pytest.raises(InvalidStateError, match="a dense piece's importances are all 8 entries, got count=9"):
        lib.encode(torch.ones(8), "dense", None, 9)
