"""Methods declare their fast kernels and overflow bound (MergeMethod.kernels / overflow_bound); the engine reads
only those, never a method's name: a newly registered method gets the native path by declaring RAM's kernels."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ram_live.methods.ram.native as native
from ram_live.methods import ram as R
from ram_live import ConfigError, merge
from ram_live.methods.ram.config import RamConfig
from ram_live.methods.ram.rules import Given, RhoClip, Unit
from ram_live.methods import _REGISTRY, Activity, MethodKernels, get_method, register_method
from ram_live.methods.ram.method import ram_kernels
from ram_live.methods.ram.lambdas import lambda_bound
from tests.conftest import assert_bit_identical, make_agents

needs_kernels = pytest.mark.skipif(native.kernels() is None, reason="no C compiler: native kernels unavailable")
TWIN = "ram_plus_twin_test"


@pytest.fixture
def twin() -> Iterator[Any]:
    """Registers ``TWIN`` with RAM+'s hooks (``**fields`` override them) and drops it afterwards."""
    ram = get_method("ram_plus")
    hooks = {
        f.name: getattr(ram, f.name)
        for f in dataclasses.fields(ram)
        if f.name not in ("name", "config_cls", "combine", "description")
    }

    def register(**fields: Any) -> str:
        _REGISTRY.pop(TWIN, None)
        register_method(TWIN, RamConfig, ram.combine, **{**hooks, **fields})
        return TWIN

    yield register
    _REGISTRY.pop(TWIN, None)


