"""Host time of a device merge per model, on a CPU, against the GPU's floor for that model.

    python benchmarks/bench_host.py                      # Qwen2.5-1.5B- and 7B-shaped, RAM, RAM+, TA, TIES, DARE-TIES
    python benchmarks/bench_host.py --models 1.5b --methods ram --reps 5 --json benchmarks/results/host.json
    python benchmarks/bench_host.py --models 1.5b --methods ram --profile    # cProfile of one merge

What a CUDA merge costs the host, measured without a GPU: the merge runs the device path on CPU tensors (the
engine's deferred checks and the ops' Triton wrappers take CPU tensors, as the tests' ``on_device`` fixture does),
and every Triton launch runs Triton's own host path for an sm_90 target (its argument binder, the cache key, the
cache lookup, the grid) up to the driver call, which is left out (``cuLaunchKernel`` itself, a few µs a launch on
the GPU's host: add ``launches`` x that to the figures). Nothing is computed: the inputs are the models' real
shapes in bfloat16 on untouched memory (``torch.empty``: no page is written, so a 7 B model costs no RAM), and the
kernels never write. The host work of a merge is per tensor, not per entry, so these are the figures a GPU run's
host would pay (on a faster host core, less). A zero-filled buffer of a million entries or more (TIES' histograms)
is made without writing it: on a GPU its memset is one more launch, not host work. Python's garbage collector is
off while merges are timed, as ``timeit`` has it (a collection's pause grows with every object of the process, not
with the merge: one took 190 ms of a 1.5 B merge here).

The floor of a model is the bytes a merge must move at least, the base and K = 3 agents read and the output
written, ``(K + 2) x parameters x 2 B``, over an H100 SXM's HBM3 bandwidth (3.35 TB/s): 1.5 B parameters, ~4.6 ms.
A ratio below 1 means that the host issues a model's launches faster than the GPU can run them. "host ms" is the
median CPU time of the merging thread (torch runs one thread here; a shared machine's load does not inflate it),
"wall ms" the best wall time.

A search merges each candidate into one reused output (:class:`ram_live.selection.target.Merger`: the scratch module
made, the inputs planned and read, RAM+'s counts taken by its first merge): "candidate ms" is the host time of each
merge after that first one, the figure a search pays per candidate.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import math
import os
import pstats
import statistics
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch

from _host import cpu_label

#: HBM3 bandwidth of an H100 SXM, bytes per second (NVIDIA's datasheet figure).
H100_BANDWIDTH = 3.35e12
K = 3
#: The methods and options of benchmarks/gpu_check.py.
METHODS: dict[str, dict[str, Any]] = {
    "RAM": {"method": "ram"},
    "RAM+": {"method": "ram_plus"},
    "TA": {"method": "task_arithmetic"},
    "TIES": {"method": "ties", "density": 0.2},
    "DARE-TIES": {"method": "dare_ties", "density": 0.5},
}
#: Qwen2.5's shapes (their config.json files): hidden, intermediate, layers, heads, KV heads, vocabulary, tied.
MODELS: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
}


class LaunchStub:
    """Stands for Triton's ``JITFunction.run``: Triton's host path of a launch for an sm_90 target (the binder
    that specialises the arguments, the cache key and lookup, the grid), no compile and no driver call. Counts the
    launches, the specialisations (compiles a GPU run would make) and the devices launched on."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.backend = make_backend(GPUTarget("cuda", 90, 32))
        self.launches = 0
        self.devices: Counter = Counter()
        self.specialisations: dict[str, set] = {}
        self._caches: dict[Any, tuple[dict, dict, Any]] = {}

    def run(self, fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        from triton import knobs
        from triton.runtime.jit import compute_cache_key, create_function_from_signature

        kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        caches = self._caches.get(fn)
        if caches is None:
            binder = create_function_from_signature(fn.signature, fn.params, self.backend)
            caches = self._caches[fn] = ({}, {}, binder)
        kernel_cache, key_cache, binder = caches
        bound, specialization, options = binder(*args, **kwargs)
        key = compute_cache_key(key_cache, specialization, options)
        if kernel_cache.get(key) is None:
            kernel_cache[key] = True
            self.specialisations.setdefault(fn.__name__, set()).add(key)
        if callable(grid):
            grid = grid(bound)
        self.launches += 1
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        self.devices[str(device)] += 1


@contextlib.contextmanager
def device_path_on_cpu() -> Iterator[LaunchStub]:
    """The device path for CPU tensors with Triton's launches stubbed (see the module's doc)."""
    from triton.runtime import jit as triton_jit

    from ram_live.engine import checks
    from ram_live.kernels.device import common

    stub = LaunchStub()
    saved = (checks.deferred_device, common.triton_serves, triton_jit.JITFunction.run, torch.zeros)
    checks.deferred_device = lambda device: device.type != "meta"
    common.triton_serves = lambda device: device.type in ("cpu", "cuda")
    zeros = torch.zeros

    def device_zeros(*size: Any, **kwargs: Any) -> torch.Tensor:
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        if kwargs.get("out") is None and math.prod(shape) >= 2**20:
            return torch.empty(*size, **kwargs)  # a memset launch on a GPU, not host work
        return zeros(*size, **kwargs)

    torch.zeros = device_zeros

    def run(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        return stub.run(fn, *args, grid=grid, warmup=warmup, **kwargs)

    triton_jit.JITFunction.run = run
    gc.collect()
    gc.disable()
    try:
        yield stub
    finally:
        gc.enable()
        checks.deferred_device, common.triton_serves, triton_jit.JITFunction.run, torch.zeros = saved


def qwen_shaped(name: str) -> torch.nn.Module:
    """A Qwen2.5-shaped causal LM (transformers' Qwen2ForCausalLM) in bfloat16 on untouched CPU memory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, inter, layers, heads, kv, vocab, tied = MODELS[name]
    config = Qwen2Config(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model = model.to_empty(device="cpu")
    if tied:
        model.tie_weights()
    return model.eval().requires_grad_(False)


def floor_seconds(model: torch.nn.Module) -> float:
    """``(K + 2) x numel x 2 B`` over the H100's bandwidth (tied parameters once)."""
    numel = sum(p.numel() for p in model.parameters())
    return (K + 2) * numel * 2 / H100_BANDWIDTH


def time_merges(base: torch.nn.Module, agents: list[torch.nn.Module], options: dict[str, Any], reps: int) -> dict:
    """One warm-up merge, then ``reps`` timed ones: the median and best CPU time of the merging thread (what the
    host spends, whatever else shares its cores), the best wall time, launches and specialisations per merge."""
    from ram_live import merge
    from ram_live.engine.unchanged import quiet_unchanged

    times, walls = [], []
    with device_path_on_cpu() as stub, quiet_unchanged(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged, info = merge(agents, base=base, return_info=True, **options)
        del merged
        launches = stub.launches
        for _ in range(reps):
            t0, w0 = time.thread_time(), time.perf_counter()
            merged = merge(agents, base=base, **options)
            times.append(time.thread_time() - t0)
            walls.append(time.perf_counter() - w0)
            del merged
        with breakdown() as parts:
            t0 = time.thread_time()
            merged = merge(agents, base=base, **options)
            parts["whole merge"] = time.thread_time() - t0
            del merged
    return {
        "parts_s": dict(parts),
        "median_s": statistics.median(times),
        "best_s": min(times),
        "wall_best_s": min(walls),
        "launches": launches,
        "tensors": info.tensors,
        "kernels": dict(info.extra.get("kernels", {})) if isinstance(info.extra.get("kernels"), dict) else None,
        "specialisations": {k: len(v) for k, v in stub.specialisations.items()},
        "devices": dict(stub.devices),
    }


def time_candidates(base: torch.nn.Module, agents: list[torch.nn.Module], options: dict[str, Any], reps: int) -> dict:
    """A search's candidates: one first merge into the :class:`~ram_live.selection.target.Merger`'s reused output,
    then ``reps`` timed ones (median and best CPU time of the merging thread, launches per candidate)."""
    from ram_live.engine.unchanged import quiet_unchanged
    from ram_live.selection.target import Merger

    times = []
    with device_path_on_cpu() as stub, quiet_unchanged(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merger = Merger(agents, base)
        merger.merge(options)
        before = stub.launches
        for _ in range(reps):
            t0 = time.thread_time()
            merger.merge(options)
            times.append(time.thread_time() - t0)
        launches = (stub.launches - before) // reps
    return {"median_s": statistics.median(times), "best_s": min(times), "launches": launches}


#: The parts of a merge :func:`breakdown` times: ``(module, attribute)`` of a function, and its label.
PARTS = (
    ("ram_live.api", "input_sources", "sources"),
    ("ram_live.engine.run", "build_plan", "plan"),
    ("ram_live.io.sinks", "ModuleSink.begin", "module copy"),
    ("ram_live.engine.run", "statistics_pass", "counting pass"),
    ("ram_live.engine.passes", "merge_groups", "grouped merge"),
    ("ram_live.engine.passes", "merge_tensor", "merge per tensor"),
)


@contextlib.contextmanager
def breakdown() -> Iterator[dict[str, float]]:
    """CPU seconds of the merging thread spent in each of :data:`PARTS` while the block runs."""
    import importlib

    spent = dict.fromkeys((label for *_, label in PARTS), 0.0)
    saved = []
    for module_name, attr, label in PARTS:
        owner: Any = importlib.import_module(module_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, name)

        def timed(*args: Any, _fn: Any = fn, _label: str = label, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_label] += time.thread_time() - t0

        saved.append((owner, name, fn))
        setattr(owner, name, timed)
    try:
        yield spent
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def profile_merge(base: torch.nn.Module, agents: list[torch.nn.Module], options: dict[str, Any]) -> None:
    from ram_live import merge
    from ram_live.engine.unchanged import quiet_unchanged

    with device_path_on_cpu(), quiet_unchanged(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merge(agents, base=base, **options)
        profiler = cProfile.Profile()
        profiler.enable()
        merge(agents, base=base, **options)
        profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), type=str.upper)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="write the rows there")
    parser.add_argument("--profile", action="store_true", help="cProfile one merge of the first model and method")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET: the launches are Triton's compiled-kernel host path")
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}: choose from {list(METHODS)}")
    torch.set_num_threads(1)
    rows = []
    print(f"## Host time of a device merge, launches stubbed ({cpu_label()}, torch {torch.__version__}, K = {K})")
    print("floor: (K + 2) x parameters x 2 B at 3.35 TB/s (H100 SXM HBM3)\n")
    print("| model | method | tensors | launches | host ms | µs / tensor | wall ms (best) | floor ms | host / floor |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        base = qwen_shaped(name)
        agents = [qwen_shaped(name) for _ in range(K)]
        floor = floor_seconds(base)
        for label in args.methods:
            if args.profile:
                profile_merge(base, agents, METHODS[label])
                return
            r = time_merges(base, agents, METHODS[label], args.reps)
            row = {"model": f"Qwen2.5-{name.upper()}-shaped", "method": label, "floor_s": floor, **r}
            row["ratio"] = r["median_s"] / floor
            row["candidate"] = time_candidates(base, agents, METHODS[label], args.reps)
            row["candidate"]["ratio"] = row["candidate"]["median_s"] / floor
            rows.append(row)
            print(
                f"| {row['model']} | {label} | {r['tensors']} | {r['launches']} | {r['median_s'] * 1e3:.1f} | "
                f"{r['median_s'] / r['tensors'] * 1e6:.0f} | {r['wall_best_s'] * 1e3:.1f} | {floor * 1e3:.2f} | "
                f"{row['ratio']:.2f} |",
                flush=True,
            )
        del base, agents
    print("\nA search's candidate (each merge into the reused output after the first):\n")
    print("| model | method | launches | host ms | best ms | floor ms | host / floor |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        c = row["candidate"]
        print(
            f"| {row['model']} | {row['method']} | {c['launches']} | {c['median_s'] * 1e3:.2f} | "
            f"{c['best_s'] * 1e3:.2f} | {row['floor_s'] * 1e3:.2f} | {c['ratio']:.2f} |"
        )
    print("\nWhere the host time goes (CPU ms of one more merge; the counting pass includes its tensors):\n")
    labels = [label for *_, label in PARTS] + ["whole merge"]
    print("| model | method | " + " | ".join(labels) + " |")
    print("|---|---|" + "---:|" * len(labels))
    for row in rows:
        cells = " | ".join(f"{row['parts_s'][label] * 1e3:.1f}" for label in labels)
        print(f"| {row['model']} | {row['method']} | {cells} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        about = {"cpu": cpu_label(), "torch": torch.__version__, "k": K, "bandwidth_bytes_per_s": H100_BANDWIDTH}
        args.json.write_text(json.dumps({"host": about, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
