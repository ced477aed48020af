"""Compiles every device kernel with Triton's real compiler (to a cubin, with the ptxas Triton ships) for NVIDIA
targets, on a machine without a GPU: each op's Triton wrapper is called on CPU tensors with its kernel replaced by a
recorder, and the recorded launch (its tensors' dtypes, its None, int and float arguments, its constexprs and
options) is compiled as the launch would compile it. Run in a process without ``TRITON_INTERPRET`` (under the
interpreter ``triton.jit`` gives no compilable function): ``python tests/kernel_compile.py [--arch 90 80]``.
Prints one line per case and exits 1 if any fails to build. tests/test_kernels_device_compile.py runs it."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
import time
import traceback
from typing import Any, Callable, Iterator

import torch

from kernel_group_cases import group_cases

DTYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float64: "fp64",
    torch.uint8: "u8",
}
OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg")


class Recorder:
    """Stands for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the launch."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


#: Every device kernel, stood in for by a recorder while a case's call runs (an op may launch two).
KERNELS = (
    ("ram_live.kernels.device.ram_triton", "ram_merge_kernel"),
    ("ram_live.kernels.device.counts_triton", "activity_counts_kernel"),
    ("ram_live.kernels.device.linear_triton", "linear_merge_kernel"),
    ("ram_live.kernels.device.select_triton", "radix_histogram_kernel"),
    ("ram_live.kernels.device.select_triton", "select_thresholds_kernel"),
    ("ram_live.kernels.device.ties_triton", "ties_merge_kernel"),
    ("ram_live.kernels.device.group_triton", "ram_merge_group_kernel"),
    ("ram_live.kernels.device.group_baseline_triton", "linear_merge_group_kernel"),
    ("ram_live.kernels.device.group_baseline_triton", "dare_ties_group_kernel"),
    ("ram_live.kernels.device.group_ties_triton", "radix_histogram_group_kernel"),
    ("ram_live.kernels.device.group_ties_triton", "select_thresholds_group_kernel"),
    ("ram_live.kernels.device.group_ties_triton", "ties_group_kernel"),
    ("ram_live.kernels.device.group_triton", "activity_counts_group_kernel"),
    ("ram_live.kernels.device.edges_triton", "edges_kernel"),
)


@contextlib.contextmanager
def recorded(module: str, name: str) -> Iterator[tuple[Any, Recorder]]:
    """The real kernel ``module.name`` and a recorder standing in for it while the block runs (every other kernel
    of :data:`KERNELS` stood in for by a recorder too)."""
    modules = {m: importlib.import_module(m) for m, _ in KERNELS}
    stubs = {(m, n): (modules[m], getattr(modules[m], n), Recorder()) for m, n in KERNELS}
    for (_, n), (mod, _, recorder) in stubs.items():
        setattr(mod, n, recorder)
    try:
        _, kernel, recorder = stubs[(module, name)]
        yield kernel, recorder
    finally:
        for (_, n), (mod, kernel, _) in stubs.items():
            setattr(mod, n, kernel)


