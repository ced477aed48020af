"""torch.ops.ram_live.inputs_edges (ram_live/kernels/device/edges.py): the Triton kernel (under the interpreter) and
the torch implementation give the same bytes, laid out as the digest hashes them; its fake implementation gives
the shape (FakeTensor, torch.compile); torch.library's own checks pass."""

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreter  # noqa: E402
from ram_live.kernels.device import common, edges, edges_triton  # noqa: E402


def _tensors():
    g = torch.Generator().manual_seed(3)
    sizes_dtypes = [(5, torch.float32), (70, torch.bfloat16), (300, torch.float64), (127, torch.float16)]
    return [torch.randn(n, generator=g).to(dtype) for n, dtype in sizes_dtypes]


def _by_hand(tensors, per_group):
    out = b""
    for i in range(0, len(tensors), per_group):
        group = [t.view(torch.uint8) for t in tensors[i : i + per_group]]
        sizes = [t.element_size() for t in tensors[i : i + per_group]]
        out += b"".join(bytes(g[: 64 * s].tolist()) for g, s in zip(group, sizes))
        out += b"".join(bytes(g[-64 * s :].tolist()) for g, s in zip(group, sizes))
    return out


@interpreter
@pytest.mark.parametrize("per_group", [1, 2, 4])
def test_the_kernel_and_torch_give_each_groups_heads_then_tails(per_group, monkeypatch):
    tensors = _tensors()
    kernel = edges.inputs_edges(tensors, per_group)
    monkeypatch.setattr(common, "triton_serves", lambda device: False)
    monkeypatch.setattr(edges_triton, "launch_edges", None)  # the kernel must not run: the torch implementation
    fallback = edges.inputs_edges(tensors, per_group)
    assert bytes(kernel.tolist()) == bytes(fallback.tolist()) == _by_hand(tensors, per_group)
    assert kernel.numel() == edges.edges_bytes(tensors)


def test_the_fake_implementation_gives_the_shape_and_the_op_passes_torch_library_checks():
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors = _tensors()
    with FakeTensorMode() as mode:
        fake = edges.inputs_edges([mode.from_tensor(t) for t in tensors], 2)
    assert fake.shape == (edges.edges_bytes(tensors),) and fake.dtype == torch.uint8
    torch.library.opcheck(edges.inputs_edges, (tensors, 2))


@interpreter
def test_entries_wider_than_the_kernels_edge_are_gathered_by_torch(monkeypatch):
    tensors = [torch.randn(100, dtype=torch.complex128), torch.randn(100)]
    launched = []
    monkeypatch.setattr(edges_triton, "launch_edges", lambda *args: launched.append(1))
    assert bytes(edges.inputs_edges(tensors, 2).tolist()) == _by_hand(tensors, 2) and launched == []


@pytest.mark.parametrize("count, per_group", [(0, 1), (3, 2), (2, 0)])
def test_tensors_not_in_whole_groups_are_a_config_error(count, per_group):
    from ram_live.errors import ConfigError

    with pytest.raises(ConfigError, match=f"got {count} tensor.*per_group={per_group}"):
        edges.inputs_edges([torch.zeros(4)] * count, per_group)
