"""The merge checks: the copy floor, RAM / RAM+ / curvature-aware RAM / TA / TIES / DARE-TIES on a whole
Qwen2.5-1.5B-shaped model (:func:`check_merge`) and on one 4096 x 4096 tensor (:func:`check_tensor`), timed
against it with their peak memory and (on CUDA) the GPU's busy time beside the wall time (:mod:`.timing`: a missed
target names the kernels or the host), and the probe (warmed up, then timed); every model result compared with
the CPU's on a subset of tensors and with a float64 reference where the method has a closed form."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import bench_merge
import torch
from torch import Tensor, nn

from ram_live.kernels.device.common import unbuilt_kernels

from gpu_checks import compare, inputs, timing
from gpu_checks.runner import Outcome, Skip

__all__ = ["METHODS", "Setup", "check_floor", "check_merge", "check_probe", "check_tensor"]

#: label -> merge options (``importance=True``: the setup's importances). r and alpha are RAM+'s defaults.
METHODS: dict[str, dict[str, Any]] = {
    "RAM": {"method": "ram"},
    "RAM+": {"method": "ram_plus"},
    "RAM curvature": {"method": "ram", "importance": True},
    "TA": {"method": "task_arithmetic"},
    "TIES": {"method": "ties", "density": 0.2},
    "DARE-TIES": {"method": "dare_ties", "density": 0.5},
}
#: The methods with a compiled kernel (``compile=True``; docs/performance.md, "Kernels"): the RAM family.
COMPILED = ("RAM", "RAM+", "RAM curvature")
#: The methods whose masks are random: DARE draws from a generator on the merge's device, so its CUDA masks are
#: not the CPU's (same seed, another generator); only its exact parts are compared across devices.
RANDOM = ("DARE-TIES",)
R, ALPHA = 0.1, 2.0
#: Time targets as x the floor on CUDA (issue 40; docs/performance.md, "GPU readiness").
TARGET_FLOOR = {"RAM": 1.5, "RAM curvature": 1.5, "TA": 1.5, "RAM+": 2.5, "TIES": 5.0, "DARE-TIES": 5.0}
#: The probe's target: its one read of the inputs, x the floor.
TARGET_PROBE = 2.0


@dataclass
class Setup:
    """The inputs on the device, their CPU subset, and what the checks learn as they go."""

    device: torch.device
    sizes: inputs.Sizes
    reps: int
    base: nn.Module
    agents: list[nn.Module]
    imps: dict[str, dict[str, Tensor]]
    keys: list[str]
    cpu_base: dict[str, Tensor] = field(default_factory=dict)
    cpu_agents: list[dict[str, Tensor]] = field(default_factory=list)
    cpu_imps: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    bandwidth: float | None = None
    counts: dict[str, list[int]] | None = None
    eager: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    #: the single-tensor rows' inputs (built by the first of them): base, agents, importances
    tensor: tuple[dict[str, Tensor], list[dict[str, Tensor]], dict[str, dict[str, Tensor]]] | None = None

    @classmethod
    def make(cls, device: torch.device, sizes: inputs.Sizes, reps: int, k: int = 3) -> Setup:
        base, agents = inputs.build(sizes, device, k)
        imps = inputs.importances(base, k)
        keys = list(inputs.SUBSET)
        s = cls(device, sizes, reps, base, agents, imps, keys)
        s.cpu_base = inputs.subset(base, keys)
        s.cpu_agents = [inputs.subset(a, keys) for a in agents]
        s.cpu_imps = {n: inputs.subset(h, keys) for n, h in imps.items()}
        return s

    @property
    def model_bytes(self) -> int:
        return inputs.nbytes(self.base)

    def floor_seconds(self, label: str) -> float | None:
        """The merge's bytes (K + 1 inputs read, one output written, importances read) at the copy bandwidth."""
        if not self.bandwidth:
            return None
        moved = (len(self.agents) + 2) * self.model_bytes
        if METHODS[label].get("importance"):
            moved += sum(inputs.nbytes(h) for h in self.imps.values())
        return moved / self.bandwidth

    def options(self, label: str, cpu: bool = False) -> dict[str, Any]:
        kw = dict(METHODS[label])
        if kw.pop("importance", False):
            kw["importance"] = self.cpu_imps if cpu else self.imps
        return kw


def _sync(device: torch.device) -> None:
    bench_merge.sync(device)


