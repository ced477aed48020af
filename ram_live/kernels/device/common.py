"""What every device kernel shares: whether Triton serves a device (:func:`triton_serves`), the agents' tensors as
kernel arguments (:data:`MAX_AGENTS` pointers, :func:`agent_args`), the output as a kernel writes it
(:func:`kernel_out`), and the launch that falls back to an op's torch implementation where Triton cannot build its
kernel (:func:`launch`). Torch only: the Triton helpers live in :mod:`.triton_common`."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import operator
import os
import threading
import warnings
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from ...errors import DeviceKernelWarning
from ...types import DEVICE_OF, DTYPE_OF

__all__ = [
    "EDGE",
    "INPUT_DTYPES",
    "MAX_AGENTS",
    "MAX_NUMEL",
    "MAX_REGISTERS",
    "OUT_DTYPES",
    "PLAIN_TENSORS",
    "agent_args",
    "block_size",
    "device_guard",
    "device_programs",
    "group_key",
    "group_takes",
    "per_tensor",
    "plain_on",
    "kernel_out",
    "launch",
    "register_cap",
    "triton_serves",
    "unbuilt_kernels",
    "triton_takes",
]

#: The most agents one kernel launch takes (one pointer argument each); more agents merge through the torch
#: implementation of the same op.
MAX_AGENTS = 8
#: Output dtypes the kernels round to themselves, and the input dtypes they read.
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Some kernels index in int32 (and draw DARE's masks from 32-bit counters): tensors of at least this many entries
#: take the torch implementations.
MAX_NUMEL = 1 << 31
#: Entries at each end of a tensor that the inputs' digest reads (``torch.ops.ram_live.inputs_edges``).
EDGE = 64


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_serves(device: torch.device) -> bool:
    """Whether the Triton kernels run on tensors of ``device``: CUDA/XPU where Triton is installed; CPU only under
    Triton's interpreter (``TRITON_INTERPRET=1``, for tests).

    Example:
        >>> triton_serves(torch.device("meta"))
        False
    """
    if not _triton_installed():
        return False
    if device.type in ("cuda", "xpu"):
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def agent_args(tensors: Sequence[Tensor | None]) -> list[Tensor | None]:
    """``tensors`` padded with None to :data:`MAX_AGENTS` pointer arguments (a kernel reads the first K)."""
    return [*tensors, *([None] * (MAX_AGENTS - len(tensors)))]


def block_size(inputs: Sequence[Tensor], num_warps: int) -> int:
    """Entries per block of a kernel that reads ``inputs``: each thread one 16-byte vector of the narrowest of
    them (8 entries of a 16-bit input, 4 of float32), so that every input is read with 128-bit loads."""
    return 16 // min(t.element_size() for t in inputs) * 32 * num_warps


#: The registers a thread of a streaming kernel may use: a multiprocessor then holds half its most warps (NVIDIA).
MAX_REGISTERS = 128


def register_cap(device: torch.device) -> dict[str, int]:
    """The launch option that caps a kernel's registers at :data:`MAX_REGISTERS` where Triton's backend takes it
    (NVIDIA: ``maxnreg``; not AMD's or Intel's backends, which would refuse the option), else none."""
    if device.type == "xpu" or (device.type == "cuda" and torch.version.hip is not None):
        return {}
    return {"maxnreg": MAX_REGISTERS}


def kernel_out(out: Tensor) -> tuple[Tensor, bool]:
    """The output as the kernel writes it: bfloat16 as its int16 bits (rounded by the kernel), else as it is."""
    if out.dtype == torch.bfloat16:
        return out.view(torch.int16), True
    return out, False


def triton_takes(tensors: Sequence[Tensor], k: int) -> bool:
    """Whether the Triton kernels take these flat tensors (inputs, and the output where given) of ``k`` agents: on
    one device Triton serves, contiguous, of :data:`INPUT_DTYPES`, at most :data:`MAX_AGENTS` agents."""
    device = tensors[0].device
    return (
        triton_serves(device)
        and 0 < k <= MAX_AGENTS
        and tensors[0].numel() < MAX_NUMEL
        and all(t.device == device and t.is_contiguous() and t.dtype in INPUT_DTYPES for t in tensors)
    )


#: The tensor types a grouped launch takes (not a subclass: DTensor, FakeTensor).
PLAIN_TENSORS = (Tensor, torch.nn.Parameter)
_PLAIN_SET = frozenset(PLAIN_TENSORS)


def group_key(out: Tensor | None, base: Tensor, agents: Sequence[Tensor]) -> tuple | None:
    """What tensors merged in one launch (``out`` None: counted) share (their device, their dtypes, the number of
    agents), or None where a tensor cannot join a group: a tensor subclass, not one device, not contiguous, an address
    off a 16-byte boundary (a grouped kernel reads its pointers from a table, knowing only that they are aligned), a
    dtype the kernels do not take, too many entries or agents.

    Example:
        >>> group_key(torch.empty(4), torch.zeros(4), [torch.ones(4)])[1:]
        (torch.float32, torch.float32, torch.float32, 1)
    """
    if out is not None:  # the inputs' key, then the output checked against it
        inputs = group_key(None, base, agents)
        return None if inputs is None else output_key(out, inputs)
    k = len(agents)
    if not 0 < k <= MAX_AGENTS or base.numel() >= MAX_NUMEL:
        return None
    device, dtype = base.device, agents[0].dtype
    for t in (base, *agents):
        if type(t) not in PLAIN_TENSORS or t.device != device or not t.is_contiguous() or t.data_ptr() % 16:
            return None
    if base.dtype not in INPUT_DTYPES or dtype not in INPUT_DTYPES or any(a.dtype != dtype for a in agents):
        return None
    return device, None, base.dtype, dtype, k


def plain_on(tensors: Sequence[Tensor], device: torch.device) -> bool:
    """Whether ``tensors`` are plain (not a subclass), contiguous tensors on ``device``: a property at a time over
    them all (a model's thousands of tensors cost no Python loop per tensor).

    Example:
        >>> plain_on([torch.zeros(4), torch.zeros(2, 2)], torch.device("cpu")), plain_on([torch.zeros(4)[::2]], "cpu")
        (True, False)
    """
    return (
        set(map(type, tensors)) <= _PLAIN_SET
        and set(map(DEVICE_OF, tensors)) == {torch.device(device)}
        and all(map(Tensor.is_contiguous, tensors))
    )


def output_key(out: Tensor, inputs: tuple) -> tuple | None:
    """:func:`group_key` of ``out`` with inputs whose own key (``group_key(None, base, agents)``) is ``inputs``: the
    output checked alone (the inputs of a search's merges are checked once, their tensors do not change).

    Example:
        >>> output_key(torch.empty(4), group_key(None, torch.zeros(4), [torch.ones(4)]))[1:]
        (torch.float32, torch.float32, torch.float32, 1)
    """
    device = inputs[0]
    if type(out) not in PLAIN_TENSORS or out.dtype not in OUT_DTYPES or out.device != device:
        return None
    if not out.is_contiguous() or out.data_ptr() % 16:
        return None
    return device, out.dtype, *inputs[2:]


def per_tensor(flat: Sequence[Any], tensors: int) -> list[list[Any]]:
    """A grouped op's per-agent list (``K`` per tensor, tensor by tensor: agents, importances, seeds, ranks) as one
    list per tensor; empty where ``flat`` is.

    Example:
        >>> per_tensor([1, 2, 3, 4, 5, 6], 2)
        [[1, 2, 3], [4, 5, 6]]
    """
    if not flat:
        return []
    k = len(flat) // max(1, tensors)
    return [list(flat[i * k : (i + 1) * k]) for i in range(tensors)]


def group_takes(
    outs: Sequence[Tensor], bases: Sequence[Tensor], agents: Sequence[Tensor], importances: Sequence[Tensor]
) -> bool:
    """Whether a grouped kernel takes these (``outs``: one per tensor, or none for counts; ``agents``: ``K`` per
    tensor, in order; ``importances``: none, or likewise): one :func:`group_key` for every tensor, on a device
    Triton serves, and importances of one dtype, contiguous and aligned on that device. Checked a property at a
    time over all the tensors (a model's thousands of tensors cost no Python loop per tensor)."""
    k = len(agents) // max(1, len(bases))
    if not bases or len(agents) != k * len(bases) or not triton_serves(bases[0].device):
        return False
    if (outs and len(outs) != len(bases)) or (importances and len(importances) != len(agents)):
        return False
    key = group_key(outs[0] if outs else None, bases[0], agents[:k])
    if key is None:
        return False
    device, out_dtype, base_dtype, agent_dtype, _ = key
    every = [*outs, *bases, *agents, *importances]
    return (
        plain_on(every, device)
        and not functools.reduce(operator.or_, map(Tensor.data_ptr, every)) % 16
        and max(map(Tensor.numel, bases)) < MAX_NUMEL
        and set(map(DTYPE_OF, bases)) == {base_dtype}
        and set(map(DTYPE_OF, agents)) == {agent_dtype}
        and (not outs or set(map(DTYPE_OF, outs)) == {out_dtype})
        and len(set(map(DTYPE_OF, importances))) <= 1
    )


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def device_programs(device: torch.device, numel: int, block: int, per_sm: int) -> int:
    """Programs of a kernel whose programs walk strided shares of ``numel`` entries, ``block`` at a time:
    ``per_sm`` per multiprocessor at most (each then adds its sums once)."""
    return max(1, min(-(-numel // block), _multiprocessors(device) * per_sm))


def device_guard(device: torch.device | None) -> contextlib.AbstractContextManager:
    """``device`` made current while a kernel is launched: Triton launches on the current device and its stream, so
    tensors on ``cuda:1`` while ``cuda:0`` is current would otherwise be read by a kernel running on ``cuda:0``.

    Example:
        >>> with device_guard(torch.device("cpu")):
        ...     pass
    """
    if device is None:
        return contextlib.nullcontext()
    if device.type == "cuda":
        return torch.cuda.device(device)
    if device.type == "xpu":
        return torch.xpu.device(device)
    return contextlib.nullcontext()


def _device_of(args: Sequence[Any]) -> torch.device | None:
    """The device of an op's first tensor argument (a tensor, or a list of them)."""
    for arg in args:
        if isinstance(arg, Tensor):
            return arg.device
        if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], Tensor):
            return arg[0].device
    return None


#: Kernels Triton could not build in this process, with the error: their ops run the torch implementation.
_UNBUILT: dict[str, str] = {}
_UNBUILT_LOCK = threading.Lock()


def _build_error(err: Exception) -> bool:
    """Whether ``err``, raised by a Triton launch, says the kernel could not be built here: Triton's own errors
    (compiler, ptxas, resources) or MLIR's pass manager failing (a RuntimeError naming it), all raised before the
    kernel runs. Not the interpreter's errors (a kernel's own bug, which the tests must see), nor any other
    RuntimeError (a CUDA error, running out of memory, a bug of the launch's own torch code)."""
    from triton.errors import TritonError
    from triton.runtime.errors import InterpreterError

    if isinstance(err, InterpreterError):
        return False
    return isinstance(err, TritonError) or type(err) is RuntimeError and "PassManager" in str(err)


def launch(kernel: str, takes: bool, triton: Callable[..., None], fallback: Callable[..., None], *args: Any) -> None:
    """``triton(*args)``, the launch of the Triton kernel ``kernel``, where ``takes``; else, or where Triton cannot
    build that kernel on this machine, ``fallback(*args)``: the op's torch implementation of the same arithmetic.
    The kernel is launched with its tensors' device current (:func:`device_guard`).
    A kernel that fails to build is named once in a :class:`~ram_live.errors.DeviceKernelWarning`, and its op runs
    the torch implementation for the rest of the process (:func:`unbuilt_kernels`). Each op's ``triton`` writes
    its outputs from its last launch only (an earlier one, as TIES' thresholds, fills scratch), so a build error
    leaves its outputs untouched.

    Args:
        kernel: the kernel's name, as the warning and :func:`unbuilt_kernels` give it.
        takes: whether the Triton kernel takes these tensors (:func:`triton_takes`).
        triton, fallback: the op's two implementations, called with ``args``.
    """
    if takes and kernel not in _UNBUILT:
        try:
            with device_guard(_device_of(args)):
                triton(*args)
            return
        except Exception as err:  # noqa: BLE001 (only a build error falls back; the rest is raised)
            if not _build_error(err):
                raise
            _record_unbuilt(kernel, err)
    fallback(*args)


def _record_unbuilt(kernel: str, err: Exception) -> None:
    """Warn once, then record (where warnings are errors, as in the tests, nothing is recorded: every later launch
    of the kernel fails as loudly)."""
    text = str(err).strip()
    error = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
    with _UNBUILT_LOCK:
        if kernel in _UNBUILT:
            return
        warnings.warn(
            DeviceKernelWarning(
                f"ram_live: Triton could not build the device kernel {kernel} here ({error}); its op runs the torch "
                "implementation from now on (the same results, slower). Please report it with your GPU, torch and "
                "Triton versions."
            ),
            stacklevel=3,
        )
        _UNBUILT[kernel] = error


def unbuilt_kernels() -> dict[str, str]:
    """The device kernels Triton could not build in this process, with the error (their ops ran in torch).

    Example:
        >>> unbuilt_kernels()
        {}
    """
    return dict(_UNBUILT)
