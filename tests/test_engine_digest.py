"""ram_live.engine.digest: a grouped pass's edges gathered in one launch (Triton's interpreter here) give the digest
that feeding each tensor in turn gives, whatever the sizes (fewer than 64, 64 to 127, more entries) and dtypes, and
so does the op's torch implementation where the kernel cannot take a tensor (strided)."""

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreter  # noqa: E402
from ram_live.engine import checks  # noqa: E402
from ram_live.engine.digest import InputsDigest  # noqa: E402
from ram_live.kernels.device import edges_triton  # noqa: E402

SIZES = [1, 7, 63, 64, 65, 100, 127, 128, 129, 5000]


def _groups(k: int, agent_dtype: torch.dtype) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, n in enumerate(SIZES):
        base_dtype = (torch.bfloat16, torch.float32, torch.float64, torch.float16)[i % 4]
        base = torch.randn(n, generator=g).to(base_dtype)
        out.append([base, *(torch.randn(n, generator=g).to(agent_dtype) for _ in range(k))])
    return out


def test_update_on_the_cpu_hashes_each_tensors_head_then_tail():
    import hashlib

    a, b = torch.arange(200, dtype=torch.int16), torch.arange(5, dtype=torch.float32)
    d = InputsDigest()
    d.update([a, b])
    raw = a.numpy().tobytes()
    expected = raw[:128] + b.numpy().tobytes() + raw[-128:] + b.numpy().tobytes()
    assert d.hexdigest() == hashlib.blake2b(expected, digest_size=16).hexdigest()


@interpreter
@pytest.mark.parametrize("k, agent_dtype", [(1, torch.bfloat16), (3, torch.float32), (8, torch.float64)])
def test_a_grouped_gather_gives_the_digest_of_one_tensor_at_a_time(k, agent_dtype, monkeypatch):
    groups = _groups(k, agent_dtype)
    one_by_one = InputsDigest()
    for group in groups:
        one_by_one.update(group)
    launched = []
    real = edges_triton.launch_edges
    monkeypatch.setattr(edges_triton, "launch_edges", lambda t, w, o: launched.append(len(t)) or real(t, w, o))
    monkeypatch.setattr(checks, "deferred_device", lambda device: device.type != "meta")
    gathered = InputsDigest()
    gathered.update(groups[0])  # a tensor fed alone first: the order of what is pending is kept
    gathered.update_many(groups[1:])
    assert launched == [(k + 1) * (len(SIZES) - 1)]
    assert gathered.hexdigest() == one_by_one.hexdigest()


@interpreter
def test_groups_the_kernel_cannot_take_are_gathered_by_torch(monkeypatch):
    monkeypatch.setattr(checks, "deferred_device", lambda device: device.type != "meta")
    groups = _groups(2, torch.float32)
    groups[3][1] = torch.randn(200)[::2]  # strided: no flat address range
    launched = []
    monkeypatch.setattr(edges_triton, "launch_edges", lambda t, w, o: launched.append(1))
    d, reference = InputsDigest(), InputsDigest()
    d.update_many(groups)
    for group in groups:
        reference.update(group)
    assert launched == [] and d.hexdigest() == reference.hexdigest()
