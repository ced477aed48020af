"""Sources: how inputs are named and wrapped."""

from __future__ import annotations

import pytest
import torch

from ram_live import merge
from ram_live.io.sources import RenamedSource, as_source
from ram_live.store import SnapshotStore


def test_a_mapping_names_sources_by_its_keys_even_two_snapshots_of_one_agent(tmp_path) -> None:
    g = torch.Generator().manual_seed(1)
    base = {"w": torch.randn(40, generator=g), "b": torch.randn(5, generator=g)}
    store = SnapshotStore(tmp_path / "s", durable=False)
    store.set_base(base)
    early = {
        k: v + (torch.rand(v.shape, generator=g) < 0.5) * torch.randn(v.shape, generator=g) for k, v in base.items()
    }
    late = {
        k: v + (torch.rand(v.shape, generator=g) < 0.5) * torch.randn(v.shape, generator=g) for k, v in early.items()
    }
    store.snapshot("coder", early, 1)
    store.snapshot("coder", late, 2)
    snaps = {"coder_early": store.open("coder", 1), "coder_late": store.open("coder", 2)}
    merged, info = merge(snaps, method="ram_plus", return_info=True)
    assert info.agents == ("coder_early", "coder_late")
    assert set(info.lambdas) == {"coder_early", "coder_late"}
    expected = merge({"coder_early": early, "coder_late": late}, base=base, method="ram_plus")
    for k in base:
        assert torch.equal(merged[k], expected[k]), k
    wrapped = as_source(snaps["coder_late"], "x")
    assert isinstance(wrapped, RenamedSource) and wrapped.name == "x"
    assert wrapped.keys() == snaps["coder_late"].keys()
    assert as_source(snaps["coder_late"], snaps["coder_late"].name) is snaps["coder_late"]


@pytest.mark.parametrize(
    "dtype, says", [(torch.float8_e4m3fn, "dequantise the checkpoints"), (torch.complex32, "does not merge or copy")]
)
def test_a_dtype_neither_merged_nor_copied_is_refused_naming_the_tensor(dtype, says):
    from ram_live.errors import UnsupportedInputError
    from ram_live.io.sources import StateDictSource

    sd = {"a": torch.zeros(4), "b": torch.zeros(4, dtype=torch.float16), "c": torch.zeros(4).to(dtype)}
    with pytest.raises(UnsupportedInputError, match=rf"coder: tensor 'c' is {dtype}.*{says}"):
        StateDictSource(sd, "coder")


def test_the_first_tensor_at_fault_is_named_in_the_sources_order():
    from ram_live.errors import UnsupportedInputError
    from ram_live.io.sources import StateDictSource

    sd = {
        "ok": torch.zeros(2),
        "fp8": torch.zeros(2).to(torch.float8_e4m3fn),
        "meta": torch.empty(2, device="meta"),
        "fp8b": torch.zeros(2).to(torch.float8_e5m2),
        "c32": torch.zeros(2).to(torch.complex32),
    }
    for _ in range(5):  # not a set's order
        with pytest.raises(UnsupportedInputError, match="tensor 'fp8' is torch.float8_e4m3fn"):
            StateDictSource(sd, "coder")
    del sd["fp8"]
    with pytest.raises(UnsupportedInputError, match="tensor 'meta' is on the meta device"):
        StateDictSource(sd, "coder")
