"""ram_live.engine.reader.on_current: an accelerator named without an index is the current one when a merge starts,
in merge() and in a search's merger (whose worker may choose its GPU after the merger was made)."""

import pytest
import torch

from ram_live import merge
from ram_live.engine import run as run_mod
from ram_live.engine.grouped import _here
from ram_live.engine.reader import on_current
from ram_live.selection.target import DictTarget, Merger
from ram_live.types import Plan


class _Stop(Exception):
    pass


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda's queries as on a machine of two GPUs; ``current[0]`` is the current one; the merge stops where
    it makes its Reader, recording the device it reads on."""
    current, read_on = [0], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])

    def reader(base, agents, device):
        read_on.append(device)
        raise _Stop

    monkeypatch.setattr(run_mod, "Reader", reader)
    return current, read_on


def test_cuda_is_the_current_device_when_the_merge_starts(two_gpus, base_sd):
    current, read_on = two_gpus
    current[0] = 1
    assert on_current(torch.device("cuda")) == torch.device("cuda", 1)
    assert on_current(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert on_current(torch.device("cpu")) == torch.device("cpu")
    assert not _here(on_current(torch.device("cuda")), torch.device("cuda", 0))  # cuda:0's weights are copied
    assert _here(on_current(torch.device("cuda")), torch.device("cuda", 1))  # cuda:1's are merged where they are
    with pytest.raises(_Stop):
        merge({"a": base_sd, "b": base_sd}, base=base_sd, device="cuda")
    merger = Merger({"a": base_sd, "b": base_sd}, base_sd, device="cuda")
    current[0] = 0  # a search worker chooses its GPU after its merger was made
    with pytest.raises(_Stop):
        merger.merge({"method": "task_arithmetic"})
    assert read_on == [torch.device("cuda", 1), torch.device("cuda", 0)]
    target = DictTarget(torch.device("cuda"))
    target.begin(Plan(merge=(), copy=(), alias={}, check_equal=()), {})
    assert target.here == torch.device("cuda", 0)


def test_a_backend_that_is_not_here_is_never_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: pytest.fail("current_device asked"))
    assert on_current(torch.device("cuda")) == torch.device("cuda")
    assert on_current(torch.device("mps")) == torch.device("mps")  # no current_device: as it is