def check_device(setup_device: torch.device, out: Outcome) -> None:
    """Device name and memory, torch / CUDA / Triton versions, the host CPU."""
    from _host import cpu_label

    r: dict[str, Any] = {"torch": torch.__version__, "cpu": cpu_label(), "cuda_available": torch.cuda.is_available()}
    if setup_device.type == "cuda":
        p = torch.cuda.get_device_properties(setup_device)
        r.update(
            name=p.name,
            memory_gib=round(p.total_memory / 2**30, 1),
            capability=f"{p.major}.{p.minor}",
            cuda=torch.version.cuda,
            devices=torch.cuda.device_count(),
        )
        try:
            import triton

            r["triton"] = triton.__version__
        except ImportError:
            r["triton"] = None
    else:
        r.update(name=r["cpu"], memory_gib=None, devices=0)
    out.result.update(r)


def check_floor(setup: Setup, out: Outcome) -> None:
    """``copy_`` bandwidth over every input tensor into one output-sized destination (bench_merge's floor)."""
    dst = {n: torch.empty_like(p) for n, p in setup.base.named_parameters()}
    srcs = [dict(setup.base.named_parameters())] + [dict(a.named_parameters()) for a in setup.agents]
    bandwidth, seconds = bench_merge.copy_bandwidth(srcs, dst, setup.device)
    del dst
    setup.bandwidth = bandwidth
    out.result.update(
        copied_gb=2 * sum(bench_merge.nbytes(s) for s in srcs) / 1e9,
        seconds=seconds,
        gb_per_s=bandwidth / 1e9,
        params=setup.sizes.params,
        model_gb=setup.model_bytes / 1e9,
    )
    out.require(math.isfinite(bandwidth) and bandwidth > 0, f"copy bandwidth {bandwidth}")


def _lambdas_expected(counts: dict[str, list[int]]) -> list[float]:
    lam = []
    for a, u in zip(counts["active"], counts["unique"]):
        rho = math.inf if u == 0 else (a - u) / u
        lam.append(1 + R * min(max(rho, 0.0), ALPHA))
    return lam


def _cpu_reference(setup: Setup, label: str, info: Any) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """The CPU merge of the subset (RAM+ with the device run's λ, which global ρ took from every tensor) and the
    float64 reference where the method has one."""
    from ram_live import merge

    kw = setup.options(label, cpu=True)
    lambdas = None
    if label == "RAM+":
        kw["lambdas"] = dict(info.lambdas)
        lambdas = [info.lambdas[f"agent_{t}"] for t in range(len(setup.agents))]
    cpu = merge(setup.cpu_agents, base=setup.cpu_base, **kw)
    if label in ("RAM", "RAM+", "RAM curvature"):
        imps = [setup.cpu_imps[f"agent_{t}"] for t in range(len(setup.agents))] if label == "RAM curvature" else None
        ref = compare.reference64(setup.cpu_base, setup.cpu_agents, lambdas=lambdas, importance=imps)
    elif label == "TA":
        ref = compare.reference64(setup.cpu_base, setup.cpu_agents, summed=True)
    else:
        ref = None
    return cpu, ref


