"""Speed and memory of ram_live's RAM, RAM+ and probe on a ~134 M-parameter bf16 model, K = 2, 3, 5, 8 agents.

    bash scripts/bench.sh                        # the full run (CPU; ~7 min on 2 idle cores)
    bash scripts/bench.sh --quick                # small sizes, K = 2, 3, no mergekit (< 1 min on idle cores)
    bash scripts/bench.sh --json out.json        # also write every number as JSON
    bash scripts/bench.sh --device cuda          # GPU run: floor = HBM copy bandwidth, peak = CUDA allocator
    bash scripts/bench.sh --compile              # also RAM / RAM+ with compile=True (torch.compile-fused)
    bash scripts/bench.sh --profile 3 8          # only: cProfile + torch.profiler of one RAM merge per K
    bash scripts/bench.sh --profile 3 8 --profile-variant ram_plus

What is measured
----------------
Inputs: a base and K agents as state dicts of bf16 tensors shaped like one Llama-style block plus embeddings
and head (``model_specs``; 134.25 M parameters), built in memory from fixed seeds. Agent t changes a random
share ``DENSITIES[t]`` of every tensor (3 %, 46 %, 54 %, 10 %, 25 %, 35 %, 60 %, 5 %: the paper's three agents,
then more), masks independent across agents (so entries updated by 0, 1 or several agents all occur). A changed
entry moves by at least max(|w|/64, 1e-4): it survives bf16 rounding and its stored delta is > 1e-5, so every
changed entry is "active" for the paper's rule and every other entry has delta exactly 0.

* floor: the bytes RAM has to move, (K + 1) inputs read + 1 output written, at the bandwidth of ``dst.copy_(src)``
  measured in the same run over the same tensors into a pre-touched destination (best of 3), on CPU with
  torch's intra-op threads set to the merge's own thread count (``_host.merge_workers()``, ram_live's
  ``default_workers``) for the copy, so the floor moves the bytes with the merge's parallelism. Every heading
  names the CPU (``_host.cpu_label()``: model name, AVX-512 / AVX2). Also printed: the
  time to write one *new* output (allocation + first-touch page faults, which a merge returning a fresh state
  dict pays too, and which the floor leaves out).
* RAM (``merge(..., method="ram")``), RAM+ (``variant="ram_plus"``, global rho; into a state dict it
  reads the inputs once: the merge counts and records who alone changed what, then lambda is applied from the
  base and the output) and ``probe``: wall time of the call from state dicts to the returned state dict /
  report, best of ``--reps``, each call on a collected heap trimmed by ``malloc_trim(0)`` (so that it faults
  its new output in, as a merge in a fresh process does); each as a multiple of the floor. Also RAM+ with
  ``statistics=`` the counts of its own run (the merge pass alone, as in a sweep over r), and RAM+ / RAM if both
  ran at the floor (:func:`ramplus_bounds`: neither exact global-rho design gets under 1.35 x there).
  Then ``--reps`` interleaved RAM / RAM+ pairs (order alternating, each output freed before the next call): the
  median of RAM+ / RAM over the pairs and of RAM+ - RAM, steadier than the ratio of the two best times, since
  RAM's own time swings with the new output's page faults.
* in place: ``--reps`` interleaved RAM / RAM+ pairs with ``inplace=True`` into a module holding a copy of the
  base (copied back before each call, untimed). No new output is faulted in, and RAM reads the inputs twice too
  (bad input must be found before the base is touched), so RAM+ takes its counts from that same first pass.
* mergekit 0.1.5's ``ram`` called per tensor (``benchmarks/mergekit_ram_worker.py`` in
  ``benchmarks/.venv-mergekit``, a subprocess; only its merge calls are timed) on the same tensors, written
  to a temporary folder: with ``--dtype float32`` (float32 compute, as ram_live) and mergekit's default
  (bf16 compute). The float32 result is compared with ram_live's (max |diff|, and bit-equality after rounding
  to bf16).
* extra peak memory of each merge over its inputs, each (method, K) in a fresh process: inputs built, then the
  peak-RSS counter reset (``/proc/self/clear_refs``), RSS recorded, merge, ``VmHWM`` minus that baseline (also
  a 1 ms RSS sampler as a second opinion). With ``--device cuda``: ``torch.cuda.max_memory_allocated`` minus
  the allocation before the merge. Target: extra <= output bytes + 2 x largest tensor bytes.

Targets (PASS/FAIL): RAM <= 10x floor; RAM >= 30x faster than mergekit's ram; RAM+ <= 1.3x RAM; extra peak
memory <= output + 2 x largest tensor.

Shared machines: other processes on the CPUs slow torch's small ops many-fold (OpenMP threads oversubscribed),
so every timed run records the share of the CPUs that *other* processes used meanwhile (from /proc/stat), waits
first for them to go quiet (``--idle-wait``), and is retried while its best run was contended. The table prints
that share next to each timing: treat numbers with a high share as upper bounds.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from _host import cpu_label, merge_workers

if TYPE_CHECKING:
    from typing_extensions import Self

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "benchmarks" / "mergekit_ram_worker.py"
MERGEKIT_PY = ROOT / "benchmarks" / ".venv-mergekit" / "bin" / "python"

#: Agent t's share of changed entries (per tensor): the paper's three agents, then more.
DENSITIES = (0.03, 0.46, 0.54, 0.10, 0.25, 0.35, 0.60, 0.05)
#: Offset (elements) between the agents' windows into a tensor's shared random streams.
PAD = 7919
SEED = 1234
TARGET_FLOOR = 10.0
TARGET_MERGEKIT = 30.0
TARGET_RAMPLUS = 1.3

# --------------------------------------------------------------------------------------------- inputs


SIZES = {"full": (4096, 8192, 1024, 2048), "quick": (512, 2048, 128, 1024), "tiny": (64, 128, 16, 128)}


def model_specs(quick: bool | str = False) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes: embeddings, one Llama-style block (biased q/k/v), final norm, untied head.

    Full: hidden 4096, vocab 8192, kv 1024, mlp 2048 -> 134,254,592 parameters, largest tensor 8192 x 4096.
    Quick: hidden 512, vocab 2048, kv 128, mlp 1024 -> 4.3 M. Tiny (warm-up only): 0.05 M.
    """
    size = quick if isinstance(quick, str) else ("quick" if quick else "full")
    h, v, kv, inter = SIZES[size]
    layer = "model.layers.0."
    return [
        ("model.embed_tokens.weight", (v, h)),
        (layer + "input_layernorm.weight", (h,)),
        (layer + "self_attn.q_proj.weight", (h, h)),
        (layer + "self_attn.q_proj.bias", (h,)),
        (layer + "self_attn.k_proj.weight", (kv, h)),
        (layer + "self_attn.k_proj.bias", (kv,)),
        (layer + "self_attn.v_proj.weight", (kv, h)),
        (layer + "self_attn.v_proj.bias", (kv,)),
        (layer + "self_attn.o_proj.weight", (h, h)),
        (layer + "post_attention_layernorm.weight", (h,)),
        (layer + "mlp.gate_proj.weight", (inter, h)),
        (layer + "mlp.up_proj.weight", (inter, h)),
        (layer + "mlp.down_proj.weight", (h, inter)),
        ("model.norm.weight", (h,)),
        ("lm_head.weight", (v, h)),
    ]


