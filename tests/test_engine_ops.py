"""call_op: a custom op's implementation called directly in eager mode, through the dispatcher wherever something
must see it as one op (torch.compile, dispatch and function modes, FakeTensor, functorch, subclasses, autograd)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ram_live.engine.ops import call_op, dispatch_needed

CALLS = {"impl": 0}


@torch.library.custom_op("ram_live_test::scaled_add_", mutates_args=("out", "count"))
def scaled_add_(out: torch.Tensor, parts: list[torch.Tensor], scale: float, count: torch.Tensor) -> None:
    CALLS["impl"] += 1
    out.copy_(sum(parts) * scale)
    count += 1


@scaled_add_.register_fake
def _(out, parts, scale, count) -> None:
    return None


class Recording(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _args():
    return torch.zeros(4), [torch.arange(4.0), torch.ones(4)], 2.0, torch.zeros((), dtype=torch.int64)


def test_eager_call_runs_the_implementation_and_bumps_versions(monkeypatch):
    def dispatched(self, *args, **kwargs):
        raise AssertionError("went through the dispatcher")

    monkeypatch.setattr(type(scaled_add_), "__call__", dispatched)
    out, parts, scale, count = _args()
    versions = (out._version, count._version)
    assert not dispatch_needed((out, parts, scale, count))
    before = CALLS["impl"]
    call_op(scaled_add_, out, parts, scale, count)
    assert CALLS["impl"] == before + 1
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0] and int(count) == 1
    assert out._version > versions[0] and count._version > versions[1]  # as the dispatcher's ADInplaceOrView bumps


def test_a_dispatch_mode_sees_one_op(monkeypatch):
    calls = []
    through = type(scaled_add_).__call__
    monkeypatch.setattr(type(scaled_add_), "__call__", lambda self, *a, **k: calls.append(1) or through(self, *a, **k))
    out, parts, scale, count = _args()
    with Recording() as mode:
        call_op(scaled_add_, out, parts, scale, count)
    assert mode.ops[0] == "ram_live_test.scaled_add_.default"  # the op itself, then what its implementation runs
    assert calls == [1]
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]


def test_fake_tensors_take_the_fake_implementation():
    with FakeTensorMode() as mode:
        out, parts, scale, count = (mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in _args())
        parts = [mode.from_tensor(p) for p in _args()[1]]
        before = CALLS["impl"]
        call_op(scaled_add_, out, parts, scale, count)
        assert CALLS["impl"] == before  # the fake implementation ran


@pytest.mark.parametrize("case", ["function mode", "grad", "subclass", "vmap"])
def test_dispatch_needed(case):
    out, parts, scale, count = _args()
    if case == "function mode":

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        with Mode():
            assert dispatch_needed((out, parts, scale, count))
    elif case == "grad":
        leaf = torch.ones(4, requires_grad=True)
        assert dispatch_needed((out, [leaf], scale, count))
        with torch.no_grad():
            assert not dispatch_needed((out, [leaf], scale, count))
    elif case == "subclass":

        class Sub(torch.Tensor):
            pass

        assert dispatch_needed((out, [torch.ones(4).as_subclass(Sub)], scale, count))
        assert not dispatch_needed((torch.nn.Parameter(torch.ones(4), requires_grad=False), parts, scale, count))
    else:
        seen = []
        torch.vmap(lambda x: seen.append(dispatch_needed((x,))) or x)(torch.zeros(2, 3))
        assert seen == [True]


def test_torch_compile_sees_one_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    def merge(out, a, b, count):
        call_op(scaled_add_, out, [a, b], 2.0, count)
        return out

    torch._dynamo.reset()
    out, parts, _, count = _args()
    torch.compile(merge, backend=backend, fullgraph=True)(out, *parts, count)
    assert len(graphs) == 1 and any("scaled_add_" in target for target in graphs[0])
    assert out.tolist() == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("method", ["ram", "ram_plus", "task_arithmetic", "dare_ties"])
def test_a_device_merge_calls_its_ops_directly(method, on_device, monkeypatch):
    """A device merge of modules whose parameters require grad (the tensors reach the ops detached) calls each op
    through call_op, which takes the implementation directly, with the same bits as through the dispatcher."""
    from device_helpers import bits, module_agents

    from ram_live import merge
    from ram_live.engine import ops

    base, agents = module_agents(torch.bfloat16)
    assert all(p.requires_grad for p in base.parameters())
    needed, decide = [], ops.dispatch_needed
    monkeypatch.setattr(ops, "dispatch_needed", lambda args: needed.append(decide(args)) or needed[-1])
    direct, info = merge(agents, base=base, method=method, return_info=True)
    assert set(info.extra["kernels"]) == {"device"}
    # one op for all tensors (ram_live/engine/grouped.py); RAM+ counts them all in one op first
    grouped = {"ram": 1, "ram_plus": 2, "task_arithmetic": 1, "dare_ties": 1}.get(method)
    assert len(needed) == grouped if grouped else len(needed) >= info.tensors  # every tensor's ops
    assert not any(needed)  # none through the dispatcher
    monkeypatch.setattr(ops, "dispatch_needed", lambda args: True)
    via_dispatcher = merge(agents, base=base, method=method)
    for key, p in direct.state_dict().items():
        assert torch.equal(bits(p), bits(via_dispatcher.state_dict()[key])), key
