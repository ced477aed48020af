"""``benchmarks/gpu_check.py`` in CPU mode at tiny sizes: every check runs and passes (so the script cannot rot
before a GPU is lent), its JSON has the expected keys and finite ratios; and its helpers (ULP distance, the
float64 reference, the runner's error capture and time budget) on their own."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_checks import compare  # noqa: E402
from gpu_checks.runner import Runner, Skip  # noqa: E402

MERGES = ("RAM", "RAM+", "RAM curvature", "TA", "TIES", "DARE-TIES")
#: Every check of a CPU run, in the order they run (the JSON keeps it); "cuda tests" is skipped there.
ORDER = (
    "device",
    "inputs",
    "floor",
    *(f"{m} model" for m in MERGES),
    *(f"{m} candidate" for m in MERGES),
    "probe",
    *(f"{m} tensor" for m in MERGES),
    "plain RAM",
    "plain TIES",
    "cuda tests",
    "peft",
    "distributed",
    "RAM compile",
    "RAM+ compile",
    "RAM curvature compile",
    "vllm",
)
SKIPPED = ("cuda tests", "vllm")  # no CUDA device; the vLLM check times vLLM on a GPU
RAN = tuple(name for name in ORDER if name not in SKIPPED)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[dict, str]:
    path = tmp_path_factory.mktemp("gpu_check") / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--small",
            "--json",
            str(path),
            "--budget",
            "1800",
        ],  # a slow CI machine skips nothing
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(path.read_text()), proc.stdout


def test_every_check_runs_and_passes_on_cpu(cpu_run):
    data, stdout = cpu_run
    assert set(data) == {"meta", "checks", "summary", "elapsed_s", "budget_s", "finished"}
    assert data["finished"] is True and "stopped" not in data["meta"]
    checks = data["checks"]
    assert tuple(checks) == ORDER
    for name in RAN:
        assert checks[name]["status"] == "pass", (name, checks[name])
        assert set(checks[name]) == {"status", "seconds", "result", "problems", "targets", "reason", "traceback"}
    assert checks["cuda tests"]["status"] == "skipped"
    assert checks["cuda tests"]["reason"].startswith("skipped-no-device")
    assert checks["vllm"]["status"] == "skipped"
    assert data["summary"] == {"pass": len(RAN), "fail": 0, "error": 0, "skipped": len(SKIPPED)}
    assert data["meta"]["device"] == "cpu" and data["meta"]["k"] == 3
    assert data["elapsed_s"] < data["budget_s"]
    assert "| check | status |" in stdout and stdout.rstrip().splitlines()[-1] == json.dumps(data)


def test_ratios_finite_and_cpu_results_identical(cpu_run):
    checks = cpu_run[0]["checks"]
    floor = checks["floor"]["result"]
    assert math.isfinite(floor["gb_per_s"]) and floor["gb_per_s"] > 0
    models = [f"{m} model" for m in MERGES] + ["RAM compile", "RAM+ compile", "RAM curvature compile"]
    for name in models + ["probe"] + [f"{m} tensor" for m in MERGES]:
        r = checks[name]["result"]
        assert math.isfinite(r["x_floor"]) and r["x_floor"] > 0, name
        assert all(v is None for v in checks[name]["targets"].values())  # targets are for CUDA at full size
        assert "kernel_s" not in r and "bound_by" not in r  # the GPU's busy time: CUDA only
        if name in models:  # the device is the CPU here: the same path, the same bits
            assert r["vs_cpu"]["max_ulp"] == 0 and r["vs_cpu"]["share_differing"] == 0, name
            assert r["vs_cpu"]["untouched_entries"] > 0 and r["vs_cpu"]["untouched_changed"] == 0, name
    for name in ("RAM model", "RAM+ model", "RAM curvature model", "TA model"):
        assert checks[name]["result"]["device_vs_float64_ulp"] <= compare.TOLERANCE_ULP
    assert set(checks["RAM compile"]["result"]["kernels"]) == {"compiled"}
    assert checks["RAM compile"]["result"]["vs_eager_share_differing"] == 0
    ram_plus = checks["RAM+ model"]["result"]
    assert all(1.0 <= lam <= 1.2 for lam in ram_plus["lambdas"])
    assert all(0 < u <= a for a, u in zip(ram_plus["active"], ram_plus["unique"]))
    probe = checks["probe"]["result"]
    assert probe["active"] == ram_plus["active"] and sum(probe["histogram"]) == cpu_run[0]["meta"]["params"]
    assert len(probe["times"]) >= 1  # timed after its warm-up
    assert checks["RAM tensor"]["result"]["kernels"] == {"native": 1}
    for m in MERGES:  # a search's candidate: the one-shot merge's bits (else the check fails), its own time
        r = checks[f"{m} candidate"]["result"]
        assert math.isfinite(r["x_floor"]) and r["x_floor"] > 0 and "kernel_s" not in r, m
    assert checks["distributed"]["result"]["backend"] == "gloo"


def test_ulp_distance():
    a = torch.tensor([1.0, -1.0, 0.0, 2.0**-130, 3.0], dtype=torch.bfloat16)
    bits = a.view(torch.int16)  # the next bf16 towards +inf, by its bits (0 -> the smallest subnormal)
    up = torch.where(a > 0, bits + 1, torch.where(a < 0, bits - 1, torch.ones_like(bits))).view(torch.bfloat16)
    assert compare.ulp_distance(a, a).tolist() == [0] * 5
    assert compare.ulp_distance(a, up).tolist() == [1, 1, 1, 1, 1]
    zero, negzero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert compare.ulp_distance(zero, negzero).tolist() == [0]
    tiny = torch.tensor([1e-45])  # the smallest float32 subnormal: one ULP either side of zero
    assert compare.ulp_distance(tiny, -tiny).tolist() == [2]


def test_reference64_is_ram_by_definition():
    base = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0])}
    agents = [{"w": torch.tensor([1.0, 2.0, 3.0, 1.0])}, {"w": torch.tensor([1.0, 1.0, 5.0, 1.5])}]
    assert compare.reference64(base, agents)["w"].tolist() == [1.0, 2.0, 4.0, 1.5]
    assert compare.reference64(base, agents, lambdas=[2.0, 1.0])["w"].tolist() == [1.0, 3.0, 4.0, 1.5]
    imps = [{"w": torch.tensor([1.0, 1.0, 3.0, 1.0])}, {"w": torch.tensor([1.0, 1.0, 1.0, 0.0])}]
    assert compare.reference64(base, agents, importance=imps)["w"].tolist() == [1.0, 2.0, 3.5, 1.5]
    assert compare.reference64(base, agents, summed=True)["w"].tolist() == [1.0, 2.0, 7.0, 1.5]
    counts = compare.exact_counts(base, agents)
    assert counts == {"active": [2, 2], "unique": [1, 1], "histogram": [1, 2, 1]}


def test_runner_reports_errors_and_skips():
    runner = Runner(budget_s=3600)

    def boom(out):
        raise ValueError("bad")

    def skip(out):
        raise Skip("no device")

    def fails(out):
        out.require(False, "one is not two")

    assert runner.run("boom", boom).status == "error"
    assert "ValueError: bad" in runner.outcomes["boom"].traceback
    assert runner.run("skip", skip).reason == "no device"
    assert runner.run("fails", fails).problems == ["one is not two"]
    assert runner.run("late", lambda out: None, needs_s=7200).status == "skipped"
    assert runner.summary() == {"pass": 0, "fail": 1, "error": 1, "skipped": 2}


def test_the_float64_reference_is_measured_at_the_operands_scale():
    """RAM+ applies λ in float32: where θ₀ + λ·τ cancels exactly in float64, the float32 result is a rounding of θ₀
    away from 0, thousands of bf16 ULPs at the result's own scale (what the first H200 run reported as a failure),
    under one at the operands' scale (the documented tolerance)."""
    from ram_live import merge

    base = torch.tensor([0.01336669921875, 0.5], dtype=torch.bfloat16)
    agent = base.clone()
    agent[0] = (base[0].float() - 0.011138916015625).bfloat16()  # τ = -0.011138916015625, λ·τ = -θ₀ in float64
    out = merge([{"w": agent}, {"w": base}], base={"w": base}, method="ram", lambdas={"agent_0": 1.2, "agent_1": 1.0})
    ref = compare.reference64({"w": base}, [{"w": agent}, {"w": base}], lambdas=[1.2, 1.0])
    assert float(ref["w"][0]) == 0.0 and float(out["w"][0]) != 0.0
    assert int(compare.ulp_distance(out["w"], ref["w"]).max()) > 1000
    assert float(compare.scaled_ulp_distance(out["w"], ref["w"], base).max()) <= compare.TOLERANCE_ULP