def build_inputs(
    quick: bool | str, k: int, seed: int = SEED
) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The bf16 base and ``k`` agents. Agent t is the same tensor for every k (prefix-stable), and the same in
    every process, so a fresh measurement process rebuilds exactly what the timing process merged."""
    if k > len(DENSITIES):
        raise SystemExit(f"at most {len(DENSITIES)} agents (DENSITIES has {len(DENSITIES)} entries)")
    base: dict[str, torch.Tensor] = {}
    agents: list[dict[str, torch.Tensor]] = [{} for _ in range(k)]
    for index, (name, shape) in enumerate(model_specs(quick)):
        n = math.prod(shape)
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        w = torch.randn(n, generator=g)
        if len(shape) == 1 and "norm" in name:
            w.mul_(0.05).add_(1.0)
        else:
            w.mul_(0.02)
        wb = w.to(torch.bfloat16)
        w = wb.float()
        # Random streams shared by all agents of this tensor; agent t reads the window [t*PAD, t*PAD + n):
        # at any one position the agents read different draws, so their masks are independent.
        span = n + len(DENSITIES) * PAD
        u = torch.rand(span, generator=g)
        z = torch.randn(span, generator=g)
        z = torch.where(z >= 0, z + 0.5, z - 0.5)  # |z| >= 0.5
        step = w.abs().div_(32.0).clamp_(min=2e-4)  # |delta| >= max(|w|/64, 1e-4) > 1 bf16 ULP of w, > 1e-5
        for t in range(k):
            window = slice(t * PAD, t * PAD + n)
            moved = torch.addcmul(w, z[window], step).to(torch.bfloat16)
            agents[t][name] = torch.where(u[window] < DENSITIES[t], moved, wb).view(shape)
            del moved
        base[name] = wb.view(shape)
        del w, u, z, step
    return base, agents


def nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


# --------------------------------------------------------------------------------------------- helpers


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(sd: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return sd if device.type == "cpu" else {k: v.to(device) for k, v in sd.items()}


def cpu_busy_seconds() -> float:
    """CPU seconds all processes on this machine spent busy so far (from /proc/stat; 0 if unreadable)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Contention:
    """Share of the machine's CPUs that *other* processes used while the block ran (0 = an idle machine)."""

    def __enter__(self) -> Self:
        self.busy0, self.own0, self.t0 = cpu_busy_seconds(), own_cpu_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        others = (cpu_busy_seconds() - self.busy0) - (own_cpu_seconds() - self.own0)
        self.share = max(0.0, others / (wall * (os.cpu_count() or 1)))


#: A timed run during which other processes used more than this share of the CPUs is "contended": while the
#: best run is, ``timed`` tries again (oversubscribed OpenMP threads slow small torch ops many-fold), at most
#: ``RETRIES`` extra runs and not after ``RETRY_SECONDS`` spent on one measurement.
CONTENDED = 0.15
RETRIES = 2
RETRY_SECONDS = 45.0
#: Before each timed run, wait (at most ``IDLE_WAIT`` s; at most ``IDLE_BUDGET`` s over the whole benchmark)
#: until other processes use under :data:`CONTENDED` of the CPUs. ``--idle-wait 0`` turns this off.
IDLE_WAIT = 60.0
IDLE_BUDGET = 300.0
_idle = {"max_wait": IDLE_WAIT, "budget": IDLE_BUDGET, "waited": 0.0, "retries": RETRIES}


def wait_for_idle(window: float = 0.5) -> float:
    """Sleep until others' CPU share over ``window`` seconds is under :data:`CONTENDED`; returns seconds waited."""
    t0 = time.perf_counter()
    limit = min(_idle["max_wait"], _idle["budget"] - _idle["waited"])
    while limit > 0:
        with Contention() as c:
            time.sleep(window)
        if c.share <= CONTENDED or time.perf_counter() - t0 >= limit:
            break
    waited = time.perf_counter() - t0 if limit > 0 else 0.0
    _idle["waited"] += waited
    return waited


def timed(
    fn: Callable[[], Any], reps: int, device: torch.device, keep_last: bool = False
) -> tuple[list[float], Any, float]:
    """Wall seconds of ``fn()`` ``reps`` times (output freed between runs, the last kept when ``keep_last``);
    returns (times, last output, others' CPU share during the fastest run). While the fastest run was
    contended (see :data:`CONTENDED`), runs again."""
    times: list[float] = []
    shares: list[float] = []
    out = None
    r = 0
    start = time.perf_counter()
    while r < reps or (
        r < reps + _idle["retries"]
        and time.perf_counter() - start < RETRY_SECONDS
        and shares[times.index(min(times))] > CONTENDED
    ):
        out = None
        seconds, out, share = timed_once(fn, device)
        times.append(seconds)
        shares.append(share)
        r += 1
        if not keep_last:
            out = None
    return times, out, shares[times.index(min(times))]


def timed_once(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any, float]:
    """One call of ``fn`` on a collected and trimmed heap and an idle machine: (wall seconds, its output, others'
    CPU share). ``malloc_trim`` hands freed heap pages back to the kernel, so every call faults its new output in
    as a merge in a fresh process does; without it a call now and then got pages an earlier output had already
    faulted in and ran up to ~40 ms faster at 134 M parameters (RAM's best-of-4 then came out below RAM+ with
    reused counts, which does the same work plus λ)."""
    gc.collect()
    if device.type == "cpu":
        malloc_trim()
    sync(device)
    wait_for_idle()
    with Contention() as c:
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        seconds = time.perf_counter() - t0
    return seconds, out, c.share