def _identical(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(int(compare.ulp_distance(sa[k], sb[k]).max()) == 0 for k in sa)


def check_merge(setup: Setup, label: str, compiled: bool, small: bool, out: Outcome) -> None:
    """One method on the device: time (best of ``reps``) as x the floor, peak memory, bits against the CPU."""
    from ram_live import merge

    if compiled and label not in COMPILED:
        raise Skip(
            "compile=True compiles the RAM family only (docs/performance.md, Kernels): this method merges "
            "eagerly either way"
        )
    kw = setup.options(label)

    def call() -> Any:
        return merge(setup.agents, base=setup.base, return_info=True, compile=compiled, **kw)

    dev = setup.device
    if compiled:
        _sync(dev)
        t0 = time.perf_counter()
        call()
        _sync(dev)
        out.result["first_call_s"] = time.perf_counter() - t0
    if dev.type == "cuda":
        _sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    result, info = call()
    _sync(dev)
    extra = torch.cuda.max_memory_allocated(dev) - before if dev.type == "cuda" else None
    times, last, share = bench_merge.timed(call, setup.reps, dev, keep_last=True)
    best = min(times)
    floor = setup.floor_seconds(label)
    largest = max(p.numel() * p.element_size() for p in setup.base.parameters())
    out.result.update(
        seconds=best,
        times=times,
        x_floor=best / floor if floor else None,
        kernels=info.extra.get("kernels"),
        passes=info.passes,
        extra_peak_bytes=extra,
        output_bytes=setup.model_bytes,
        extra_over_output=None if extra is None else extra / setup.model_bytes,
        others_cpu=share,
    )
    kernel_s = _busy(call, dev, floor, out)
    ran = set(info.extra.get("kernels", {}))
    if dev.type == "cuda":  # one mechanism there: the fused device kernels, compile=True or not
        out.require(ran == {"device"}, f"the CUDA merge ran {info.extra.get('kernels')}, not the device kernels")
        _require_built(out)
    elif compiled:
        out.require(ran == {"compiled"}, f"compile=True ran {info.extra.get('kernels')}, not the compiled kernels")
    out.require(_identical(result, last[0]), "two runs of the same merge differ")
    del last
    got = inputs.subset(result, setup.keys)
    cpu, ref = _cpu_reference(setup, label, info)
    vs_cpu = compare.compare_outputs(got, cpu, setup.cpu_base, setup.cpu_agents)
    out.result["vs_cpu"] = vs_cpu
    out.require(
        vs_cpu["untouched_changed"] == 0, f"{vs_cpu['untouched_changed']} entries no agent changed lost the base's bits"
    )
    if label in COMPILED:  # the device kernels do the CPU's operations in its order: its bits
        out.require(
            vs_cpu["share_differing"] == 0, f"{vs_cpu['share_differing']:.2e} of the entries differ from the CPU's"
        )
    elif label not in RANDOM:
        out.require(
            vs_cpu["max_ulp"] <= compare.TOLERANCE_ULP,
            f"{vs_cpu['max_ulp']} ULP from the CPU result (tolerance {compare.TOLERANCE_ULP})",
        )
    if ref is not None:
        for who, res in (("device", got), ("cpu", cpu)):
            worst = max(float(compare.scaled_ulp_distance(res[k], ref[k], setup.cpu_base[k]).max()) for k in ref)
            out.result[f"{who}_vs_float64_ulp"] = round(worst, 3)
            out.result[f"{who}_vs_float64_ulp_at_result"] = max(
                int(compare.ulp_distance(res[k], ref[k]).max()) for k in ref
            )
            out.require(
                worst <= compare.TOLERANCE_ULP,
                f"{who} result {worst:.3g} ULP (at the operands' scale) from the float64 reference",
            )
    if label == "RAM+":
        _check_counts(setup, info, out)
    if compiled and label in setup.eager:
        same = compare.compare_outputs(got, setup.eager[label], setup.cpu_base, setup.cpu_agents)
        out.result["vs_eager_share_differing"] = same["share_differing"]
        out.result["vs_eager_max_ulp"] = same["max_ulp"]
        # the same bits: on CPU inductor's C++ follows the eager ops, on CUDA both runs are the device kernels
        out.require(
            same["share_differing"] == 0,
            f"compiled result differs from the eager one on this device in "
            f"{same['share_differing']:.2e} of the entries (max {same['max_ulp']} ULP)",
        )
    elif not compiled:
        setup.eager[label] = got
    if dev.type == "cuda" and not small:
        target = TARGET_FLOOR[label]
        out.targets[f"le_{target:g}x_floor"] = floor is not None and best <= target * floor
        out.targets["extra_le_output_plus_2_largest"] = extra is not None and extra <= setup.model_bytes + 2 * largest
        out.result["bound_by"] = timing.verdict(best, kernel_s, floor, target)


def _busy(call: Any, device: torch.device, floor: float | None, out: Outcome) -> float | None:
    """The GPU's busy time of one more run of ``call`` and its slowest kernels, into ``out.result`` (None off
    CUDA). The profiler is an aid: where it fails, the check says so and goes on."""
    try:
        table = timing.busy_time(call, device)
    except Exception as exc:  # noqa: BLE001
        out.result["kernel_time_error"] = f"{type(exc).__name__}: {exc}"
        return None
    if table is None:
        return None
    out.result.update(
        kernel_s=table["kernel_s"],
        kernel_x_floor=table["kernel_s"] / floor if floor else None,
        device_launches=table["launches"],
        kernels_top=table["top"],
    )
    return table["kernel_s"]


def check_tensor(setup: Setup, label: str, out: Outcome) -> None:
    """One method on one 4096 x 4096 bf16 tensor (K = 3; tiny models: 256 x 256): the kernels' own speed, one
    launch per merge, against the floor of that tensor's bytes (warmed up first; best of the setup's runs; the
    GPU's busy time apart)."""
    from ram_live import merge

    dev = setup.device
    if setup.tensor is None:  # (tiny models: a tiny tensor)
        shape = inputs.TENSOR_SHAPE if setup.sizes.hidden >= 1024 else (256, 256)
        base, agents = inputs.build_tensor(dev, len(setup.agents), shape)
        imps = {f"agent_{t}": {"w": torch.ones_like(base["w"])} for t in range(len(agents))}
        setup.tensor = (base, agents, imps)
    base, agents, imps = setup.tensor
    kw = dict(METHODS[label])
    if kw.pop("importance", False):
        kw["importance"] = imps

    def call() -> Any:
        return merge(agents, base=base, return_info=True, **kw)

    _, info = call()  # the warm-up: the kernels' builds
    _sync(dev)
    times, _, _ = bench_merge.timed(call, setup.reps, dev)
    best = min(times)
    moved = (len(agents) + 2 + (len(agents) if "importance" in kw else 0)) * base["w"].numel() * 2
    floor = moved / setup.bandwidth if setup.bandwidth else None
    out.result.update(
        seconds=best,
        times=times,
        x_floor=best / floor if floor else None,
        kernels=info.extra.get("kernels"),
        numel=base["w"].numel(),
    )
    kernel_s = _busy(call, dev, floor, out)
    if dev.type == "cuda":
        out.require(set(info.extra.get("kernels", {})) == {"device"}, f"ran {info.extra.get('kernels')}")
        _require_built(out)
        if label == "RAM":  # compile=True takes the same device kernels (no compile rows on CUDA)
            _, compiled = merge(agents, base=base, return_info=True, compile=True, **kw)
            out.result["compile_true_kernels"] = compiled.extra.get("kernels")
            out.require(set(compiled.extra.get("kernels", {})) == {"device"}, "compile=True left the device kernels")
        target = TARGET_FLOOR[label]
        out.targets[f"le_{target:g}x_floor"] = floor is not None and best <= target * floor
        out.result["bound_by"] = timing.verdict(best, kernel_s, floor, target)


def _check_counts(setup: Setup, info: Any, out: Outcome) -> None:
    """RAM+'s counts and λ against the counts made with integer ops (exact)."""
    if setup.counts is None:
        setup.counts = compare.exact_counts(setup.base, setup.agents)
    want = setup.counts
    stats = info.statistics
    out.result["active"], out.result["unique"] = stats.active.tolist(), stats.unique.tolist()
    out.require(
        stats.active.tolist() == want["active"] and stats.unique.tolist() == want["unique"],
        f"counts {stats.active.tolist()}/{stats.unique.tolist()} != exact {want['active']}/{want['unique']}",
    )
    lam = [info.lambdas[f"agent_{t}"] for t in range(len(setup.agents))]
    out.result["lambdas"] = lam
    out.require(
        all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(lam, _lambdas_expected(want))),
        f"λ {lam} != {_lambdas_expected(want)} from the exact counts",
    )