def test_runner_reports_each_check_before_and_after_it_runs():
    seen = []
    runner = Runner(budget_s=3600, on_update=lambda r: seen.append({n: o.status for n, o in r.outcomes.items()}))
    runner.run("one", lambda out: None)
    runner.run("two", lambda out: out.require(False, "no"))
    runner.run("late", lambda out: None, needs_s=7200)
    assert seen == [
        {"one": "running"},
        {"one": "pass"},
        {"one": "pass", "two": "running"},
        {"one": "pass", "two": "fail"},
        {"one": "pass", "two": "fail", "late": "skipped"},
    ]


def test_the_report_is_written_as_it_goes_and_a_stopped_run_still_reports(tmp_path, monkeypatch, capsys):
    """The JSON on disk after each check holds every check so far; a stop (SIGTERM's SystemExit, Ctrl-C) in a
    check marks it, the run as not finished, and the report is still written and printed."""
    import gpu_check

    path = tmp_path / "report.json"
    on_disk = []

    def fake_run_all(args, runner, device, sizes):
        runner.run("first", lambda out: out.result.update(seconds=0.5))
        on_disk.append(json.loads(path.read_text()))

        def second(out):
            on_disk.append(json.loads(path.read_text()))
            raise SystemExit(143)

        runner.run("second", second)
        runner.run("never", lambda out: None)

    monkeypatch.setattr(gpu_check, "run_all", fake_run_all)
    monkeypatch.setattr(gpu_check.bench_merge, "git_state", lambda: "test")
    code = gpu_check.main(["--device", "cpu", "--small", "--json", str(path)])
    assert code == 130
    assert on_disk[0]["checks"]["first"]["status"] == "pass" and on_disk[0]["finished"] is False
    assert on_disk[1]["checks"]["second"]["status"] == "running"  # a kill -9 here leaves this report
    data = json.loads(path.read_text())
    assert list(data["checks"]) == ["first", "second"] and data["finished"] is False
    assert data["checks"]["second"]["status"] == "error" and "stopped" in data["checks"]["second"]["reason"]
    assert data["meta"]["stopped"] == "SystemExit 143"
    out = capsys.readouterr().out
    assert "STOPPED" in out and out.rstrip().splitlines()[-1] == path.read_text().strip()


