"""The device kernels' launch (ram_live/kernels/device/common.py): where Triton cannot build a kernel on a machine
(its compiler, ptxas, resources, MLIR's pass manager), the op runs its torch implementation, bit for bit what the
kernel gives, and says so once; any other error is raised, and nothing is recorded for it."""

import warnings

import pytest
import torch

pytest.importorskip("triton")
from triton.compiler.errors import CompilationError  # noqa: E402
from triton.runtime.errors import InterpreterError, OutOfResources, PTXASError  # noqa: E402

import ram_live  # noqa: E402
from conftest import interpreter  # noqa: E402
from device_helpers import bits, module_agents  # noqa: E402
from ram_live.engine import checks  # noqa: E402
from ram_live.errors import DeviceKernelWarning  # noqa: E402
from ram_live.kernels.device import common, linear  # noqa: E402

BUILD_ERRORS = [
    CompilationError("src", None, "unsupported construct"),
    OutOfResources(232448, 166912, "shared memory"),
    PTXASError("ptxas fatal"),
    RuntimeError("PassManager::run failed"),
]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(common, "_UNBUILT", {})


class Calls:
    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.triton, self.torch = error, [], []

    def run_triton(self, *args):
        self.triton.append(args)
        if self.error is not None:
            raise self.error

    def run_torch(self, *args):
        self.torch.append(args)


@pytest.mark.parametrize("error", BUILD_ERRORS, ids=lambda e: type(e).__name__)
def test_a_kernel_that_cannot_be_built_falls_back_once_and_stays_there(error):
    calls = Calls(error)
    with pytest.warns(DeviceKernelWarning, match="could not build the device kernel demo_kernel") as caught:
        common.launch("demo_kernel", True, calls.run_triton, calls.run_torch, 1, "a")
    assert len(caught) == 1 and type(error).__name__ in str(caught[0].message)
    assert calls.triton == [(1, "a")] and calls.torch == [(1, "a")]
    assert common.unbuilt_kernels() == {"demo_kernel": common.unbuilt_kernels()["demo_kernel"]}
    assert common.unbuilt_kernels()["demo_kernel"].startswith(type(error).__name__)
    common.launch("demo_kernel", True, calls.run_triton, calls.run_torch, 2)  # no second try, no second warning
    assert calls.triton == [(1, "a")] and calls.torch == [(1, "a"), (2,)]
    other = Calls()
    common.launch("other_kernel", True, other.run_triton, other.run_torch)  # other kernels still build
    assert len(other.triton) == 1 and other.torch == []


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a bug of ours"),
        InterpreterError("a kernel's own bug"),
        torch.OutOfMemoryError("CUDA out of memory"),
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_other_errors_are_raised_and_not_recorded(error):
    calls = Calls(error)
    with pytest.raises(type(error)):
        common.launch("demo_kernel", True, calls.run_triton, calls.run_torch)
    assert calls.torch == [] and common.unbuilt_kernels() == {}


def test_where_the_warning_is_an_error_nothing_is_recorded_and_every_launch_fails():
    calls = Calls(BUILD_ERRORS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeviceKernelWarning)
        for _ in range(2):
            with pytest.raises(DeviceKernelWarning):
                common.launch("demo_kernel", True, calls.run_triton, calls.run_torch)
    assert len(calls.triton) == 2 and calls.torch == [] and common.unbuilt_kernels() == {}


def test_tensors_triton_does_not_take_run_the_torch_implementation():
    calls = Calls()
    common.launch("demo_kernel", False, calls.run_triton, calls.run_torch, 3)
    assert calls.triton == [] and calls.torch == [(3,)] and common.unbuilt_kernels() == {}