def _require_built(out: Outcome) -> None:
    """Every device kernel built: none fell back to its op's torch implementation (a DeviceKernelWarning)."""
    unbuilt = unbuilt_kernels()
    out.require(not unbuilt, f"Triton could not build {unbuilt}: their ops ran the torch implementation")


def check_probe(setup: Setup, out: Outcome) -> None:
    """The probe on the device: its counts equal the exact ones (whole model) and the CPU probe's (subset)."""
    from ram_live import probe

    report = probe(setup.agents, base=setup.base)  # the warm-up: the counting kernel's builds
    _sync(setup.device)
    times, _, _ = bench_merge.timed(lambda: probe(setup.agents, base=setup.base), setup.reps, setup.device)
    seconds = min(times)
    if setup.counts is None:
        setup.counts = compare.exact_counts(setup.base, setup.agents)
    stats = report.statistics()
    got = {"active": stats.active.tolist(), "unique": stats.unique.tolist(), "histogram": stats.histogram.tolist()}
    floor = (len(setup.agents) + 1) * setup.model_bytes / setup.bandwidth if setup.bandwidth else None
    out.result.update(seconds=seconds, times=times, x_floor=seconds / floor if floor else None, **got)
    kernel_s = _busy(lambda: probe(setup.agents, base=setup.base), setup.device, floor, out)
    if setup.device.type == "cuda" and floor:
        out.targets[f"le_{TARGET_PROBE:g}x_floor"] = seconds <= TARGET_PROBE * floor
        out.result["bound_by"] = timing.verdict(seconds, kernel_s, floor, TARGET_PROBE)
    out.require(got == setup.counts, f"probe counts {got} != exact {setup.counts}")
    if setup.device.type == "cuda":
        _require_built(out)
    sub = inputs.subset(setup.base, setup.keys, setup.device)
    dev_sub = probe([inputs.subset(a, setup.keys, setup.device) for a in setup.agents], base=sub)
    cpu_sub = probe(setup.cpu_agents, base=setup.cpu_base)
    a, b = dev_sub.statistics(), cpu_sub.statistics()
    out.require(
        all(torch.equal(x, y) for x, y in ((a.active, b.active), (a.unique, b.unique), (a.histogram, b.histogram))),
        "subset counts: device != CPU",
    )
    out.require(dev_sub.jaccard == cpu_sub.jaccard, "subset Jaccard: device != CPU")
    cos = max(abs(x - y) for rx, ry in zip(dev_sub.cosine, cpu_sub.cosine) for x, y in zip(rx, ry))
    out.result["subset_cosine_max_diff"] = cos
    out.require(cos <= 1e-5, f"subset cosine differs by {cos} (tolerance 1e-5; docs: ~1e-6 native vs torch)")
