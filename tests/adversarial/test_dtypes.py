"""Dtypes: every dtype safetensors reads is read (U16/U32/U64 included) and treated the same in a file and in a
state dict; FP8 is refused with a library error naming agent and tensor, never torch's NotImplementedError."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from ram_live import InputMismatchError, UnsupportedInputError, merge, probe
from ram_live.io.safetensors_io import MappedSafetensors
from tests.adversarial._files import safe_read, same_bytes
from tests.conftest import assert_bit_identical

UINTS = [torch.uint16, torch.uint32, torch.uint64]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
METHODS = ["ram", "ram_plus", "ties", "task_arithmetic", "linear", "dare_ties"]


def _inputs(extra: dict[str, torch.Tensor]):
    base = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), **extra}

    def copies():
        return {k: v.clone() for k, v in extra.items()}

    agents = {
        "a": {"w": base["w"] + torch.tensor([[0.5, 0.0], [0.0, 0.0]]), **copies()},
        "b": {"w": base["w"] + torch.tensor([[0.0, 0.0], [0.0, -1.0]]), **copies()},
    }
    return base, agents


def _to_files(tmp_path, base, agents):
    save_file(base, str(tmp_path / "base.safetensors"))
    for name, sd in agents.items():
        save_file(sd, str(tmp_path / f"{name}.safetensors"))
    return tmp_path / "base.safetensors", {n: tmp_path / f"{n}.safetensors" for n in agents}


@pytest.mark.parametrize("dtype", UINTS, ids=str)
def test_unsigned_tensors_merge_the_same_from_files_and_state_dicts(tmp_path, dtype):
    ids = torch.tensor([1, 2, 60000, 7], dtype=torch.int64).to(dtype)
    base, agents = _inputs({"ids": ids})
    want = {"w": torch.tensor([[1.5, 2.0], [3.0, 3.0]]), "ids": ids}
    base_file, agent_files = _to_files(tmp_path, base, agents)
    reference = safe_read(agent_files["a"])[0]
    assert same_bytes(MappedSafetensors(agent_files["a"]).tensor("ids"), reference["ids"])
    from_dicts = merge(agents, base=base, method="task_arithmetic", scale=1.0)
    from_files = merge(agent_files, base=base_file, method="task_arithmetic", scale=1.0)
    assert_bit_identical(
        {k: v.view(torch.uint8) if not v.dtype.is_floating_point else v for k, v in from_dicts.items()},
        {k: v.view(torch.uint8) if not v.dtype.is_floating_point else v for k, v in want.items()},
    )
    assert same_bytes(from_files["ids"], from_dicts["ids"]) and torch.equal(from_files["w"], from_dicts["w"])


@pytest.mark.parametrize("dtype", UINTS, ids=str)
def test_unsigned_tensors_that_differ_are_an_error_in_both(tmp_path, dtype):
    base, agents = _inputs({"ids": torch.tensor([1, 2], dtype=torch.int64).to(dtype)})
    agents["b"]["ids"] = torch.tensor([1, 3], dtype=torch.int64).to(dtype)
    base_file, agent_files = _to_files(tmp_path, base, agents)
    for b, a in ((base, agents), (base_file, agent_files)):
        with pytest.raises(InputMismatchError, match="'ids' of agent 'b' differs"):
            merge(a, base=b, method="ram")


@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_fp8_in_a_state_dict_is_a_library_error(dtype, method):
    base, agents = _inputs({})
    base = {k: v.to(dtype) for k, v in base.items()}
    agents = {n: {k: v.to(dtype) for k, v in sd.items()} for n, sd in agents.items()}
    with pytest.raises(UnsupportedInputError, match=rf"tensor 'w' is {dtype}, which ram_live does not merge"):
        merge(agents, base=base, method=method)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_in_a_file_is_read_but_not_merged(tmp_path, dtype):
    base, agents = _inputs({})
    agents["a"]["scale"] = base["scale"] = torch.tensor([0.5, 0.25]).to(dtype)
    base_file, agent_files = _to_files(tmp_path, base, agents)
    assert same_bytes(MappedSafetensors(base_file).tensor("scale"), safe_read(base_file)[0]["scale"])
    del agents["b"], agent_files["b"]
    for b, a in ((base_file, agent_files), (base, agents)):
        with pytest.raises(UnsupportedInputError, match="tensor 'scale'.*does not merge"):
            merge(a, base=b, method="ram_plus")
        with pytest.raises(UnsupportedInputError, match="tensor 'scale'.*does not merge"):
            probe(a, base=b)


def test_fp8_buffer_of_a_module_is_a_library_error():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("codes", torch.zeros(4).to(torch.float8_e4m3fn))

    base, agent = Net(), Net()
    with pytest.raises(UnsupportedInputError, match="'codes'"):
        merge([agent], base=base, method="ram")


def _exotic(dtype):
    if dtype == torch.quint8:
        return torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8)
    return torch.zeros(8, dtype=torch.uint8).view(dtype)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # torch deprecates quantised tensors
@pytest.mark.parametrize(
    "dtype", [torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, torch.complex32, torch.bits8, torch.quint8], ids=str
)
def test_dtypes_neither_merged_nor_copied_are_a_library_error(dtype):
    base = {"w": torch.ones(2), "x": _exotic(dtype)}
    agents = {"a": {"w": torch.full((2,), 2.0), "x": _exotic(dtype)}}
    with pytest.raises(UnsupportedInputError, match=rf"tensor 'x' is {dtype}, which ram_live does not merge"):
        merge(agents, base=base, method="ram")


def test_complex128_is_copied_from_the_base():
    z = torch.tensor([1 + 2j, -3j], dtype=torch.complex128)
    out = merge(
        {"a": {"w": torch.full((2,), 2.0), "z": z.clone()}},
        base={"w": torch.ones(2), "z": z},
        method="task_arithmetic",
        scale=1.0,
    )
    assert torch.equal(out["z"], z) and torch.equal(out["w"], torch.full((2,), 2.0))