@interpreter
def test_a_merge_whose_kernel_cannot_be_built_gives_the_cpu_bits(monkeypatch):
    """Through a device merge's real op: task arithmetic's kernel fails to build, the merge warns once and gives the
    CPU merge's bits in every tensor."""
    base, agents = module_agents(torch.bfloat16)
    expected = ram_live.merge(agents, base=base, method="task_arithmetic", scale=0.7)
    monkeypatch.setattr(checks, "deferred_device", lambda dev: dev.type != "meta")
    monkeypatch.setattr(linear, "_triton_group", Calls(BUILD_ERRORS[0]).run_triton)  # its tensors in one launch
    with pytest.warns(DeviceKernelWarning) as caught:
        merged, info = ram_live.merge(agents, base=base, method="task_arithmetic", scale=0.7, return_info=True)
    assert len([w for w in caught if issubclass(w.category, DeviceKernelWarning)]) == 1
    assert info.extra["kernels"] == {"device": 3} and set(common.unbuilt_kernels()) == {"linear_merge_group_kernel"}
    for (name, p), q in zip(merged.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(bits(p), bits(q)), name


class _Devices:
    """CUDA's current device as a CPU build of torch can hold it: torch.cuda.device's own enter and exit run
    against it."""

    def __init__(self, monkeypatch, current: int) -> None:
        self.current = current
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "_exchange_device", self.exchange)
        monkeypatch.setattr(torch.cuda, "_maybe_exchange_device", self.exchange)

    def exchange(self, index: int) -> int:
        previous = self.current
        if index >= 0:
            self.current = index
        return previous


def _op_calls(dev: torch.device, k: int = 3, n: int = 4096):
    """Each device op's implementation (the function its torch.library op wraps) on tensors of ``dev``, with the
    module and name of the kernel it launches."""
    from ram_live import probe_device
    from ram_live.kernels.device import select, ties
    from ram_live.methods.ram import device as ram

    base = torch.empty(n, dtype=torch.bfloat16, device=dev)
    agents = [torch.empty(n, dtype=torch.bfloat16, device=dev) for _ in range(k)]
    slot = torch.zeros((), dtype=torch.int64, device=dev)
    weights = torch.ones(k, dtype=torch.float64, device=dev)
    hist = torch.zeros(3, k, select.NBINS, dtype=torch.int32, device=dev)
    counts = torch.zeros(3 * k + 1, dtype=torch.int64, device=dev)
    pairs = torch.zeros(3 * k + 1 + k * k, dtype=torch.int64, device=dev)
    gram = torch.zeros(k * k, dtype=torch.float64, device=dev)
    out = torch.empty_like(base)
    pkg = "ram_live.kernels.device"
    return [
        (f"{pkg}.ram_triton", "ram_merge_kernel", lambda: ram.ram_merge_._init_fn(
            out, base, agents, [], None, 0.0, False, slot)),
        (f"{pkg}.counts_triton", "activity_counts_kernel", lambda: ram.ram_counts_._init_fn(
            base, agents, 0.0, counts, slot)),
        (f"{pkg}.counts_triton", "activity_counts_kernel", lambda: probe_device.probe_counts_._init_fn(
            base, agents, 0.0, pairs, gram, slot)),
        (f"{pkg}.linear_triton", "linear_merge_kernel", lambda: linear.linear_merge_._init_fn(
            out, base, agents, weights, 1.0, [], [], slot)),
        (f"{pkg}.select_triton", "radix_histogram_kernel", lambda: select.radix_histogram_._init_fn(
            base, agents, [5] * k, 0, hist)),
        (f"{pkg}.ties_triton", "ties_merge_kernel", lambda: ties.ties_merge_._init_fn(
            out, base, agents, weights, hist, [5] * k, [], [], 1.0, 0, False, 0, slot)),
    ]  # fmt: skip


def test_every_kernel_launches_on_its_tensors_device(monkeypatch):
    """Fake CUDA tensors on cuda:1 while cuda:0 is current: each op's kernel is launched with cuda:1 current (Triton
    launches on the current device and its stream), and cuda:0 is current again after it."""
    import importlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    devices = _Devices(monkeypatch, current=0)
    monkeypatch.setattr(common, "_multiprocessors", lambda device: 132)
    launches = []

    class Kernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                tensors = {a.device for a in args if isinstance(a, torch.Tensor)}
                launches.append((self.name, devices.current, tensors))

            return run

    with FakeTensorMode(allow_non_fake_inputs=True):
        calls = _op_calls(torch.device("cuda:1"))
        for module, name, _ in calls:
            monkeypatch.setattr(importlib.import_module(module), name, Kernel(name))
        thresholds = "select_thresholds_kernel"  # TIES' first launch: its thresholds, once per tensor
        monkeypatch.setattr(
            importlib.import_module("ram_live.kernels.device.select_triton"), thresholds, Kernel(thresholds)
        )
        for _, name, call in calls:
            call()
            assert devices.current == 0, name
    cuda1 = {torch.device("cuda:1")}
    names = [name for _, name, _ in calls]
    assert launches == [(name, 1, cuda1) for name in [*names[:-1], thresholds, names[-1]]]


