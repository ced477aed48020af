"""Fake-CUDA tracing of the merge paths: a copy of the project's shared check (shared/tools/device_path.py, outside
this repository) without its command line, kept beside tests/test_device_shape.py so that CI runs it from a clean
clone. The shared check's own description:

Does ram_live's CUDA merge path have the shape of a near-floor GPU design? Checked on a CPU-only machine.

    python ../shared/tools/device_path.py        # from the project's root, in its venv

How: the merges run on *fake* CUDA tensors (torch's FakeTensorMode: shape, dtype and device "cuda", no data, no
memory, no compute), so every ``device.type`` test in the library sees CUDA and the library takes exactly the path
a CUDA tensor takes (chunk sizes, native-kernel refusals, eager accumulators, compiled kernels). A dispatch mode
records every aten call the merge issues: whether it launches a kernel (views, ``empty`` and metadata do not), the
bytes it reads and writes (its tensor arguments and results, once each), and every host-device synchronisation a
CUDA run would make (``.item()``/``bool()``/``float()``/``.tolist()`` of a device tensor, device-to-host and blocking
host-to-device copies, value-dependent shapes such as ``nonzero``/``bincount``), with the library line that made it.
Host reads of fake values get the no-error value (finite, zero counts), so error paths are not taken.
``compile=True`` is checked with each torch.compile build replaced by a stub that counts one fused launch (its
tensors read or written once) and runs the Python function uncounted (there is no Triton here).

Each method merges a stack of 1 and of 3 bf16 tensors of each size (1 M and 16.8 M = 4096 x 4096 entries, K = 3
agents, the shapes of benchmarks/gpu_check.py); the difference / 2 is the cost *per tensor* (what a merge of 90 such
tensors pays 90 times), apart from the per-merge constant.

Fails (exit 1) when, per tensor:
  * launches, aten calls or syncs at 16.8 M entries exceed those at 1 M (a chunk loop: the op count grows with numel);
  * the RAM family (RAM, RAM+, curvature RAM; eager and compile=True) makes any sync, more than MAX_LAUNCHES = 12
    kernel launches, or more than MAX_CALLS = 40 aten calls;
  * the nominal bytes moved exceed the method's target x the copy floor ((K + 2) x numel x 2 bytes; curvature
    RAM: + K x numel x 2 for the importances): RAM family 3, TA 2, TIES / DARE-TIES 10;
  * a single-block selection (kthvalue / median / mode: one CUDA block per slice) runs on >= 1 M entries.
Exit 2: the path could not be traced on fake CUDA tensors (the traceback says where).

Why these bounds (NVIDIA H200 run of benchmarks/gpu_check.py, 3540 GB/s copy bandwidth): a 4096 x 4096 bf16 tensor
with K = 3 has a floor of 5 x 33.5 MB / 3.54 TB/s = 47 us, so <= 3x the floor leaves ~140 us per tensor for
everything. With no sync per tensor the host runs ahead of the GPU and only its own time per tensor must stay under
that: at ~10 us per launch from a lean Python launcher (the measured table implies ~20 us per launch on today's
eager paths, e.g. RAM: ~45,700 launches in 0.874 s) and ~1-2 us per view/metadata call, that is <= 12 launches and
<= 40 aten calls per tensor. A sync per tensor instead drains the GPU and adds host latency to every tensor. Bytes
are a lower bound on the GPU time: a method cannot beat its bytes / bandwidth.

A near-floor design passes: one fused kernel per tensor (or per group of tensors), registered as a torch.library
custom op with a fake implementation (so that this check, torch.compile and FSDP see it as one op: 1 launch, its
bytes = the K + 1 inputs read and the output written, 1.0x the floor), its non-finite count kept in a device
counter read once per merge (a merge-constant sync, not per tensor), RAM+'s counts kept on the device until the one
read that makes lambda, and TIES' thresholds from a multi-block device selection (radix-select histograms), never
read on the host. Kernels launched outside the dispatcher (raw Triton calls) are invisible to this check: register
them as custom ops.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from dataclasses import dataclass, field
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten

K = 3
SIZES = ((256, 4096), (4096, 4096))  # 1 M and 16.8 M entries
MAX_LAUNCHES = 12
MAX_CALLS = 40
RAM_FAMILY = ("RAM", "RAM+", "RAM curvature")
BYTES_TARGET = {"RAM": 3.0, "RAM+": 3.0, "RAM curvature": 3.0, "TA": 2.0, "TIES": 10.0, "DARE-TIES": 10.0}
#: the gpu_check options of each method (benchmarks/gpu_checks/merges.py METHODS)
METHODS: dict[str, dict[str, Any]] = {
    "RAM": {"method": "ram"},
    "RAM+": {"method": "ram_plus"},
    "RAM curvature": {"method": "ram", "importance": True},
    "TA": {"method": "task_arithmetic"},
    "TIES": {"method": "ties", "density": 0.2},
    "DARE-TIES": {"method": "dare_ties", "density": 0.5},
}
#: ops that launch nothing on CUDA (allocation, metadata)
NO_LAUNCH = {
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.lift_fresh.default,
    aten.detach.default, aten.alias.default, aten.new_empty.default, aten.new_empty_strided.default,
    aten._local_scalar_dense.default,
}
#: ops whose result size or value the host must wait for on CUDA
DATA_DEPENDENT = {
    aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default, aten.bincount.default, aten.equal.default, aten.is_nonzero.default,
    aten.repeat_interleave.Tensor, aten.histc.default,
}
#: CUDA runs these with one thread block per slice: a whole flattened tensor is one slice (~7 GB/s)
SINGLE_BLOCK = {"kthvalue", "median", "nanmedian", "mode"}
BIG = 1 << 20


def _on_dev(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cuda"


def _nbytes(x: Any) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def _where() -> str:
    for frame in reversed(traceback.extract_stack()):
        if "ram_live" in frame.filename and "check_device_path" not in frame.filename:
            return f"{frame.filename[frame.filename.rfind('ram_live'):]}:{frame.lineno}"
    return "?"


@dataclass
class Record:
    calls: int = 0
    launches: int = 0
    bytes: int = 0
    syncs: int = 0
    sync_sites: Counter = field(default_factory=Counter)
    single_block: Counter = field(default_factory=Counter)

    def minus(self, o: "Record") -> "Record":
        return Record(
            self.calls - o.calls,
            self.launches - o.launches,
            self.bytes - o.bytes,
            self.syncs - o.syncs,
            self.sync_sites - o.sync_sites,
            self.single_block - o.single_block,
        )

    def copy(self) -> "Record":
        return self.minus(Record())


class _Dispatch(TorchDispatchMode):
    def __init__(self, fc: "FakeCuda") -> None:
        super().__init__()
        self.fc = fc

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fc, r = self.fc, self.fc.rec
        if func.namespace == "prim":  # metadata queries of fake tensors (device, layout)
            return func(*args, **kwargs)
        leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        fake = any(isinstance(x, FakeTensor) for x in leaves)
        dev = kwargs.get("device")
        to_dev = dev is not None and torch.device(dev).type == "cuda"
        if not fake and not to_dev:  # host bookkeeping: run it for real
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is aten._local_scalar_dense.default:
            if _on_dev(args[0]):
                fc.count_call()
                fc.sync("item/bool/float of a device tensor")
            return fc.value_of(args[0])
        fc.count_call()
        if func in (aten._to_copy.default, aten.copy_.default):
            src = args[1] if func is aten.copy_.default else args[0]
            dst = args[0].device if func is aten.copy_.default else torch.device(kwargs.get("device") or src.device)
            if src.device.type != dst.type:
                fc.sync("device-to-host copy" if src.device.type == "cuda" else "blocking host-to-device copy")
        if func in DATA_DEPENDENT:
            fc.sync(f"value-dependent {func.__name__}")
            return fc.data_dependent(func, args, kwargs)
        out = func(*args, **kwargs)
        if fc.counting and not func.is_view and func not in NO_LAUNCH:
            ins = [x for x in tree_leaves(args) if isinstance(x, torch.Tensor)]
            outs = [x for x in tree_leaves(kwargs.get("out", out)) if isinstance(x, torch.Tensor)]
            r.launches += 1
            r.bytes += sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))
            name = func.__name__.split(".")[0]
            if name in SINGLE_BLOCK and max((x.numel() for x in ins), default=0) >= BIG:
                r.single_block[f"{name} @ {_where()}"] += 1
        return out


_SCALAR = {"__float__": float, "__int__": int, "__index__": int, "__bool__": bool, "item": lambda v: v}
_DUNDER = {
    "__invert__": "bitwise_not", "__and__": "bitwise_and", "__or__": "bitwise_or", "__xor__": "bitwise_xor",
    "__iand__": "bitwise_and_", "__ior__": "bitwise_or_", "__ixor__": "bitwise_xor_", "__neg__": "neg",
    "__abs__": "abs",
}


class _Function(TorchFunctionMode):
    """What a CPU build of torch cannot do with a fake CUDA tensor at the Python level (bindings that open a CUDA
    device guard: indexing, scalar conversion, ...), done with the aten ops those bindings call."""

    def __init__(self, fc: "FakeCuda") -> None:
        super().__init__()
        self.fc = fc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self_ = args[0] if args else None
        if not isinstance(self_, FakeTensor):
            return self._call(func, args, kwargs)
        if func in (torch.isfinite, torch.Tensor.isfinite):
            out = self._call(func, args, kwargs)
            self.fc.truthy[out] = True  # a finiteness check reads True: no error path
            return out
        if func is torch.Tensor.__getitem__:
            return _getitem(self_, args[1])
        if func is torch.Tensor.__setitem__:
            view, value = _getitem(self_, args[1]), args[2]
            return aten.copy_.default(view, value) if isinstance(value, torch.Tensor) else aten.fill_.Scalar(view, value)
        conv = _SCALAR.get(getattr(func, "__name__", ""))
        if conv is not None:
            return conv(aten._local_scalar_dense.default(self_))
        if func is torch.Tensor.data_ptr:
            return _root_ptr(self_) + self_.storage_offset() * self_.element_size()
        if func is torch.Tensor.untyped_storage:
            return _Storage(_root_ptr(self_))
        return self._call(func, args, kwargs)

    @staticmethod
    def _call(func, args, kwargs):
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:
            if "not linked with support for cuda" not in str(exc):
                raise
            name = getattr(func, "__name__", "")
            packet = getattr(aten, _DUNDER.get(name, name), None)
            if packet is None:
                raise
            return packet(*args, **kwargs)


def _filled(shape: list[int], value: Any) -> Any:
    return value if not shape else [_filled(shape[1:], value) for _ in range(shape[0])]


def _root_ptr(t: torch.Tensor) -> int:
    while t._base is not None:
        t = t._base
    return (id(t) % (1 << 40)) * 4096


class _Storage:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _getitem(t: torch.Tensor, idx: Any) -> torch.Tensor:
    if not isinstance(idx, tuple):
        idx = (idx,)
    specified = sum(1 for i in idx if i is not None and i is not Ellipsis)
    out, dim = t, 0
    for i in idx:
        if i is Ellipsis:
            dim += t.dim() - specified
        elif i is None:
            out, dim = aten.unsqueeze.default(out, dim), dim + 1
        elif isinstance(i, slice):
            start = 0 if i.start is None else i.start
            stop = sys.maxsize if i.stop is None else i.stop
            out, dim = aten.slice.Tensor(out, dim, start, stop, i.step or 1), dim + 1
        elif isinstance(i, int):
            out = aten.select.int(out, dim, i)
        else:
            raise NotImplementedError(f"indexing a fake CUDA tensor with {type(i).__name__}")
    return out


class FakeCuda:
    """Fake CUDA tensors on a CPU build of torch, and the counting modes."""

    def __init__(self) -> None:
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.rec = Record()
        self.counting = False
        self.truthy = WeakTensorKeyDictionary()
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "FakeCuda":
        original = torch.Tensor.copy_  # its binding opens a CUDA device guard

        def copy_(self_, src, *args, **kwargs):
            if _on_dev(self_) or _on_dev(src):
                return aten.copy_.default(self_, src, *args, **kwargs)
            return original(self_, src, *args, **kwargs)

        original_tolist = FakeTensor.tolist  # on a CUDA tensor: one device-to-host copy, not one per entry

        def tolist(self_):
            if _on_dev(self_):
                self.count_call()
                self.sync("tolist of a device tensor")
            return _filled(list(self_.shape), self.value_of(self_))

        torch.Tensor.copy_ = copy_
        FakeTensor.tolist = tolist
        self._stack.callback(setattr, torch.Tensor, "copy_", original)
        self._stack.callback(setattr, FakeTensor, "tolist", original_tolist)
        self._stack.enter_context(self.fake)  # also keeps torch from initialising CUDA for device="cuda"
        self._stack.enter_context(_Dispatch(self))
        self._stack.enter_context(_Function(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        was, self.counting = self.counting, False
        try:
            return torch.empty(shape, dtype=dtype, device="cuda")
        finally:
            self.counting = was

    def count_call(self) -> None:
        if self.counting:
            self.rec.calls += 1

    def sync(self, reason: str) -> None:
        if self.counting:
            self.rec.syncs += 1
            self.rec.sync_sites[f"{reason} @ {_where()}"] += 1

    def value_of(self, t: torch.Tensor) -> Any:
        if self.truthy.get(t, False):
            return True
        if t.dtype == torch.bool:
            return False
        return 0.0 if t.dtype.is_floating_point else 0

    def data_dependent(self, func, args, kwargs):
        t = args[0]
        if func is aten.nonzero.default:
            return torch.empty((0, t.dim()), dtype=torch.int64, device=t.device)
        if func is aten.bincount.default:
            n = kwargs.get("minlength", args[2] if len(args) > 2 else 0) or 1
            return torch.zeros(n, dtype=torch.int64, device=t.device)
        if func is aten.equal.default:
            return True
        if func is aten.is_nonzero.default:
            return False
        if func is aten.masked_select.default:
            return torch.empty(0, dtype=t.dtype, device=t.device)
        raise NotImplementedError(f"value-dependent {func} on a fake CUDA tensor")


class _CompiledStub:
    """A torch.compile build: one call is one fused launch that reads / writes each of its tensors once."""

    def __init__(self, fc: FakeCuda, kernel: Any) -> None:
        self.fc, self.kernel = fc, kernel

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        was, self.fc.counting = self.fc.counting, False
        try:
            out = self.kernel(*args, **kwargs)
        finally:
            self.fc.counting = was
        if self.fc.counting:
            r = self.fc.rec
            r.calls += 1
            r.launches += 1
            r.bytes += sum(_nbytes(x) for x in tree_leaves((args, kwargs, out)) if isinstance(x, torch.Tensor))
        return out


@contextlib.contextmanager
def _stub_compile(fc: FakeCuda):
    """Every ram_live module that holds ``compiled`` (the one cache of torch.compile builds) gets the stub."""
    holders = [m for name, m in list(sys.modules.items()) if name.startswith("ram_live") and hasattr(m, "compiled")]
    saved = [(m, m.compiled) for m in holders]
    for m in holders:
        m.compiled = lambda kernel, static=False, key=None: _CompiledStub(fc, kernel)
    try:
        yield
    finally:
        for m, value in saved:
            m.compiled = value


class _Stack(nn.Module):
    def __init__(self, fc: FakeCuda, rows: int, cols: int, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(n):
            with torch.device("meta"):
                lin = nn.Linear(cols, rows, bias=False)
            lin.weight = nn.Parameter(fc.tensor((rows, cols)), requires_grad=False)
            self.layers.append(lin)


def _merge_cost(fc: FakeCuda, label: str, rows: int, cols: int, n: int, compile: bool) -> Record:
    from ram_live import merge

    base = _Stack(fc, rows, cols, n)
    agents = [_Stack(fc, rows, cols, n) for _ in range(K)]
    kw = dict(METHODS[label])
    if kw.pop("importance", False):
        kw["importance"] = {f"agent_{t}": {k: fc.tensor(tuple(p.shape)) for k, p in base.named_parameters()} for t in range(K)}
    before = fc.rec.copy()
    fc.counting = True
    try:
        merge(agents, base=base, compile=compile, **kw)
    finally:
        fc.counting = False
    return fc.rec.minus(before)


@dataclass
class Row:
    label: str
    per: dict[int, Record]  # numel -> per-tensor cost
    problems: list[str]


def measure(fc: FakeCuda, label: str, compile: bool) -> Row:
    per: dict[int, Record] = {}
    for rows, cols in SIZES:
        with _stub_compile(fc) if compile else contextlib.nullcontext():
            one = _merge_cost(fc, label, rows, cols, 1, compile)
            three = _merge_cost(fc, label, rows, cols, 3, compile)
        d = three.minus(one)
        per[rows * cols] = Record(
            d.calls // 2, d.launches // 2, d.bytes // 2, d.syncs // 2,
            Counter({k: v // 2 for k, v in d.sync_sites.items()}),
            Counter({k: v // 2 for k, v in d.single_block.items()}),
        )
    return Row(label + (" compile" if compile else ""), per, judge(label, per))


def judge(label: str, per: dict[int, Record]) -> list[str]:
    small, large = (per[r * c] for r, c in SIZES)
    numel = SIZES[1][0] * SIZES[1][1]
    problems = []
    for what in ("launches", "calls", "syncs"):
        a, b = getattr(small, what), getattr(large, what)
        if b > a + 2 and b > 1.25 * a:
            problems.append(f"{what}/tensor grow with numel ({a} at 1 M, {b} at 16.8 M: a chunk loop)")
    floor = (K + 2 + (K if label == "RAM curvature" else 0)) * numel * 2
    ratio = large.bytes / floor
    if ratio > BYTES_TARGET[label]:
        problems.append(f"bytes {ratio:.1f}x the floor > {BYTES_TARGET[label]:g}x")
    if label in RAM_FAMILY:
        if large.syncs:
            problems.append(f"{large.syncs} syncs/tensor in the RAM family (0 allowed)")
        if large.launches > MAX_LAUNCHES:
            problems.append(f"{large.launches} launches/tensor > {MAX_LAUNCHES}")
        if large.calls > MAX_CALLS:
            problems.append(f"{large.calls} aten calls/tensor > {MAX_CALLS}")
    if large.single_block:
        problems.append(
            "single-block selection on a whole tensor: "
            + ", ".join(f"{n} x {s}" for s, n in large.single_block.items())
        )
    return problems
