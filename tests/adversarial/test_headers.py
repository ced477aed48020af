"""Hostile and damaged safetensors headers: each is an UnsupportedInputError naming file and key (safetensors
refuses them too), valid files read bit-exact as safetensors reads them, non-regular files never block, and the
CLI reports one line with status 2."""

from __future__ import annotations

import json
import os
import signal
import struct

import pytest
import torch
from safetensors.torch import save_file

from ram_live import UnsupportedInputError
from ram_live.io.st_header import MAX_HEADER
from ram_live.cli import main
from ram_live.io.safetensors_io import MappedSafetensors
from ram_live.io.sources import SafetensorsSource
from tests.adversarial._files import entry, raw_file, safe_read, same_bytes

W = entry("F32", [2], 0, 8)
DATA = struct.pack("<2f", 1.5, -2.0)

# (case, header, data, words the message must hold); every one is refused by safetensors.safe_open as well
BAD = [
    ("list", [W], DATA, ["not an object"]),
    ("number", 3, DATA, ["int, not an object"]),
    ("string", '"x"', DATA, ["not an object"]),
    ("entry a list", {"w": [1, 2]}, DATA, ["'w'", "dtype, shape and data_offsets"]),
    ("no shape", {"w": {"dtype": "F32", "data_offsets": [0, 8]}}, DATA, ["'w'"]),
    ("no dtype", {"w": {"shape": [2], "data_offsets": [0, 8]}}, DATA, ["'w'"]),
    ("no offsets", {"w": {"dtype": "F32", "shape": [2]}}, DATA, ["'w'"]),
    ("unknown dtype", {"w": entry("F33", [2], 0, 8)}, DATA, ["'w'", "F33"]),
    ("dtype not a string", {"w": entry(7, [2], 0, 8)}, DATA, ["'w'"]),  # type: ignore[arg-type]
    ("float dim", '{"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', DATA, ["'w'", "shape"]),
    ("negative dim", {"w": entry("F32", [-2], 0, 8)}, DATA, ["'w'", "shape"]),
    ("bool dim", '{"w":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', DATA[:4], ["'w'", "shape"]),
    ("dims past 2**64", {"w": entry("F32", [2**64], 0, 8)}, DATA, ["'w'", "shape"]),
    ("shape overflows", {"w": entry("F32", [2**40, 2**40], 0, 8)}, DATA, ["'w'", "overflows"]),
    ("shape a string", {"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, DATA, ["'w'", "shape"]),
    ("NaN offset", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[NaN,8]}}', DATA, ["NaN"]),
    ("Infinity offset", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,Infinity]}}', DATA, ["Infinity"]),
    ("float offset", '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}', DATA, ["'w'", "data_offsets"]),
    ("negative offset", {"w": entry("F32", [2], -8, 0)}, DATA, ["'w'", "data_offsets"]),
    ("three offsets", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}}, DATA, ["'w'"]),
    ("offsets wrong size", {"w": entry("F32", [2], 0, 4)}, DATA, ["'w'", "8 bytes"]),
    ("overlap", {"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, DATA, ["'b'", "overlaps"]),
    ("gap", {"w": entry("F32", [1], 4, 8)}, DATA, ["'w'", "gap"]),
    ("trailing bytes", {"w": W}, DATA + b"\0" * 8, ["trailing"]),
    ("truncated data", {"w": W}, DATA[:6], ["truncated"]),
    ("offsets past the file", {"w": entry("F32", [2], 2**62, 2**62 + 8)}, DATA, ["'w'", "gap"]),
    (
        "duplicate field",
        '{"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}',
        DATA,
        ["duplicate key 'dtype'"],
    ),
    ("metadata a list", {"__metadata__": ["a"], "w": W}, DATA, ["'__metadata__'"]),
    ("metadata numbers", {"__metadata__": {"a": 1}, "w": W}, DATA, ["'__metadata__'"]),
    ("metadata nested", {"__metadata__": {"a": {"b": "c"}}, "w": W}, DATA, ["'__metadata__'"]),
    ("deep nesting", "[" * 200_000 + "]" * 200_000, b"", ["nested too deeply"]),
    ("deep nesting in an entry", '{"w":' + '{"a":' * 100_000 + "1" + "}" * 100_001, b"", ["nested too deeply"]),
    ("invalid UTF-8", b'{"\xff":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', DATA, ["unreadable JSON"]),
    ("not JSON", b"{'w': 1}", DATA, ["unreadable JSON"]),
    ("NUL padding", b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\0\0\0', DATA, ["unreadable JSON"]),
]


@pytest.mark.parametrize("case, header, data, words", BAD, ids=[b[0] for b in BAD])
def test_bad_header_is_a_library_error_naming_file_and_key(tmp_path, case, header, data, words):
    path = raw_file(tmp_path / "model.safetensors", header, data)
    with pytest.raises(UnsupportedInputError) as err:
        MappedSafetensors(path)
    message = str(err.value)
    assert str(path) in message
    for word in words:
        assert word in message, (case, message)
    assert safe_read(path) is None  # safetensors refuses each of them too


def test_sub_byte_dtypes_are_refused(tmp_path):
    """F4 (two values a byte): safetensors reads it as a packed torch dtype with half the shape; not merged."""
    path = raw_file(tmp_path / "f4.safetensors", {"w": entry("F4", [16], 0, 8)}, DATA)
    with pytest.raises(UnsupportedInputError, match="'w' has dtype 'F4', which ram_live does not read"):
        MappedSafetensors(path)


def test_duplicate_tensor_names_are_refused(tmp_path):
    """Two entries named "w": safetensors keeps the last silently; which bytes are "w" is ambiguous: refused."""
    text = '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    path = raw_file(tmp_path / "dup.safetensors", text, DATA)
    with pytest.raises(UnsupportedInputError, match="duplicate key 'w'"):
        MappedSafetensors(path)


@pytest.mark.parametrize(
    "length, why", [(2**63, "header length"), (MAX_HEADER + 1, "header length"), (1000, "header length")]
)
def test_header_length_past_the_file_or_the_bound(tmp_path, length, why):
    path = raw_file(tmp_path / "m.safetensors", {"w": W}, DATA, length=length)
    with pytest.raises(UnsupportedInputError, match=why):
        MappedSafetensors(path)


def test_too_short(tmp_path):
    (tmp_path / "m.safetensors").write_bytes(b"\1\0\0")
    with pytest.raises(UnsupportedInputError, match="too short"):
        MappedSafetensors(tmp_path / "m.safetensors")


def _every_dtype() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def bits(n, dtype):
        return torch.randint(0, 256, (n * dtype.itemsize,), generator=g, dtype=torch.uint8).view(dtype)

    out = {
        f"t_{d}".replace("torch.", ""): bits(6, d).view(2, 3)
        for d in (
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.int64,
            torch.int32,
            torch.int16,
            torch.int8,
            torch.uint8,
            torch.uint16,
            torch.uint32,
            torch.uint64,
            torch.float8_e4m3fn,
            torch.float8_e5m2,
            torch.complex64,
        )
    }
    out["flags"] = torch.tensor([True, False, True])
    out["scalar"] = torch.tensor(3.25)
    out["empty"] = torch.zeros(0, 4)
    return out


def test_valid_files_read_bit_exact_as_safetensors_reads_them(tmp_path):
    tensors = _every_dtype()
    path = tmp_path / "all.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "note": "é"})
    reference, metadata = safe_read(path)
    mapped = MappedSafetensors(path)
    assert sorted(mapped.keys()) == sorted(reference)
    assert mapped.metadata == metadata == {"format": "pt", "note": "é"}
    for key, want in reference.items():
        assert same_bytes(mapped.tensor(key), want), key
        assert same_bytes(want, tensors[key]), key


def _alarm(seconds: int):
    def on_alarm(signum, frame):
        raise TimeoutError("blocked")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    return previous


@pytest.mark.parametrize("where", ["file", "folder", "shard of an index", "index"])
def test_a_fifo_never_blocks(tmp_path, where):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    if where == "index":
        os.mkfifo(folder / "model.safetensors.index.json")
    elif where == "shard of an index":
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "pipe.safetensors"}}))
        os.mkfifo(folder / "pipe.safetensors")
    else:
        os.mkfifo(folder / "model.safetensors")
    target = folder / "model.safetensors" if where == "file" else folder
    previous = _alarm(10)
    try:
        with pytest.raises(UnsupportedInputError, match="not a regular file"):
            SafetensorsSource(target)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_not_read(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with pytest.raises(UnsupportedInputError, match="not a regular file"):
        MappedSafetensors(device)


def test_a_folder_named_like_a_file(tmp_path):
    (tmp_path / "x.safetensors").mkdir()
    with pytest.raises(UnsupportedInputError, match="is a folder"):
        MappedSafetensors(tmp_path / "x.safetensors")


def test_cli_reports_a_bad_header_in_one_line_with_status_2(tmp_path, capsys):
    save_file({"w": torch.ones(2)}, str(tmp_path / "base.safetensors"))
    raw_file(tmp_path / "agent.safetensors", [W], DATA)
    status = main(
        [
            "merge",
            f"a={tmp_path / 'agent.safetensors'}",
            "--base",
            str(tmp_path / "base.safetensors"),
            "--out",
            str(tmp_path / "out.safetensors"),
            "-q",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("ram-live: error: ") and "agent.safetensors" in err and "not an object" in err
    assert not (tmp_path / "out.safetensors").exists()