def copy_bandwidth(
    srcs: list[dict[str, torch.Tensor]], dst: dict[str, torch.Tensor], device: torch.device, reps: int = 3
) -> tuple[float, float]:
    """Bytes/s of ``dst[key].copy_(src[key])`` over every key of every source (read + write counted); the
    destination is pre-touched by the first repetition. On CPU torch's intra-op threads (which ``copy_`` splits
    its work among) are the merge's workers during the copy. Returns (best bandwidth, best seconds)."""
    moved = 2 * sum(nbytes(s) for s in srcs)
    best = math.inf
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(merge_workers())
    try:
        for _ in range(reps):
            sync(device)
            wait_for_idle()
            t0 = time.perf_counter()
            for s in srcs:
                for key, d in dst.items():
                    d.copy_(s[key])
            sync(device)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return moved / best, best


def paired(
    first: Callable[[], Any],
    second: Callable[[], Any],
    reps: int,
    device: torch.device,
    before: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    """``reps`` pairs of runs, the order alternating and each output freed before the next run, so that both
    calls of a pair meet the same allocator and page-fault state: their ratio and difference are steadier than
    the ratio of two separate best-of series. ``before``: called (untimed) before every run."""
    a: list[float] = []
    b: list[float] = []
    for i in range(reps):
        for fn, times in ((first, a), (second, b)) if i % 2 == 0 else ((second, b), (first, a)):
            if before is not None:
                before()
            times.append(timed_once(fn, device)[0])  # the output is dropped before the next call
    return a, b


def inplace_target(
    base: dict[str, torch.Tensor], agents: list[dict[str, torch.Tensor]]
) -> tuple[torch.nn.Module, list[dict[str, torch.Tensor]], Callable[[], None]]:
    """A module holding a copy of ``base`` (its keys under ``p.``, dots as ``_``), the agents keyed to match, and
    a function that copies the base back into the module: for merges with ``inplace=True``, which write into
    memory that is already there (no new output to fault in)."""
    name = {key: key.replace(".", "_") for key in base}
    module = torch.nn.Module()
    module.p = torch.nn.ParameterDict(
        {name[key]: torch.nn.Parameter(t.clone(), requires_grad=False) for key, t in base.items()}
    )
    named = [{f"p.{name[key]}": t for key, t in agent.items()} for agent in agents]

    def restore() -> None:
        with torch.no_grad():
            for key, t in base.items():
                module.p[name[key]].copy_(t)

    return module, named, restore


def fresh_output_seconds(base: dict[str, torch.Tensor], device: torch.device, reps: int = 3) -> float:
    """Best seconds to allocate a new output-sized state dict and write it once (``copy_`` from the base): the
    floor's copy plus the first-touch page faults (CPU) that a merge returning a new state dict also pays."""
    best = math.inf
    for _ in range(reps):
        gc.collect()
        sync(device)
        wait_for_idle()
        t0 = time.perf_counter()
        out = {k: torch.empty_like(v).copy_(v) for k, v in base.items()}
        sync(device)
        best = min(best, time.perf_counter() - t0)
        del out
    return best


def rss_bytes(anon: bool = False) -> int:
    """Resident set size; ``anon=True``: minus the file-backed/shared pages (code of libraries, mappings)."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    pages = int(fields[1]) - (int(fields[2]) if anon else 0)
    return pages * os.sysconf("SC_PAGE_SIZE")


def vm_hwm_bytes() -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+)\s+kB", text)
    return int(m.group(1)) * 1024 if m else None


def reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM, ru_maxrss) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class RssSampler(threading.Thread):
    """Samples anonymous RSS every ``interval`` seconds; ``peak`` is the highest seen."""

    def __init__(self, interval: float = 0.001) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = rss_bytes(anon=True)
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, rss_bytes(anon=True))
            time.sleep(self.interval)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, rss_bytes(anon=True))
        return self.peak


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def fmt_mb(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:,.0f}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def git_state() -> str:
    """The commit benchmarked, and whether ram_live/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            cwd=str(ROOT),
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "ram_live"],
            check=False,
            capture_output=True,
            text=True,
            cwd=str(ROOT),
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes in ram_live/" if dirty else "")


# --------------------------------------------------------------------------------------------- methods


def run_method(
    method: str, agents: list[dict[str, torch.Tensor]], base: dict[str, torch.Tensor], **options: Any
) -> Any:
    import ram_live

    if method == "ram":
        return ram_live.merge(agents, base=base, method="ram", return_info=True, **options)
    if method == "ram_plus":
        return ram_live.merge(agents, base=base, method="ram_plus", return_info=True, **options)
    if method == "probe":
        return ram_live.probe(agents, base=base)
    raise ValueError(method)


METHODS = ("ram", "ram_plus", "probe")


def ramplus_bounds(k: int) -> tuple[float, float]:
    """RAM+ / RAM if every pass ran at memory bandwidth, in bytes per bf16 parameter, for global rho's two designs.
    RAM reads K + 1 inputs and writes the output: 2K + 4. lambda is known only after the last entry is read, so
    RAM+ adds either a second read of the inputs (two passes: 2K + 2) or, reading once, the owner map written and
    read back (2 x plane_count(K) / 8) plus a pass that reads the base and the output and writes the output (6).

    >>> [round(b, 2) for b in ramplus_bounds(2)], [round(b, 2) for b in ramplus_bounds(8)]
    ([1.75, 1.81], [1.9, 1.35])
    """
    from ram_live.methods.ram.native import plane_count

    ram = 2 * k + 4
    return (ram + 2 * k + 2) / ram, (ram + 6 + plane_count(k) / 4) / ram


# --------------------------------------------------------------------------------------------- memory child


