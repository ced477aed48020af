"""GPU readiness: one command that measures and checks every CUDA path of ram_live, and reports every failure.

    python benchmarks/gpu_check.py                         # CUDA, Qwen2.5-1.5B-shaped bf16 model, K = 3 (< 5 min)
    python benchmarks/gpu_check.py --device cpu --small    # the same checks on CPU at tiny sizes (the test's run)
    python benchmarks/gpu_check.py --json gpu.json --params 500000000

What it runs, in order, each check caught on its own (a traceback in the JSON, the script goes on) and skipped once
the time budget (``--budget``, 270 s) is spent: the device (name, memory, versions); the copy floor (``copy_`` of
every input into an output-sized destination, ``bench_merge.copy_bandwidth``); RAM, RAM+, curvature-aware RAM, TA,
TIES and DARE-TIES on a live bf16 Qwen2.5-1.5B-shaped model built on the device (``gpu_checks.inputs``: 338 tensors,
141 of them small): best time as x the floor, on CUDA the GPU's busy time beside it (a missed target names the
kernels or the host: ``bound_by``), peak extra memory against the output, and the result against the CPU's on a
subset of tensors and against a float64 reference (``gpu_checks.compare``); each as a search's candidate, merged
into the search's reused output (``gpu_checks.candidates``: the time a search pays per candidate); the probe (warmed
up, then timed); each method on one 4096 x 4096 tensor (the kernels' own speed); the obvious torch code on the same
model; the ``cuda``-marked tests a first run must see; a PEFT adapter merge; the distributed merge (NCCL, or gloo on
CPU). On CUDA the device kernels merge whether ``compile=True`` or not, so the ``compile=True`` rows run off CUDA
only (the RAM tensor row checks that ``compile=True`` takes the device kernels). Prints a table and one JSON line;
the JSON report (``--json``, default benchmarks/results/gpu_check.json) is rewritten after every check, so that a
stopped run still reports what it measured and the check it was in. Exits 1 if a check failed. Targets and
tolerances: docs/performance.md, "GPU readiness". Nothing is downloaded: the script runs the working tree's
ram_live, and a check whose optional library (PEFT, transformers) is missing is skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the benchmarks' helpers, and the working tree's ram_live

import bench_merge  # noqa: E402
import torch  # noqa: E402
from gpu_checks import baselines, extras, inputs, merges  # noqa: E402
from gpu_checks.candidates import check_candidate  # noqa: E402
from gpu_checks.runner import Outcome, Runner, Skip  # noqa: E402
from gpu_checks.vllm import check_vllm  # noqa: E402

BUDGET_S = 270.0
#: Caps on the subprocess checks, so that a hang (e.g. NCCL) cannot take the whole budget.
DIST_TIMEOUT_S = 60.0
TESTS_TIMEOUT_S = 60.0
DEFAULT_JSON = HERE / "results" / "gpu_check.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny sizes (CI; the CPU test)")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"the JSON report (default {DEFAULT_JSON})")
    ap.add_argument("--params", type=float, help="model size in parameters (default Qwen2.5-1.5B's layers)")
    ap.add_argument("--reps", type=int, help="timed runs per merge, best reported (default 2; --small 1)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which checks are skipped")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile=True merges")
    ap.add_argument(
        "--threads",
        type=int,
        help="torch's CPU threads (default: torch's; --device cpu --small: 1, "
        "since tiny tensors on a busy shared host spend their time in OpenMP hand-offs)",
    )
    return ap.parse_args(argv)


def make_meta(args: argparse.Namespace, device: torch.device, sizes: inputs.Sizes) -> dict[str, Any]:
    return {
        "device": str(device),
        "small": args.small,
        "params": sizes.params,
        "hidden": sizes.hidden,
        "layers": sizes.layers,
        "k": 3,
        "threads": torch.get_num_threads(),
        "git": bench_merge.git_state(),
    }


def run_all(args: argparse.Namespace, runner: Runner, device: torch.device, sizes: inputs.Sizes) -> None:
    """Every check, in order, under the runner's time budget: the merges the issue's targets name first (TIES and
    DARE-TIES among them), then the probe and the single tensors, then the slower extras."""
    bench_merge._idle.update(max_wait=0.0, budget=0.0, retries=0)  # no waiting for an idle CPU between runs
    cuda = device.type == "cuda"
    dev = runner.run("device", lambda o: _device(device, o))
    if dev.status != "pass":
        return
    holder: dict[str, merges.Setup] = {}

    def setup(o: Outcome) -> None:
        t0 = time.perf_counter()
        holder["s"] = merges.Setup.make(device, sizes, args.reps or (1 if args.small else 2))
        bench_merge.sync(device)
        o.result.update(seconds=time.perf_counter() - t0, params=sizes.params, subset=holder["s"].keys)

    s = holder["s"] if runner.run("inputs", setup).status == "pass" else None
    if s is not None:
        runner.run("floor", lambda o: merges.check_floor(s, o))
        for label in merges.METHODS:
            runner.run(f"{label} model", lambda o, lb=label: merges.check_merge(s, lb, False, args.small, o), 5.0)
        for label in merges.METHODS:  # a search's candidates: the merge into its reused output
            runner.run(f"{label} candidate", lambda o, lb=label: check_candidate(s, lb, args.small, o), 5.0)
        runner.run("probe", lambda o: merges.check_probe(s, o), needs_s=5.0)
        for label in merges.METHODS:
            runner.run(f"{label} tensor", lambda o, lb=label: merges.check_tensor(s, lb, o), needs_s=5.0)
        for label in ("plain RAM", "plain TIES"):  # the obvious torch code, on the same inputs
            runner.run(label, lambda o, lb=label: baselines.check_baseline(s, lb, o), needs_s=10.0)
    runner.run(
        "cuda tests",
        lambda o: extras.check_cuda_tests(device, o, timeout=min(TESTS_TIMEOUT_S, max(30.0, runner.left() - 10))),
        needs_s=30.0,
    )
    runner.run("peft", lambda o: extras.check_peft(device, o), needs_s=10.0)
    runner.run(
        "distributed",
        lambda o: extras.check_distributed(device, o, timeout=min(DIST_TIMEOUT_S, max(30.0, runner.left() - 30))),
        needs_s=30.0,
    )
    if s is not None and not cuda:  # off CUDA, compile=True runs the compiled kernels: rows of their own
        for label in merges.COMPILED:
            runner.run(f"{label} compile", lambda o, lb=label: _compiled(s, lb, args, o), needs_s=60.0)
    holder.clear()
    runner.run("vllm", lambda o: check_vllm(device, o, timeout=max(60.0, runner.left() - 10)), needs_s=120.0)


def _device(device: torch.device, out: Outcome) -> None:
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False (use --device cpu)")
    merges.check_device(device, out)


def _compiled(s: merges.Setup, label: str, args: argparse.Namespace, out: Outcome) -> None:
    if args.no_compile:
        raise Skip("--no-compile")
    merges.check_merge(s, label, True, args.small, out)


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def table(runner: Runner, meta: dict[str, Any]) -> str:
    """The readable report: one row per check."""
    o = runner.outcomes
    dev = o["device"].result if "device" in o else {}
    floor = o["floor"].result if "floor" in o else {}
    lines = [
        (
            f"## GPU readiness ({dev.get('name', meta['device'])}, {_fmt(dev.get('memory_gib'), '.0f')} GiB; "
            f"{meta['params'] / 1e6:,.1f} M bf16 parameters, K = {meta['k']}; git {meta['git']})"
        ),
        "",
        (
            f"copy floor: {_fmt(floor.get('gb_per_s'), '.1f')} GB/s over {_fmt(floor.get('copied_gb'), '.2f')} GB "
            f"moved ({_fmt(floor.get('seconds'), '.4f')} s)"
        ),
        "",
        (
            "| check | status | s | x floor | GPU busy x floor | bound by | kernels | extra peak / output "
            "| vs CPU: max ULP, share differing | vs float64 ULP | targets | note |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, out in o.items():
        r = out.result
        vs = r.get("vs_cpu")
        vs_s = f"{vs['max_ulp']}, {vs['share_differing']:.2e}" if vs else "-"
        ref = r.get("device_vs_float64_ulp")
        targets = ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in out.targets.items() if v is not None) or "-"
        kernels = ", ".join(f"{k} {n}" for k, n in (r.get("kernels") or {}).items()) or "-"
        note = out.reason or "; ".join(out.problems)
        if not note and "first_call_s" in r:
            note = f"first call {r['first_call_s']:.1f} s"
        if not note and r.get("kernels_top"):
            note = "slowest: " + ", ".join(f"{n[:40]} {s * 1e3:.2f} ms x{c}" for n, s, c in r["kernels_top"][:2])
        lines.append(
            f"| {name} | {out.status} | {_fmt(r.get('seconds', out.seconds), '.3f')} | "
            f"{_fmt(r.get('x_floor'))} | {_fmt(r.get('kernel_x_floor'))} | {r.get('bound_by', '-')} | {kernels} | "
            f"{_fmt(r.get('extra_over_output'))} | {vs_s} | "
            f"{_fmt(ref, '.3g')} | {targets} | {note[:160]} |"
        )
    summary = runner.summary()
    lines += [
        "",
        (
            f"{summary['pass']} passed, {summary['fail']} failed, {summary['error']} errors, "
            f"{summary['skipped']} skipped in {runner.elapsed():.1f} s (budget {runner.budget_s:.0f} s)"
            + ("" if "stopped" not in meta else f"; STOPPED ({meta['stopped']})")
        ),
    ]
    return "\n".join(lines)


def report(runner: Runner, meta: dict[str, Any], finished: bool = True) -> dict[str, Any]:
    """The JSON report: meta, every check's outcome so far (in the order they ran), the summary, and whether the
    run finished (False in the reports written while it runs, and after a stop)."""
    return {
        "meta": meta,
        "checks": {n: o.to_dict() for n, o in runner.outcomes.items()},
        "summary": runner.summary(),
        "elapsed_s": runner.elapsed(),
        "budget_s": runner.budget_s,
        "finished": finished,
    }


def _jsonable(x: Any) -> Any:
    """``x`` with every non-finite float as a string ("inf", "nan"): strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_report(path: Path, data: dict[str, Any]) -> str:
    """``data`` as one line of strict JSON, written to ``path`` whole (a temporary file renamed over it, flushed to
    disk: a reader never sees half a report, a stop keeps the last one); returns the line."""
    line = json.dumps(_jsonable(data), default=str, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return line


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # a timeout's SIGTERM: the runner records the check it cut, main reports


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    sizes = inputs.sizes_for(int(args.params) if args.params else None, args.small)
    threads = args.threads or (1 if args.small and device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    meta = make_meta(args, device, sizes)
    runner = Runner(args.budget, on_update=lambda r: write_report(args.json, report(r, meta, finished=False)))
    previous = signal.signal(signal.SIGTERM, _stop)
    stopped = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*jit.script.*")
            run_all(args, runner, device, sizes)
    except (KeyboardInterrupt, SystemExit) as exc:
        stopped = f"{type(exc).__name__}{f' {exc}' if str(exc) else ''}"
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped:
        meta["stopped"] = stopped
    data = report(runner, meta, finished=stopped is None)
    print(table(runner, meta))
    line = write_report(args.json, data)
    print(line)
    if stopped:
        return 130
    return 0 if data["summary"]["fail"] == 0 and data["summary"]["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