def test_a_grouped_op_launches_on_its_tensors_device(monkeypatch):
    """A grouped op's first argument is a list of tensors (the outputs, or the bases of a count): its launch is made
    with their device current too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    devices = _Devices(monkeypatch, current=0)
    seen = []
    with FakeTensorMode(allow_non_fake_inputs=True):
        outs = [torch.empty(4, device="cuda:1"), torch.empty(8, device="cuda:1")]
        common.launch("demo_group_kernel", True, lambda *args: seen.append(devices.current), None, outs, 1.0)
    assert seen == [1] and devices.current == 0


def test_the_register_cap_goes_only_to_backends_that_take_it(monkeypatch):
    """``maxnreg`` is an option of Triton's NVIDIA backend: AMD's (a ROCm torch's "cuda" device) and Intel's would
    refuse a launch that passes it."""
    assert common.register_cap(torch.device("cuda:1")) == {"maxnreg": common.MAX_REGISTERS} == {"maxnreg": 128}
    assert common.register_cap(torch.device("cpu")) == {"maxnreg": 128}  # the interpreter and the compile check
    assert common.register_cap(torch.device("xpu")) == {}
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert common.register_cap(torch.device("cuda")) == {}


def _group(k=2, numel=64, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    outs = [torch.empty(numel, dtype=dtype) for _ in range(3)]
    bases = [torch.randn(numel, generator=g).to(dtype) for _ in range(3)]
    agents = [torch.randn(numel, generator=g).to(dtype) for _ in range(3 * k)]
    return outs, bases, agents


def _off_boundary(t):
    holder = torch.zeros(t.numel() + 4, dtype=t.dtype)
    return holder[2 : 2 + t.numel()]  # 8 bytes (float32) off its storage's start


def _subclass(t):
    class Marked(torch.Tensor):
        pass

    return t.as_subclass(Marked)


REFUSALS = {
    "a misaligned output": lambda o, b, a, h: (o[:1] + [_off_boundary(o[1])] + o[2:], b, a, h),
    "a misaligned agent": lambda o, b, a, h: (o, b, a[:-1] + [_off_boundary(a[-1])], h),
    "a strided base": lambda o, b, a, h: (o, b[:2] + [torch.zeros(128)[::2]], a, h),
    "an agent of another dtype": lambda o, b, a, h: (o, b, a[:3] + [a[3].double()] + a[4:], h),
    "an output of another dtype": lambda o, b, a, h: (o[:2] + [o[2].double()], b, a, h),
    "a base of another dtype": lambda o, b, a, h: (o, [b[0].half()] + b[1:], a, h),
    "a tensor subclass": lambda o, b, a, h: (o, b, a[:2] + [_subclass(a[2])] + a[3:], h),
    "a meta base": lambda o, b, a, h: (o, b[:1] + [torch.empty(64, device="meta")] + b[2:], a, h),
    "agents not K a tensor": lambda o, b, a, h: (o, b, a[:-1], h),
    "outputs not one a tensor": lambda o, b, a, h: (o[:2], b, a, h),
    "importances of two dtypes": lambda o, b, a, h: (o, b, a, [x.clone() for x in a[:-1]] + [a[-1].double()]),
    "importances not one an agent": lambda o, b, a, h: (o, b, a, [x.clone() for x in a[:-1]]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_group_takes_refuses_any_tensor_a_grouped_kernel_cannot_read(case, monkeypatch):
    """Checked a property at a time over all the tensors: one tensor off is enough to refuse the group (the op then
    runs its torch implementation, tensor by tensor)."""
    monkeypatch.setattr(common, "triton_serves", lambda device: device.type == "cpu")
    outs, bases, agents = _group()
    assert common.group_takes(outs, bases, agents, [])
    assert common.group_takes([], bases, agents, [])  # counts: no outputs
    assert common.group_takes(outs, bases, agents, [a.clone() for a in agents])
    assert not common.group_takes(*REFUSALS[case](outs, bases, agents, []))