def test_on_cuda_the_targets_merges_run_first_and_no_compile_rows(monkeypatch):
    """The order a CUDA run takes (its checks stubbed: no GPU here): the whole-model merges, TIES and DARE-TIES
    among them, and the same as a search's candidates, before the probe, the single tensors and the slower extras;
    no compile=True rows (the device kernels merge either way)."""
    import gpu_check
    from gpu_checks import baselines, extras, merges

    names = []

    class FakeRunner(Runner):
        def run(self, name, fn, needs_s=0.0):
            names.append(name)
            return super().run(name, fn if name == "inputs" else lambda out: None)

    class FakeSetup:
        keys = ["w"]

    monkeypatch.setattr(merges.Setup, "make", classmethod(lambda cls, *a, **k: FakeSetup()))
    monkeypatch.setattr(gpu_check.bench_merge, "sync", lambda device: None)
    args = gpu_check.parse(["--device", "cuda"])
    gpu_check.run_all(args, FakeRunner(3600), torch.device("cuda"), gpu_check.inputs.sizes_for(None, False))
    assert not [n for n in names if "compile" in n]
    assert names[:9] == ["device", "inputs", "floor", *(f"{m} model" for m in MERGES)]
    assert names[9:] == [
        *(f"{m} candidate" for m in MERGES),
        "probe",
        *(f"{m} tensor" for m in MERGES),
        "plain RAM",
        "plain TIES",
        "cuda tests",
        "peft",
        "distributed",
        "vllm",
    ]
    assert baselines and extras  # (the real checks, not run here)


def test_kernel_time_names_the_kernel_or_the_host():
    from gpu_checks import timing

    class Event:
        def __init__(self, key, device_type, us, count):
            self.key, self.device_type, self.self_device_time_total, self.count = key, device_type, us, count

    events = [
        Event("ram_merge_kernel", "DeviceType.CUDA", 900.0, 338),
        Event("aten::empty", "DeviceType.CPU", 5000.0, 10),
        Event("Memset (Device)", "DeviceType.CUDA", 100.0, 2),
    ]
    table = timing.kernel_table(events)
    assert table["kernel_s"] == pytest.approx(1e-3) and table["launches"] == 340
    assert table["top"][0] == ["ram_merge_kernel", 0.0009, 338]
    assert timing.busy_time(lambda: None, torch.device("cpu")) is None
    assert timing.verdict(1.0, 0.5, floor_s=1.0, target=1.5) == "met"
    assert timing.verdict(2.0, 1.9, floor_s=1.0, target=1.5) == "kernel"
    assert timing.verdict(2.0, 1.1, floor_s=1.0, target=1.5) == "host"
    assert timing.verdict(2.0, None, floor_s=1.0, target=1.5) == "unknown"
    assert timing.verdict(2.0, 1.1, floor_s=None, target=1.5) == "unknown"


def test_the_model_is_qwen2_5_1_5b_shaped():
    from gpu_checks import inputs

    sizes = inputs.sizes_for(None, False)
    with torch.device("meta"):
        model = inputs.QwenShaped(sizes)
    params = list(model.parameters())
    assert len(params) == 338 and sum(p.numel() < 65536 for p in params) == 141
    assert sum(p.numel() for p in params) == sizes.params == 1_543_714_304
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert set(inputs.SUBSET) <= set(dict(model.named_parameters()))