def signature(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict, dict, dict]:
    """The launch's signature, constexprs and compile options, as ``ASTSource`` and ``triton.compile`` take them."""
    sig, constants, options = {}, {}, {}
    names = kernel.arg_names
    for name, value in zip(names, args):
        if value is None:
            sig[name], constants[name] = "constexpr", None
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + DTYPES[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: argument {name} of type {type(value).__name__}")
    for name, value in kwargs.items():
        if name in OPTIONS:
            options[name] = value
        else:
            sig[name], constants[name] = "constexpr", value
    return sig, constants, options


def specialization(kernel: Any, launch: tuple[tuple[Any, ...], dict[str, Any]], target: Any) -> tuple:
    """The launch's signature, constexprs, attributes (the divisibility hints of aligned pointers and sizes) and
    options, bound as Triton's own launcher binds them (its private binder, where this Triton has one: the very
    specialisation a launch builds), else :func:`signature`'s mapping without the hints."""
    args, kwargs = launch
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(target)
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        given = {**kwargs, "debug": False}
        bound, spec, bound_options = binder(*args, **given)
        _, sig, constexprs, attrs = kernel._pack_args(backend, given, bound, spec, bound_options)
        return sig, constexprs, attrs, options
    except (ImportError, AttributeError, TypeError, ValueError):
        sig, constants, options = signature(kernel, *launch)
        return sig, {(kernel.arg_names.index(k),): v for k, v in constants.items()}, None, options


def build(kernel: Any, launch: tuple[tuple[Any, ...], dict[str, Any]], arch: int, ptx_file: str | None = None) -> str:
    """Compiles one recorded launch for ``sm_<arch>``; returns its cubin's size, registers and spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    sig, constexprs, attrs, options = specialization(kernel, launch, target)
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=target, options=options)
    ptx = compiled.asm["ptx"]
    if ptx_file:
        with open(ptx_file, "w") as f:
            f.write(ptx)
    return f"{len(compiled.asm['cubin'])} B cubin, {resources(compiled.asm['cubin'])}, {rounding(ptx)}, {loads(ptx)}"


def rounding(ptx: str) -> str:
    """The float32 instructions that would break the CPU's bits: fused multiply-adds (contracted ``a * b + c``) and
    approximate division or reciprocals (Triton's plain ``/`` is ``div.full``; the kernels use ``div_rn``)."""
    fma = len(re.findall(r"\bfma\.[a-z.]*f32\b", ptx))
    approx = len(re.findall(r"\b(?:div\.(?:full|approx)|rcp\.approx)\.[a-z.]*f32\b", ptx))
    return f"{fma} f32 fma, {approx} approximate f32 divisions"


def loads(ptx: str) -> str:
    """The global loads by width: 128-bit vectors (``ld.global.v4.b32``, ``.v2.b64``), 64-bit vectors, and scalar
    loads of 16- and 32-bit entries (a 16-bit input read without vectors shows as scalar b16 loads)."""
    found = re.findall(r"\bld\.global(?:\.[a-z0-9_:]+)*?(?:\.(v[248]))?\.([bfu](?:8|16|32|64))\b", ptx)
    wide = sum(1 for v, t in found if (v, t) in (("v4", "b32"), ("v2", "b64"), ("v4", "f32"), ("v4", "u32")))
    half = sum(1 for v, t in found if (v, t) in (("v2", "b32"), ("v2", "f32"), ("v2", "u32"), ("", "b64")))
    narrow = sum(1 for v, t in found if not v and t in ("b16", "u16", "f16"))
    scalar = sum(1 for v, t in found if not v and t in ("b32", "f32", "u32"))
    return f"loads: {wide} x 128-bit, {half} x 64-bit, {scalar} x 32-bit, {narrow} x 16-bit"


def resources(cubin: bytes) -> str:
    """Registers and local memory (spills) per thread, from the cuobjdump Triton ships (where it runs)."""
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler

    tool = os.path.join(os.path.dirname(compiler.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=60).stdout
        except OSError:
            return "resources unknown"
    fields = dict(part.split(":", 1) for line in usage.splitlines() if "REG:" in line for part in line.split())
    return f"{fields.get('REG', '?')} registers, {fields.get('LOCAL', '?')} B local (spills)"


#: The tensors' entries and the row of a merge's buffers each launch gets: 4096 and the first row, or (for
#: :func:`one_specialisation`) an odd size and the second row, whose address is 8 bytes off a 16-byte boundary.
SHAPE = {"n": 4096, "row": 0}


def flat(k: int, dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
    n = SHAPE["n"]
    return torch.zeros(n, dtype=dtype), [torch.zeros(n, dtype=dtype) for _ in range(k)]


def row(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A row of a two-row buffer, as the merge's invalid slots and the probe's counts are."""
    return torch.zeros(2, n, dtype=dtype)[SHAPE["row"]]


def zero_slot() -> torch.Tensor:
    return torch.zeros(2, dtype=torch.int64)[SHAPE["row"]]


def cases() -> list[tuple[str, str, str, Callable[[], None]]]:
    """``(label, kernel's module, kernel's name, a call of its op's Triton wrapper)``: the specialisations a merge
    launches, the extremes of each option."""
    from ram_live.kernels.device import linear, select, ties
    from ram_live.methods.ram import device as ram
    from ram_live import probe_device as probe

    out: list[tuple[str, str, str, Callable[[], None]]] = []
    ram_mod, ram_name = "ram_live.kernels.device.ram_triton", "ram_merge_kernel"
    counts_mod, counts_name = "ram_live.kernels.device.counts_triton", "activity_counts_kernel"
    for dtype, k, lam, sign, weighted, eps in [
        (torch.bfloat16, 3, False, False, False, 1e-5),
        (torch.float16, 1, True, True, False, 0.0),
        (torch.float32, 8, True, False, True, 1e-5),
        (torch.bfloat16, 5, True, True, True, 0.0),
    ]:
        base, agents = flat(k, dtype)
        imps = [torch.ones(SHAPE["n"], dtype=torch.float32) for _ in range(k)] if weighted else []
        lambdas = torch.ones(k, dtype=torch.float32) if lam else None

        def call(base=base, agents=agents, imps=imps, lambdas=lambdas, eps=eps, sign=sign) -> None:
            ram._triton_merge(torch.empty_like(base), base, agents, imps, lambdas, eps, sign, zero_slot())

        label = f"RAM {DTYPES[dtype]} K={k} lambdas={lam} sign={sign} weighted={weighted} eps={eps}"
        out.append((label, ram_mod, ram_name, call))
    for dtype, k, eps in [(torch.bfloat16, 3, 1e-5), (torch.float32, 8, 0.0)]:
        base, agents = flat(k, dtype)

        def call(base=base, agents=agents, eps=eps, k=k) -> None:
            ram._triton_counts(base, agents, eps, torch.zeros(3 * k + 1, dtype=torch.int64), zero_slot())

        out.append((f"RAM counts {DTYPES[dtype]} K={k} eps={eps}", counts_mod, counts_name, call))
    for dtype, k, eps in [(torch.bfloat16, 3, 1e-5), (torch.float16, 8, 0.0), (torch.float32, 1, 1e-5)]:
        base, agents = flat(k, dtype)

        def call(base=base, agents=agents, eps=eps, k=k) -> None:
            counts = row(3 * k + 1 + k * k, torch.int64)
            probe._triton_probe(base, agents, eps, counts, row(k * k, torch.float64), zero_slot())

        out.append((f"probe {DTYPES[dtype]} K={k} eps={eps}", counts_mod, counts_name, call))
    lin_mod = "ram_live.kernels.device.linear_triton"
    for dtype, k, scale, dare in [
        (torch.bfloat16, 3, 1.0, False),
        (torch.float32, 8, 0.5, True),
        (torch.float16, 2, 2.0, True),
    ]:
        base, agents = flat(k, dtype)
        densities, seeds = ([0.4] * k, list(range(k))) if dare else ([], [])

        def call(base=base, agents=agents, k=k, scale=scale, densities=densities, seeds=seeds) -> None:
            weights = torch.ones(k, dtype=torch.float64)
            linear._triton_linear(torch.empty_like(base), base, agents, weights, scale, densities, seeds, zero_slot())

        out.append((f"linear {DTYPES[dtype]} K={k} scale={scale} dare={dare}", lin_mod, "linear_merge_kernel", call))
    out += group_cases(flat, DTYPES)
    sel_mod = "ram_live.kernels.device.select_triton"
    for dtype, k, ranks in [(torch.bfloat16, 3, [5, 0, 7]), (torch.float32, 8, [1] * 8)]:
        base, agents = flat(k, dtype)
        for p in range(len(select.PASSES)):

            def call(base=base, agents=agents, k=k, ranks=ranks, p=p) -> None:
                hist = torch.zeros(3, k, select.NBINS, dtype=torch.int32)
                select._triton_histogram(base, agents, ranks, p, hist)

            out.append((f"radix histogram {DTYPES[dtype]} K={k} pass {p}", sel_mod, "radix_histogram_kernel", call))
    ties_mod = "ram_live.kernels.device.ties_triton"
    for dtype, k, trim, dare, majority, weighted, divide in [
        (torch.bfloat16, 3, True, False, 0, False, 0),
        (torch.float32, 8, True, False, 1, True, 1),
        (torch.float16, 2, False, True, 0, True, 2),
        (torch.bfloat16, 5, True, True, 1, False, 0),
    ]:
        base, agents = flat(k, dtype)
        hist = torch.zeros(3, k, select.NBINS, dtype=torch.int32) if trim else None
        ranks = [3] * k if trim else []
        densities, seeds = ([0.5] * k, list(range(k))) if dare else ([], [])

        def call(base=base, agents=agents, k=k, hist=hist, ranks=ranks, densities=densities, seeds=seeds,
                 majority=majority, weighted=weighted, divide=divide) -> None:  # fmt: skip
            weights = torch.ones(k, dtype=torch.float64)
            out_t = torch.empty_like(base)
            ties._triton_ties(
                out_t, base, agents, weights, hist, ranks, densities, seeds, 1.0, majority, weighted, divide,
                zero_slot(),
            )  # fmt: skip

        label = f"TIES {DTYPES[dtype]} K={k} trim={trim} dare={dare} majority={majority} weighted={weighted}"
        out.append((label + f" divide={divide}", ties_mod, "ties_merge_kernel", call))
        if trim and dtype != torch.float16:
            out.append((f"TIES thresholds K={k}", sel_mod, "select_thresholds_kernel", call))
    base, agents = flat(3, torch.bfloat16)

    def edges(tensors=[base, *agents, base, *agents]) -> None:
        from ram_live.kernels.device.edges import edges_bytes
        from ram_live.kernels.device.edges_triton import launch_edges

        launch_edges(tensors, 4, torch.empty(edges_bytes(tensors), dtype=torch.uint8))

    out.append(("inputs' edges K=3", "ram_live.kernels.device.edges_triton", "edges_kernel", edges))
    return out


def _nth(label: str) -> int:
    """Which of the case's launches of its kernel to build: ``#n`` ends the label of a call that launches the
    kernel several times (the grouped radix passes), else the first."""
    return int(label.rsplit("#", 1)[1]) if "#" in label else 0


def one_specialisation() -> list[str]:
    """Per case, whether a launch on tensors of an odd size with its slot (and the probe's rows) 8 bytes off a
    16-byte boundary binds to the same specialisation (signature, constexprs, alignment hints) as the case's own:
    every tensor of a merge then runs one compiled kernel per kernel and dtype. Returns a line per case."""
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", 90, 32)
    keys: dict[str, list] = {}
    for shape in ({"n": 4096, "row": 0}, {"n": 4099, "row": 1}):
        SHAPE.update(shape)
        try:
            for label, module, name, call in cases():
                with recorded(module, name) as (kernel, recorder):
                    call()
                keys.setdefault(label, []).append(repr(specialization(kernel, recorder.launches[_nth(label)], target)))
        finally:
            SHAPE.update({"n": 4096, "row": 0})
    return [f"{'same' if a == b else 'DIFF'} {label}" for label, (a, b) in keys.items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90], help="compute capabilities (90: H100/H200)")
    parser.add_argument("--only", default="", help="only the cases whose label contains this text")
    parser.add_argument("--ptx", default="", help="a folder to write each build's PTX into")
    parser.add_argument(
        "--specialisations", action="store_true", help="also check one specialisation per kernel and dtype"
    )
    args = parser.parse_args()
    if args.ptx:
        os.makedirs(args.ptx, exist_ok=True)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter's functions do not compile", file=sys.stderr)
        return 2
    failed = 0
    for index, (label, module, name, call) in enumerate(cases()):
        if args.only not in label:
            continue
        with recorded(module, name) as (kernel, recorder):
            call()
        for arch in args.arch:
            t0 = time.perf_counter()
            try:
                ptx_file = os.path.join(args.ptx, f"{index:02d}_sm{arch}.ptx") if args.ptx else None
                built = build(kernel, recorder.launches[_nth(label)], arch, ptx_file)
                print(f"ok   sm_{arch} {label}: {built}, {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception:  # noqa: BLE001 (every case is tried; the exit code says if any failed)
                failed += 1
                print(f"FAIL sm_{arch} {label}:\n{traceback.format_exc()}", flush=True)
    if args.specialisations:
        lines = one_specialisation()
        print("\n".join(f"spec {line}" for line in lines), flush=True)
        failed += sum(line.startswith("DIFF") for line in lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