def memory_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build the inputs, reset the peak counters, merge once, report the extra peak.

    The same method first runs once on a tiny model, so that the code pages of the libraries it runs (RSS too)
    and one-time allocations (thread pools) are in the baseline, not in the merge's extra memory.
    """
    import ram_live  # noqa: F401  (imported before the baseline: its import is not the merge's memory)

    device = torch.device(spec["device"])
    tiny_base, tiny_agents = build_inputs("tiny", spec["k"])
    run_method(spec["method"], [to_device(a, device) for a in tiny_agents], to_device(tiny_base, device))
    del tiny_base, tiny_agents
    base, agents = build_inputs(spec["quick"], spec["k"])
    base, agents = to_device(base, device), [to_device(a, device) for a in agents]
    largest = max(t.numel() * t.element_size() for t in base.values())
    gc.collect()
    malloc_trim()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.memory_allocated(device)
    hwm_ok = reset_hwm()
    baseline = rss_bytes()
    baseline_anon = rss_bytes(anon=True)
    sampler = RssSampler()
    sampler.start()
    t0 = time.perf_counter()
    result = run_method(spec["method"], agents, base)
    sync(device)
    seconds = time.perf_counter() - t0
    sampled_peak = sampler.stop()
    hwm = vm_hwm_bytes() if hwm_ok else None
    out = result[0] if isinstance(result, tuple) else None
    output_bytes = nbytes(out) if isinstance(out, dict) else 0
    report: dict[str, Any] = {
        "method": spec["method"],
        "k": spec["k"],
        "device": str(device),
        "seconds": seconds,
        "baseline_rss": baseline,
        "extra_hwm": None if hwm is None else hwm - baseline,
        "extra_sampled": sampled_peak - baseline_anon,
        "hwm_reset": hwm_ok,
        "output_bytes": output_bytes,
        "largest_tensor_bytes": largest,
        "input_bytes": nbytes(base) + sum(nbytes(a) for a in agents),
    }
    if device.type == "cuda":
        report["extra_cuda"] = torch.cuda.max_memory_allocated(device) - cuda_before
    return report


def measure_memory(method: str, k: int, quick: bool, device: str) -> dict[str, Any]:
    spec = json.dumps({"method": method, "k": k, "quick": quick, "device": device})
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--_memory-child", spec],
        check=False,
        capture_output=True,
        text=True,
        cwd=str(ROOT),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory child ({method}, K={k}) failed:\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    extra = (
        report["extra_cuda"]
        if device.startswith("cuda")
        else (report["extra_hwm"] if report["extra_hwm"] is not None else report["extra_sampled"])
    )
    report["extra"] = extra
    # Target: output + 2 x largest tensor (for the probe, whose output is a report, just 2 x largest).
    report["target"] = report["output_bytes"] + 2 * report["largest_tensor_bytes"]
    report["pass"] = extra <= report["target"]
    return report


# --------------------------------------------------------------------------------------------- mergekit


def mergekit_available() -> tuple[bool, str]:
    if not MERGEKIT_PY.exists():
        return False, f"{MERGEKIT_PY.relative_to(ROOT)} missing (build it: bash benchmarks/mergekit_env.sh)"
    proc = subprocess.run(
        [str(MERGEKIT_PY), "-c", "import mergekit.merge_methods.ram"], check=False, capture_output=True, text=True
    )
    if proc.returncode != 0:
        return False, f"mergekit not importable in {MERGEKIT_PY.parent.parent}: {proc.stderr.strip()[-300:]}"
    return True, "mergekit 0.1.5 env found"


def save_inputs(folder: Path, base: dict[str, torch.Tensor], agents: list[dict[str, torch.Tensor]]) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in base.items()}, str(folder / "base.safetensors"))
    for i, a in enumerate(agents):
        save_file({k: v.contiguous() for k, v in a.items()}, str(folder / f"agent_{i}.safetensors"))


def link_inputs(master: Path, folder: Path, k: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = ["base.safetensors"] + [f"agent_{i}.safetensors" for i in range(k)]
    for name in names:
        (folder / name).symlink_to(master / name)


def run_mergekit(inputs: Path, dtype: str, save: Path | None, reps: int, tries: int = 3) -> dict[str, Any]:
    """mergekit's ram on ``inputs`` in its own env; run again (at most ``tries`` in all) while the fastest run so
    far was contended, and keep the fastest. ``others_cpu``: others' CPU share during that run."""
    best: dict[str, Any] | None = None
    for _ in range(tries):
        wait_for_idle()
        with Contention() as c:
            result = _run_mergekit_once(inputs, dtype, save, reps)
        result["others_cpu"] = c.share
        if best is None or result["seconds"] < best["seconds"]:
            best = result
        if best["others_cpu"] <= CONTENDED:
            break
    assert best is not None
    return best


