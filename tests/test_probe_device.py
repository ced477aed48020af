"""The probe's device path (ram_live/probe_device.py): the op (Triton under its interpreter, and torch) against the
CPU probe's counts, a whole probe with the device path switched on for CPU tensors, and its shape on fake CUDA
tensors (one launch per tensor, no host sync per tensor)."""

import pytest
import torch

pytest.importorskip("triton")

import device_trace as trace  # noqa: E402
from device_helpers import flat_inputs as _inputs, module_agents as _agents  # noqa: E402
from conftest import interpreter  # noqa: E402
import ram_live  # noqa: E402
from ram_live import probe_device  # noqa: E402
from ram_live.engine import checks  # noqa: E402
from ram_live.errors import NonFiniteError  # noqa: E402
from ram_live.functional.activity import apply_activity_  # noqa: E402

pytestmark = interpreter


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_probe_op_counts_exactly(k, eps):
    base, agents = _inputs(3000, k, torch.bfloat16, seed=k)
    deltas = torch.stack([a.float() - base.float() for a in agents])
    masks = apply_activity_(deltas.clone(), eps) != 0
    c = masks.sum(0)
    want = torch.cat(
        [
            masks.sum(1),
            (masks & (c == 1)).sum(1),
            torch.bincount(c, minlength=k + 1),
            (masks.long() @ masks.long().T).reshape(-1),
        ]
    )
    gram = (deltas.double() @ deltas.double().T).reshape(-1)
    for run in (probe_device._triton_probe, probe_device._torch_probe):
        counts = torch.zeros(3 * k + 1 + k * k, dtype=torch.int64)
        got_gram = torch.zeros(k * k, dtype=torch.float64)
        invalid = torch.zeros((), dtype=torch.int64)
        run(base, agents, eps, counts, got_gram, invalid)
        assert torch.equal(counts, want)
        torch.testing.assert_close(got_gram, gram, rtol=1e-13, atol=0)  # float64 sums in another order
        assert int(invalid) == 0
    agents[0][7] = float("nan")
    run(base, agents, eps, counts, got_gram, invalid)
    assert int(invalid) == 1


def test_probe_on_the_device_path_equals_the_cpu_probe(monkeypatch):
    base, agents = _agents(torch.bfloat16)
    cpu = ram_live.probe(agents, base=base).to_dict()
    monkeypatch.setattr(checks, "deferred_device", lambda dev: dev.type != "meta")
    report = ram_live.probe(agents, base=base)
    dev = report.to_dict()
    for key in ("agents", "tensors", "layers", "histogram"):
        assert dev[key] == cpu[key], key
    assert dev["pairwise"]["jaccard"] == cpu["pairwise"]["jaccard"]
    # the cosines against float64 sums of the exact products (the CPU's native kernel sums in float32 lanes)
    flat = torch.stack(
        [
            torch.cat([(p.double() - q.double()).reshape(-1) for p, q in zip(a.parameters(), base.parameters())])
            for a in agents
        ]
    )
    gram = flat @ flat.T
    exact = gram / torch.outer(gram.diag(), gram.diag()).sqrt()
    torch.testing.assert_close(torch.tensor(dev["pairwise"]["cosine"], dtype=torch.float64), exact, rtol=1e-12, atol=0)
    torch.testing.assert_close(torch.tensor(cpu["pairwise"]["cosine"], dtype=torch.float64), exact, rtol=1e-6, atol=0)
    assert report.fingerprint == ram_live.probe(agents, base=base).fingerprint
    with torch.no_grad():
        agents[2].a.bias[3] = float("inf")
    with pytest.raises(NonFiniteError, match="agent 'agent_2'"):
        ram_live.probe(agents, base=base)


def test_probe_shape_on_fake_cuda():
    def cost(fc, rows, cols, n):
        base = trace._Stack(fc, rows, cols, n)
        agents = [trace._Stack(fc, rows, cols, n) for _ in range(trace.K)]
        before = fc.rec.copy()
        fc.counting = True
        try:
            ram_live.probe(agents, base=base)
        finally:
            fc.counting = False
        return fc.rec.minus(before)

    with trace.FakeCuda() as fc:
        per = {}
        for rows, cols in trace.SIZES:
            d = cost(fc, rows, cols, 3).minus(cost(fc, rows, cols, 1))
            per[rows * cols] = (d.launches // 2, d.calls // 2, d.syncs // 2)
    small, large = per.values()
    assert large == small  # nothing grows with the tensor's size
    assert large[2] == 0 and large[0] <= 3  # no sync per tensor; the op and the digest's gather


def test_probe_op_with_several_steps_per_program(monkeypatch):
    """Few programs for the tensor (one multiprocessor): each walks several whole blocks unmasked, one takes the
    partial last block; the counts are the torch implementation's, exactly."""
    from ram_live.kernels.device import common

    monkeypatch.setattr(common, "_multiprocessors", lambda device: 1)
    k, n = 3, 8 * 1024 * 2 + 100
    base, agents = _inputs(n, k, torch.bfloat16, seed=5)
    agents[1][n - 3] = float("nan")  # in the partial last block
    got = []
    for run in (probe_device._triton_probe, probe_device._torch_probe):
        counts, gram = torch.zeros(3 * k + 1 + k * k, dtype=torch.int64), torch.zeros(k * k, dtype=torch.float64)
        invalid = torch.zeros((), dtype=torch.int64)
        run(base, agents, 1e-3, counts, gram, invalid)
        got.append((counts, gram, int(invalid)))
    (counts, gram, invalid), (want, want_gram, want_invalid) = got
    assert torch.equal(counts, want) and invalid == want_invalid == 1
    finite = torch.isfinite(want_gram)  # agent 1's row and column hold the NaN
    assert int(finite.sum()) == (k - 1) ** 2
    torch.testing.assert_close(gram[finite], want_gram[finite], rtol=1e-12, atol=0)
