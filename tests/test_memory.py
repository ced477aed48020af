"""Huge-page advice on fresh output buffers: values and behaviour unchanged, small and non-CPU tensors untouched."""

import torch

from ram_live.io import memory


def test_empty_gives_a_usable_tensor_of_the_asked_kind(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_madvise", lambda: lambda start, length, advice: calls.append((start, length, advice)))
    big = memory.empty((3, 1 << 20), dtype=torch.float32, device="cpu")
    assert big.shape == (3, 1 << 20) and big.dtype == torch.float32
    big.fill_(2.0)
    assert float(big.sum()) == 2.0 * big.numel()
    ((start, length, advice),) = calls
    assert advice == 14 and start % (1 << 21) == 0 and length % (1 << 21) == 0
    assert big.data_ptr() <= start and start + length <= big.data_ptr() + big.numel() * 4
    memory.empty((16,), dtype=torch.bfloat16, device="cpu")  # small: no advice
    memory.empty((3, 1 << 20), dtype=torch.float32, device="cpu", hugepages=False)  # the call site's default
    assert len(calls) == 1
    monkeypatch.setenv("RAM_LIVE_HUGEPAGES", "1")
    memory.empty((3, 1 << 20), dtype=torch.float32, device="cpu", hugepages=False)
    assert len(calls) == 2
    monkeypatch.setenv("RAM_LIVE_HUGEPAGES", "0")
    memory.empty((3, 1 << 20), dtype=torch.float32, device="cpu")
    assert len(calls) == 2