def _run_mergekit_once(inputs: Path, dtype: str, save: Path | None, reps: int) -> dict[str, Any]:
    out = inputs / f"mergekit-{dtype}.json"
    cmd = [
        str(MERGEKIT_PY),
        str(WORKER),
        "--inputs",
        str(inputs),
        "--out",
        str(out),
        "--variant",
        "ram",
        "--dtype",
        dtype,
        "--repeat",
        str(reps),
    ]
    if save is not None:
        cmd += ["--save", str(save)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=str(ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"mergekit worker failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_with_loading"] = time.perf_counter() - t0
    return result


def compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """max |ours - theirs| (float64) and the count of entries that differ once both are rounded to ours' dtype."""
    max_diff, differ, total = 0.0, 0, 0
    for key, a in ours.items():
        b = theirs[key].to(a.device)
        max_diff = max(max_diff, float((a.double() - b.double()).abs().max()))
        differ += int((a != b.to(a.dtype)).sum())
        total += a.numel()
    return {"max_abs_diff": max_diff, "differ_after_rounding": differ, "numel": total}


# --------------------------------------------------------------------------------------------- profile


def profile(ks: list[int], quick: bool, device: torch.device, variant: str, top: int) -> None:
    """One ``merge`` per K under cProfile (every thread: ram_live shares a tensor's chunks among worker
    threads on CPU; C calls such as ``torch.sub`` show each op's time), then under torch.profiler with
    ``workers=1`` (torch.profiler records the calling thread's ops only)."""
    import cProfile
    import inspect
    import io
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    import ram_live

    max_k = max(ks)
    base, agents = build_inputs(quick, max_k)
    base, agents = to_device(base, device), [to_device(a, device) for a in agents]
    one_thread = {"workers": 1} if "workers" in inspect.signature(ram_live.ram_merge).parameters else {}
    for k in ks:
        subset = agents[:k]

        def fn(subset: list[dict[str, torch.Tensor]] = subset, **kw: Any) -> Any:
            return ram_live.merge(subset, base=base, method=variant, **kw)

        fn()  # warm-up
        plain, _, share_plain = timed_once(fn, device)

        # cProfile in the calling thread and in every thread started while it runs.
        threads: list[cProfile.Profile] = []
        lock = threading.Lock()

        def start_in_thread(*_: Any, threads: list[cProfile.Profile] = threads, lock: Any = lock) -> None:
            p = cProfile.Profile()
            with lock:
                threads.append(p)
            p.enable()  # replaces this hook for the rest of the thread's life

        gc.collect()
        wait_for_idle()
        main_prof = cProfile.Profile()
        with Contention() as c:
            threading.setprofile(start_in_thread)
            t0 = time.perf_counter()
            main_prof.enable()
            try:
                out = fn()
                sync(device)
            finally:
                main_prof.disable()
                threading.setprofile(None)  # type: ignore[arg-type]
            wall = time.perf_counter() - t0
        del out
        stream = io.StringIO()
        stats = pstats.Stats(main_prof, stream=stream)
        for p in threads:
            stats.add(p)
        stats.sort_stats("tottime").print_stats(top)
        print(
            f"\n## cProfile: merge(method={variant!r}), K={k}: {plain:.2f} s without the profiler "
            f"(others' CPU {share_plain:.0%}), {wall:.2f} s under it (others' CPU {c.share:.0%}); main thread + "
            f"{len(threads)} worker threads, times summed over threads, sorted by tottime\n"
        )
        print(stream.getvalue())

        gc.collect()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        wait_for_idle()
        with Contention() as c, torch_profile(activities=activities) as tp:
            t0 = time.perf_counter()
            out = fn(**one_thread)
            sync(device)
            wall = time.perf_counter() - t0
        del out
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(
            f"\n## torch.profiler: merge(method={variant!r}{', workers=1' if one_thread else ''}), K={k}: "
            f"{wall:.2f} s under the profiler (others' CPU {c.share:.0%}; sorted by {sort})\n"
        )
        print(tp.key_averages().table(sort_by=sort, row_limit=top))


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes (3.4 M params), K = 2, 3, no mergekit")
    ap.add_argument("--ks", type=int, nargs="+", help="agent counts (default 2 3 5 8; quick: 2 3)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--reps", type=int, help="timed repetitions per method, best kept (default 2; quick: 3)")
    ap.add_argument("--no-mergekit", action="store_true", help="skip the mergekit column")
    ap.add_argument("--mergekit-max-k", type=int, help="run mergekit only for K up to this (default: all)")
    ap.add_argument(
        "--no-mergekit-bf16",
        action="store_true",
        help="run mergekit with --dtype float32 only (skip its default bf16 compute)",
    )
    ap.add_argument("--mergekit-reps", type=int, default=1, help="mergekit passes per run, best kept (default 1)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument(
        "--eager", action="store_true", help="also time RAM and RAM+ on the torch eager path (native kernels off)"
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also time merge(..., compile=True) for RAM and RAM+ (first call reported apart)",
    )
    ap.add_argument(
        "--idle-wait",
        type=float,
        help=f"before each timed run wait up to this many seconds for other processes to leave the "
        f"CPUs (< {CONTENDED * 100:.0f}%% busy); at most {IDLE_BUDGET:g} s in all (quick: 20 s); "
        f"0: never wait (default {IDLE_WAIT:g}; quick: 2)",
    )
    ap.add_argument("--json", help="write all results to this JSON file")
    ap.add_argument(
        "--profile",
        type=int,
        nargs="+",
        metavar="K",
        help="only profile one merge per K (cProfile + torch.profiler) and exit",
    )
    ap.add_argument("--profile-variant", default="ram", choices=("ram", "ram_plus"))
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--_memory-child", dest="memory_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_child:
        print(json.dumps(memory_child(json.loads(args.memory_child))))
        return 0

    _idle["max_wait"] = args.idle_wait if args.idle_wait is not None else (2.0 if args.quick else IDLE_WAIT)
    if args.quick:
        _idle["budget"], _idle["retries"] = 20.0, 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available in this torch ({torch.__version__})", file=sys.stderr)
        return 2
    if args.profile:
        profile(args.profile, args.quick, device, args.profile_variant, args.profile_top)
        return 0

    ks = args.ks or ([2, 3] if args.quick else [2, 3, 5, 8])
    reps = args.reps or (3 if args.quick else 2)
    use_mergekit, mk_note = (
        (False, "skipped (--no-mergekit)")
        if args.no_mergekit
        else (
            (False, "skipped (--quick)")
            if args.quick
            else (
                (False, "skipped (mergekit's worker runs on CPU; this is a --device cuda run)")
                if device.type == "cuda"
                else mergekit_available()
            )
        )
    )
    mk_max_k = args.mergekit_max_k or max(ks)
    run_start = time.perf_counter()
    load_start = loadavg()

    import ram_live

    specs = model_specs(args.quick)
    n_params = sum(math.prod(s) for _, s in specs)
    print(f"# ram_live merge benchmark ({cpu_label()})\n")
    git = git_state()
    print(
        f"- ram_live {ram_live.__version__} at {git}, torch {torch.__version__}, {torch.get_num_threads()} threads "
        f"(the merge's workers and the copy_ floor's: {merge_workers()}), CPU {cpu_label()} x {os.cpu_count()}"
        + (f", GPU {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
    )
    print(
        f"- model: {len(specs)} bf16 tensors, {n_params:,} parameters "
        f"({n_params * 2 / 2**20:,.0f} MiB per model), largest {max(specs, key=lambda s: math.prod(s[1]))}"
    )
    print(
        f"- agents' densities: {', '.join(f'{d:.0%}' for d in DENSITIES[: max(ks)])}; device {device}; "
        f"best of {reps} runs"
    )
    print(f"- mergekit: {mk_note}")
    sys.stdout.flush()

    t0 = time.perf_counter()
    base_cpu, agents_cpu = build_inputs(args.quick, max(ks))
    print(f"- inputs built in {time.perf_counter() - t0:.1f} s\n")
    base, agents = to_device(base_cpu, device), [to_device(a, device) for a in agents_cpu]
    if device.type != "cpu":
        del base_cpu, agents_cpu
    model_bytes = nbytes(base)
    dst = {k: torch.empty_like(v) for k, v in base.items()}
    _, warm_copy = copy_bandwidth([base], dst, device)
    fresh = fresh_output_seconds(base, device)
    print(
        f"- one {model_bytes / 2**20:,.0f} MiB output: copy_ into a pre-touched one {warm_copy:.3f} s, into a new "
        f"one (alloc + first touch) {fresh:.3f} s; the floor below uses the pre-touched figure\n",
        flush=True,
    )

    tmp = Path(tempfile.mkdtemp(prefix="ram-bench-")) if use_mergekit else None
    master_saved = False
    rows: list[dict[str, Any]] = []
    try:
        for k in ks:
            subset = agents[:k]
            row: dict[str, Any] = {"k": k, "params": n_params, "model_bytes": model_bytes}
            bw, _ = copy_bandwidth([base, *subset], dst, device)
            row["copy_bandwidth"] = bw
            row["floor_bytes"] = (k + 2) * model_bytes
            row["floor"] = row["floor_bytes"] / bw
            print(f"K={k}: copy_ {bw / 1e9:.1f} GB/s -> floor {row['floor']:.3f} s", flush=True)

            times, result, busy = timed(
                lambda subset=subset: run_method("ram", subset, base), reps, device, keep_last=True
            )
            row["ram"], row["ram_all"], row["ram_others_cpu"] = min(times), times, busy
            ram_out = result[0]
            row["kernels"] = result[1].extra.get("kernels")
            result = None
            print(
                f"  ram       {row['ram']:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in times)}; "
                f"others' CPU share in the best run {busy:.0%}; tensors per kernel {row['kernels']})",
                flush=True,
            )

            times, result, busy = timed(
                lambda subset=subset: run_method("ram_plus", subset, base), reps, device, keep_last=True
            )
            row["ram_plus"], row["ram_plus_all"], row["ram_plus_others_cpu"] = min(times), times, busy
            info = result[1]
            row["lambdas"] = info.lambdas
            row["rho"] = {n: (v if math.isfinite(v) else str(v)) for n, v in (info.rho or {}).items()}
            counts = info.statistics
            result = info = None
            print(
                f"  ram_plus  {row['ram_plus']:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in times)}; "
                f"others' CPU {busy:.0%})",
                flush=True,
            )
            # RAM+ with the counts of the run above (statistics=): the merge pass alone, as in a sweep over r
            times, _, busy = timed(
                lambda subset=subset: run_method("ram_plus", subset, base, statistics=counts), reps, device
            )
            row["ram_plus_reused"], row["ram_plus_reused_all"] = min(times), times
            counts = None
            print(
                f"  ram_plus with reused counts {row['ram_plus_reused']:.3f} s  (runs: "
                f"{', '.join(f'{t:.3f}' for t in times)}; others' CPU {busy:.0%})",
                flush=True,
            )

            ram_pair, plus_pair = paired(
                lambda subset=subset: run_method("ram", subset, base),
                lambda subset=subset: run_method("ram_plus", subset, base),
                reps,
                device,
            )
            row["pair_ram_all"], row["pair_ram_plus_all"] = ram_pair, plus_pair
            row["pair_ratio"] = statistics.median(p / r for p, r in zip(plus_pair, ram_pair))
            row["pair_extra"] = statistics.median(p - r for p, r in zip(plus_pair, ram_pair))
            print(
                f"  interleaved RAM / RAM+ pairs: RAM+ / RAM median {row['pair_ratio']:.2f}x, RAM+ - RAM median "
                f"{row['pair_extra'] * 1e3:.0f} ms (RAM {', '.join(f'{t:.3f}' for t in ram_pair)}; RAM+ "
                f"{', '.join(f'{t:.3f}' for t in plus_pair)})",
                flush=True,
            )

            # In place (inplace=True into a module): no new output to fault in, and RAM reads the inputs twice too
            # (bad input must be found before the base is touched), so RAM+ reuses that pass's counts.
            module, named, restore = inplace_target(base, subset)
            ram_pair, plus_pair = paired(
                lambda: run_method("ram", named, module, inplace=True),
                lambda: run_method("ram_plus", named, module, inplace=True),
                reps,
                device,
                before=restore,
            )
            module = named = restore = None
            row["inplace_ram"], row["inplace_ram_plus"] = min(ram_pair), min(plus_pair)
            row["inplace_ram_all"], row["inplace_ram_plus_all"] = ram_pair, plus_pair
            row["inplace_pair_ratio"] = statistics.median(p / r for p, r in zip(plus_pair, ram_pair))
            print(
                f"  in place, interleaved pairs: RAM {row['inplace_ram']:.3f} s, "
                f"RAM+ {row['inplace_ram_plus']:.3f} s (best); RAM+ / RAM median {row['inplace_pair_ratio']:.2f}x",
                flush=True,
            )

            times, report, busy = timed(
                lambda subset=subset: run_method("probe", subset, base), reps, device, keep_last=True
            )
            row["probe"], row["probe_all"], row["probe_others_cpu"] = min(times), times, busy
            row["densities"] = {n: report.agents[n].density for n in report.agent_names}
            row["histogram"] = report.histogram
            report = None
            print(
                f"  probe     {row['probe']:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in times)}; "
                f"others' CPU {busy:.0%})",
                flush=True,
            )
            print(
                f"  measured densities {', '.join(f'{d:.2%}' for d in row['densities'].values())}; "
                f"entries by c=0..K: {', '.join(f'{c / n_params:.1%}' for c in row['histogram'])}",
                flush=True,
            )

            if args.eager:  # the torch-ops path, as where no C compiler is found
                import ram_live.methods.ram.native as native

                saved_kernels, native._KERNELS = native._KERNELS, None
                try:
                    for method in ("ram", "ram_plus"):
                        times, _, busy = timed(
                            lambda subset=subset, method=method: run_method(method, subset, base), reps, device
                        )
                        row[f"{method}_eager"], row[f"{method}_eager_all"] = min(times), times
                        print(f"  {method}, torch eager path: {min(times):.3f} s (others' CPU {busy:.0%})", flush=True)
                finally:
                    native._KERNELS = saved_kernels

            if args.compile:
                for method in ("ram", "ram_plus"):
                    t1 = time.perf_counter()
                    run_method(method, subset, base, compile=True)  # compiles (or loads the compile cache)
                    row[f"{method}_compile_first"] = time.perf_counter() - t1
                    times, _, busy = timed(
                        lambda subset=subset, method=method: run_method(method, subset, base, compile=True),
                        reps,
                        device,
                    )
                    row[f"{method}_compile"], row[f"{method}_compile_all"] = min(times), times
                    row[f"{method}_compile_others_cpu"] = busy
                    print(
                        f"  {method}, compile=True: {min(times):.3f} s (first call "
                        f"{row[f'{method}_compile_first']:.1f} s; others' CPU {busy:.0%})",
                        flush=True,
                    )

            if use_mergekit and k <= mk_max_k:
                assert tmp is not None
                from safetensors.torch import load_file

                master = tmp / "master"
                if not master_saved:
                    t1 = time.perf_counter()
                    save_inputs(master, base_cpu, agents_cpu[: min(mk_max_k, max(ks))])
                    master_saved = True
                    print(f"  (inputs written for mergekit in {time.perf_counter() - t1:.1f} s)", flush=True)
                folder = tmp / f"k{k}"
                link_inputs(master, folder, k)
                saved = folder / "mergekit-float32.safetensors"
                mk = run_mergekit(folder, "float32", saved, args.mergekit_reps)
                row["mergekit_f32"] = mk["seconds"]
                row["mergekit_f32_info"] = mk
                print(
                    f"  mergekit ram float32  {mk['seconds']:.3f} s (merge calls only; "
                    f"{mk['wall_with_loading']:.1f} s with loading; others' CPU {mk['others_cpu']:.0%})",
                    flush=True,
                )
                theirs = load_file(str(saved))
                row["check_bf16"] = compare(ram_out, theirs)
                ram_out = None
                ours32 = ram_live.merge(subset, base=base, method="ram", dtype=torch.float32)
                row["check_f32"] = compare(ours32, theirs)
                del ours32, theirs
                saved.unlink()
                print(
                    f"  check vs mergekit float32: ram (float32 out) max|diff| "
                    f"{row['check_f32']['max_abs_diff']:.3g}; ram (bf16 out) max|diff| "
                    f"{row['check_bf16']['max_abs_diff']:.3g}, {row['check_bf16']['differ_after_rounding']:,} "
                    f"of {row['check_bf16']['numel']:,} differ after rounding to bf16",
                    flush=True,
                )
                if not args.no_mergekit_bf16:
                    mk = run_mergekit(folder, "auto", None, args.mergekit_reps)
                    row["mergekit_bf16"] = mk["seconds"]
                    row["mergekit_bf16_info"] = mk
                    print(
                        f"  mergekit ram bf16     {mk['seconds']:.3f} s (others' CPU {mk['others_cpu']:.0%})",
                        flush=True,
                    )
                shutil.rmtree(folder)
            ram_out = None
            rows.append(row)
            gc.collect()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    del dst
    memory: list[dict[str, Any]] = []
    if not args.no_memory:
        # The timing process' inputs are no longer needed: free them so the children have the memory.
        del base, agents
        base_cpu = agents_cpu = None
        gc.collect()
        print("\nmeasuring peak memory (a fresh process per method and K)...", flush=True)
        for k in ks:
            for method in METHODS:
                m = measure_memory(method, k, args.quick, args.device)
                memory.append(m)
                print(
                    f"  K={k} {method:<9} extra {fmt_mb(m['extra'])} MiB "
                    f"(sampled {fmt_mb(m['extra_sampled'])}), target {fmt_mb(m['target'])} MiB: "
                    f"{verdict(m['pass'])}",
                    flush=True,
                )

    # ----------------------------------------------------------------------------------------- summary
    for row in rows:
        row["ram_x_floor"] = row["ram"] / row["floor"]
        row["ram_plus_x_floor"] = row["ram_plus"] / row["floor"]
        row["ram_plus_x_ram"] = row["ram_plus"] / row["ram"]
        row["ram_plus_reused_x_ram"] = row["ram_plus_reused"] / row["ram"]
        row["two_pass_bound"], row["one_read_bound"] = ramplus_bounds(row["k"])
        row["probe_x_floor"] = row["probe"] / row["floor"]
        row["pass_floor"] = row["ram_x_floor"] <= TARGET_FLOOR
        row["pass_ramplus"] = row["ram_plus_x_ram"] <= TARGET_RAMPLUS
        for dt in ("f32", "bf16"):
            if f"mergekit_{dt}" in row:
                row[f"speedup_{dt}"] = row[f"mergekit_{dt}"] / row["ram"]
                row[f"pass_mergekit_{dt}"] = row[f"speedup_{dt}"] >= TARGET_MERGEKIT

    dev_label = "HBM" if device.type == "cuda" else "RAM"
    print(f"\n## Results ({device}, {cpu_label()}, {n_params / 1e6:.1f} M bf16 params, seconds, best of {reps})\n")
    head = [
        "K",
        f"copy_ GB/s ({dev_label})",
        "floor s",
        "RAM s (x floor)",
        "RAM+ s (x floor, x RAM)",
        "RAM+ reused counts s (x RAM)",
        "RAM+ / RAM interleaved pairs (median; RAM+ - RAM)",
        "RAM+ / RAM at the floor: two passes, one read",
        "in place: RAM s, RAM+ s (pairs: RAM+ / RAM)",
        "probe s (x floor)",
        "mergekit f32 s (RAM speedup)",
        "mergekit bf16 s (RAM speedup)",
        "max|RAM - mk f32|",
        "others' CPU % (RAM/RAM+/probe)",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---:" for _ in head) + "|")
    for r in rows:
        mk32 = f"{r['mergekit_f32']:.2f} ({r['speedup_f32']:.1f}x)" if "mergekit_f32" in r else "n/a"
        mk16 = f"{r['mergekit_bf16']:.2f} ({r['speedup_bf16']:.1f}x)" if "mergekit_bf16" in r else "n/a"
        check = (
            (
                f"{r['check_f32']['max_abs_diff']:.2g} (bf16 out: {r['check_bf16']['max_abs_diff']:.2g}, "
                f"{r['check_bf16']['differ_after_rounding']} differ)"
            )
            if "check_f32" in r
            else "n/a"
        )
        print(
            f"| {r['k']} | {r['copy_bandwidth'] / 1e9:.1f} | {r['floor']:.4f} | {r['ram']:.3f} "
            f"({r['ram_x_floor']:.1f}x) | {r['ram_plus']:.3f} ({r['ram_plus_x_floor']:.1f}x, "
            f"{r['ram_plus_x_ram']:.2f}x) | {r['ram_plus_reused']:.3f} ({r['ram_plus_reused_x_ram']:.2f}x) | "
            f"{r['pair_ratio']:.2f}x; {r['pair_extra'] * 1e3:+.0f} ms | "
            f"{r['two_pass_bound']:.2f}, {r['one_read_bound']:.2f} | "
            f"{r['inplace_ram']:.3f}, {r['inplace_ram_plus']:.3f} ({r['inplace_pair_ratio']:.2f}x) | "
            f"{r['probe']:.2f} ({r['probe_x_floor']:.1f}x) | {mk32} | {mk16} | "
            f"{check} | {r['ram_others_cpu']:.0%}/{r['ram_plus_others_cpu']:.0%}/{r['probe_others_cpu']:.0%} |"
        )

    if args.eager:
        print(
            f"\n## The torch eager path ({cpu_label()}; native kernels off, as without a C compiler; seconds, "
            "best of the runs)\n"
        )
        print("| K | RAM s (x floor) | RAM+ s (x RAM eager) | default path faster by RAM / RAM+ |")
        print("|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['k']} | {r['ram_eager']:.3f} ({r['ram_eager'] / r['floor']:.1f}x) | "
                f"{r['ram_plus_eager']:.3f} ({r['ram_plus_eager'] / r['ram_eager']:.2f}x) | "
                f"{r['ram_eager'] / r['ram']:.1f}x / {r['ram_plus_eager'] / r['ram_plus']:.1f}x |"
            )

    if args.compile:
        print(
            f"\n## With compile=True ({cpu_label()}; torch.compile-fused kernels; seconds, best of the runs after "
            "the first)\n"
        )
        print(
            "| K | RAM s (x floor) | RAM+ s (x RAM compiled) | first calls RAM / RAM+ s | vs default RAM / RAM+ | "
            "RAM speedup vs mergekit f32 | others' CPU % |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            mk = f"{r['mergekit_f32'] / r['ram_compile']:.1f}x" if "mergekit_f32" in r else "n/a"
            print(
                f"| {r['k']} | {r['ram_compile']:.3f} ({r['ram_compile'] / r['floor']:.1f}x) | "
                f"{r['ram_plus_compile']:.3f} ({r['ram_plus_compile'] / r['ram_compile']:.2f}x) | "
                f"{r['ram_compile_first']:.1f} / {r['ram_plus_compile_first']:.1f} | "
                f"{r['ram'] / r['ram_compile']:.1f}x / {r['ram_plus'] / r['ram_plus_compile']:.1f}x faster | {mk} | "
                f"{r['ram_compile_others_cpu']:.0%}/{r['ram_plus_compile_others_cpu']:.0%} |"
            )

    if memory:
        print(
            f"\n## Extra peak memory over the inputs ({cpu_label()}; MiB; fresh process per row; "
            f"{'CUDA max_memory_allocated' if device.type == 'cuda' else 'VmHWM after clear_refs'})\n"
        )
        print("| K | method | extra peak | (RSS sampler) | output | 2 x largest tensor | target | |")
        print("|---:|---|---:|---:|---:|---:|---:|---|")
        for m in memory:
            print(
                f"| {m['k']} | {m['method']} | {fmt_mb(m['extra'])} | {fmt_mb(m['extra_sampled'])} | "
                f"{fmt_mb(m['output_bytes'])} | {fmt_mb(2 * m['largest_tensor_bytes'])} | {fmt_mb(m['target'])} | "
                f"{verdict(m['pass'])} |"
            )

    def overall(values: list[bool]) -> bool | None:
        return None if not values else all(values)

    targets = {
        f"RAM <= {TARGET_FLOOR:g}x floor ({device.type})": overall([r["pass_floor"] for r in rows]),
        f"RAM >= {TARGET_MERGEKIT:g}x faster than mergekit ram (float32 compute)": overall(
            [r["pass_mergekit_f32"] for r in rows if "pass_mergekit_f32" in r]
        ),
        f"RAM >= {TARGET_MERGEKIT:g}x faster than mergekit ram (its default bf16 compute)": overall(
            [r["pass_mergekit_bf16"] for r in rows if "pass_mergekit_bf16" in r]
        ),
        f"RAM+ <= {TARGET_RAMPLUS:g}x RAM": overall([r["pass_ramplus"] for r in rows]),
        "extra peak memory <= output + 2 x largest tensor (RAM, RAM+, probe)": overall([m["pass"] for m in memory]),
    }
    per_k = {
        f"RAM <= {TARGET_FLOOR:g}x floor ({device.type})": lambda r: (r["pass_floor"], f"{r['ram_x_floor']:.1f}x"),
        f"RAM >= {TARGET_MERGEKIT:g}x faster than mergekit ram (float32 compute)": lambda r: (
            r.get("pass_mergekit_f32"),
            f"{r['speedup_f32']:.1f}x" if "speedup_f32" in r else "-",
        ),
        f"RAM >= {TARGET_MERGEKIT:g}x faster than mergekit ram (its default bf16 compute)": lambda r: (
            r.get("pass_mergekit_bf16"),
            f"{r['speedup_bf16']:.1f}x" if "speedup_bf16" in r else "-",
        ),
        f"RAM+ <= {TARGET_RAMPLUS:g}x RAM": lambda r: (r["pass_ramplus"], f"{r['ram_plus_x_ram']:.2f}x"),
    }
    print(f"\n## Targets ({cpu_label()})\n")
    for name, ok in targets.items():
        detail = ""
        if name in per_k:
            detail = "  (" + ", ".join(f"K={r['k']}: {per_k[name](r)[1]}" for r in rows) + ")"
        elif memory:
            worst = max(memory, key=lambda m: m["extra"] / m["target"])
            detail = (
                f"  (worst: {worst['method']} K={worst['k']}, {fmt_mb(worst['extra'])} "
                f"of {fmt_mb(worst['target'])} MiB)"
            )
        print(f"- {verdict(ok)}: {name}{detail}")
    print(
        "- (not a target) RAM+ / RAM in place, pairs: "
        + ", ".join(f"K={r['k']}: {r['inplace_pair_ratio']:.2f}x" for r in rows)
    )
    if args.quick:
        print(
            "- --quick is a smoke test: the targets are meant for the full size (fixed overheads of a few MiB "
            "and cache-resident inputs make its ratios meaningless)"
        )
    if not use_mergekit:
        print(f"- mergekit: {mk_note}")
    elif mk_max_k < max(ks):
        print(f"- mergekit run for K <= {mk_max_k} only (--mergekit-max-k)")
    total = time.perf_counter() - run_start
    print(
        f"\nbenchmark wall time: {total:.0f} s, of which {_idle['waited']:.0f} s waiting for other processes to "
        f"leave the CPUs; load average at start {load_start}, at end {loadavg()}. "
        f"'others' CPU' is the share of this machine's CPUs other processes used during the best timed run "
        f"(a run above {CONTENDED:.0%} gets retried): high values mean the timings are inflated."
    )

    if args.json:
        payload = {
            "config": {
                "quick": args.quick,
                "ks": ks,
                "reps": reps,
                "device": str(device),
                "params": n_params,
                "tensors": len(specs),
                "densities": list(DENSITIES[: max(ks)]),
                "seed": SEED,
                "mergekit": mk_note,
                "mergekit_max_k": mk_max_k if use_mergekit else None,
            },
            "git": git,
            "machine": {
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "cpu": cpu_label(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            },
            "output_copy_seconds": {"pre_touched": warm_copy, "fresh": fresh},
            "rows": rows,
            "memory": memory,
            "targets": {k: v for k, v in targets.items()},
            "wall_seconds": total,
            "idle_wait_seconds": _idle["waited"],
            "loadavg": {"start": load_start, "end": loadavg()},
        }
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