@pytest.fixture
def agents(base_sd: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    return make_agents(base_sd, [0.3, 0.6, 0.5], scale=0.05)


@dataclasses.dataclass(frozen=True)
class ActiveMeanConfig:
    """RAM's rule under another name, with a config the engine has never seen: the mean of the active agents' τ."""

    eps: float = 1e-5


def _active_mean_accumulator(config, state, capacity, k, device, dtype, auxiliary=()):  # noqa: ANN001, ANN202
    return R.RamAccumulator(capacity, k, device, dtype, None)


def _register_active_mean(name: str, **fields: Any) -> None:
    register_method(
        name,
        ActiveMeanConfig,
        lambda deltas, ctx, config: R.ram_combine(deltas),
        activity=lambda config: Activity(eps=config.eps),
        accumulator=_active_mean_accumulator,
        **fields,
    )


@needs_kernels
def test_a_newly_registered_method_gets_the_native_kernel_by_declaring_it(base_sd, agents) -> None:
    """A method the engine has never heard of, reusing RAM's kernels hook, runs the native kernel (MergeInfo
    records the kind) with the bits of its own eager accumulator and of RAM."""
    try:
        _register_active_mean("active_mean_test", kernels=ram_kernels)
        _register_active_mean("active_mean_eager_test")
        fast, info = merge(agents, base=base_sd, method="active_mean_test", return_info=True, workers=2)
        slow, slow_info = merge(agents, base=base_sd, method="active_mean_eager_test", return_info=True)
    finally:
        _REGISTRY.pop("active_mean_test", None)
        _REGISTRY.pop("active_mean_eager_test", None)
    assert info.extra["kernels"] == {"native": len(base_sd)}
    assert slow_info.extra["kernels"] == {"eager": len(base_sd)}
    assert_bit_identical(fast, slow)
    assert_bit_identical(fast, merge(agents, base=base_sd, method="ram"))


@needs_kernels
def test_a_ram_plus_twin_declaring_rams_kernels_reads_once_natively(base_sd, agents, twin) -> None:
    name = twin(kernels=ram_kernels)
    out, info = merge(agents, base=base_sd, method=name, r=0.3, return_info=True, workers=2)
    ref, ref_info = merge(agents, base=base_sd, method="ram_plus", r=0.3, return_info=True, workers=2)
    assert info.method == TWIN and info.extra["kernels"] == {"native": len(base_sd)}
    assert info.passes == 1 and info.extra["single_read"] == len(base_sd)  # the one-read RAM+, as ram_plus
    assert_bit_identical(out, ref)
    assert info.lambdas == ref_info.lambdas and ref_info.extra["kernels"] == info.extra["kernels"]


def test_without_declared_kernels_the_same_method_runs_eagerly_with_the_same_bits(base_sd, agents, twin) -> None:
    name = twin(kernels=None)
    out, info = merge(agents, base=base_sd, method=name, r=0.3, return_info=True)
    assert info.extra["kernels"] == {"eager": len(base_sd)} and "single_read" not in info.extra
    assert info.passes == 2  # counts, then merge: nothing lets it read once
    assert_bit_identical(out, merge(agents, base=base_sd, method="ram_plus", r=0.3))


@needs_kernels
def test_the_engine_honours_what_the_kernels_allow(base_sd, agents, twin) -> None:
    """Declaring only RAM's counter: the statistics pass counts natively, the merge runs the eager accumulator and
    nothing reads once; declaring only the merge: the counts are the engine's torch ones, the merge native."""
    name = twin(kernels=lambda config: MethodKernels(count=ram_kernels(config).count))
    out, info = merge(agents, base=base_sd, method=name, r=0.3, return_info=True)
    assert info.extra["kernels"] == {"eager": len(base_sd)} and info.passes == 2
    assert_bit_identical(out, merge(agents, base=base_sd, method="ram_plus", r=0.3))
    name = twin(kernels=lambda config: MethodKernels(merge=ram_kernels(config).merge))
    out, info = merge(agents, base=base_sd, method=name, r=0.3, return_info=True)
    assert info.extra["kernels"] == {"native": len(base_sd)} and info.passes == 2
    assert_bit_identical(out, merge(agents, base=base_sd, method="ram_plus", r=0.3))


def test_the_overflow_bound_is_the_methods(base_sd, agents, twin) -> None:
    """In place, a tensor is dry-run unless the method's bound clears it: RAM+'s bound clears every one here
    (small deltas), no bound clears none, and an unbounded one (math.inf) clears none either."""

    def in_place(**fields: object) -> int:
        name = twin(**fields)
        module = torch.nn.ParameterDict(
            {k.replace(".", "_"): torch.nn.Parameter(v.clone()) for k, v in base_sd.items()}
        )
        models = [{k.replace(".", "_"): v for k, v in a.items()} for a in agents]
        _, info = merge(models, base=module, method=name, r=0.3, inplace=True, return_info=True)
        expected = merge(models, base={k.replace(".", "_"): v for k, v in base_sd.items()}, method="ram_plus", r=0.3)
        assert_bit_identical({k: p.detach() for k, p in module.items()}, expected)
        return info.extra["dry_run"]

    assert in_place() == 0  # RAM+'s own bound
    assert in_place(overflow_bound=None) == len(base_sd)
    assert in_place(overflow_bound=lambda config, run_state: math.inf) == len(base_sd)


def test_rams_bound_is_its_largest_lambda() -> None:
    assert lambda_bound(RamConfig(lam=RhoClip(r=0.3, alpha=2.0))) == pytest.approx(1.6)
    assert lambda_bound(RamConfig(lam=RhoClip(r=0.3, alpha=math.inf))) == math.inf
    assert lambda_bound(RamConfig(lam=RhoClip(r=0.3)), torch.tensor([1.25, -2.5, 1.0])) == 2.5  # the merge's own λ
    assert lambda_bound(RamConfig(lam=Given({"a": -3.0, "b": 0.5}))) == 3.0
    assert get_method("ram").overflow_bound(RamConfig(lam=Unit()), None) == 1.0
    assert {n: get_method(n).kernels is not None for n in ("ram", "ram_plus", "ram_plus_soft", "ties", "linear")} == {
        "ram": True,
        "ram_plus": True,
        "ram_plus_soft": True,
        "ties": True,  # the baselines declare their device kernel, and nothing to compile or count
        "linear": True,
    }
    for name in ("ties", "linear", "task_arithmetic", "dare_linear", "dare_ties"):
        method = get_method(name)
        declared = method.kernels(method.config_cls())
        assert declared.merge is not None and declared.warm_up is None and declared.count is None, name
    assert ram_kernels(RamConfig()).single_read is not None
    assert ram_kernels(RamConfig(shared="sign")).single_read is None  # the sign rule counts first, then merges


def test_kernels_declared_as_flags_are_refused_naming_the_field() -> None:
    """``MethodKernels`` holds callables the engine runs; the former flags would be silently ignored."""
    for field in ("merge", "count", "single_read", "native"):
        with pytest.raises(ConfigError, match=rf"MethodKernels\({field}=True\)"):
            MethodKernels(**{field: True})
    assert MethodKernels(native=lambda: False).native() is False


def test_compile_true_for_a_method_without_compiled_kernels_merges_eagerly(base_sd, agents, monkeypatch) -> None:
    """TIES declares no compiled kernels: ``compile=True`` compiles nothing (not even the validation's counts), so
    a broken toolchain changes nothing and no warning is given."""
    import warnings

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("toolchain broken")

    monkeypatch.setattr(torch, "compile", broken)
    module = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(v.clone()) for k, v in base_sd.items()})
    models = [{k.replace(".", "_"): v for k, v in a.items()} for a in agents]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info = merge(models, base=module, method="ties", inplace=True, compile=True, return_info=True)
    assert info.extra["compiled"] is False and info.extra["kernels"] == {"eager": len(base_sd)}
    expected = merge(models, base={k.replace(".", "_"): v for k, v in base_sd.items()}, method="ties")
    assert_bit_identical({k: p.detach() for k, p in module.items()}, expected)
