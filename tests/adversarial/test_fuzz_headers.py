"""Seeded fuzz of safetensors headers: byte flips, truncations and JSON-level mutations of a valid file. Every
mutant is either refused with a library error (RamLiveError) or read exactly as safetensors.safe_open reads it
(same keys, dtypes, shapes, bytes and metadata); anything else (another exception, a file ram_live accepts and
safetensors refuses, different values) fails."""

from __future__ import annotations

import copy
import json
import random
import struct

import torch
from safetensors.torch import save_file

from ram_live import RamLiveError
from ram_live.io.safetensors_io import MappedSafetensors
from tests.adversarial._files import raw_file, safe_read, same_bytes

CASES = 1200
BAD_VALUES = [None, True, -1, 1.5, "3", [], {}, [1, 2], 2**64, 2**70, -(2**63), float("nan"), float("inf")]


def _valid(tmp_path):
    g = torch.Generator().manual_seed(3)
    tensors = {
        "embed.weight": torch.randn(4, 3, generator=g),
        "layer.bias": torch.randn(5, generator=g).to(torch.bfloat16),
        "ids": torch.arange(6, dtype=torch.int64).to(torch.uint16),
        "mask": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 2, dtype=torch.float16),
    }
    path = tmp_path / "valid.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "run": "7"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :], raw


def _json_mutant(rng: random.Random, header: dict, data: bytes) -> tuple[str, bytes]:
    h = copy.deepcopy(header)
    keys = [k for k in h if k != "__metadata__"]
    key = rng.choice(keys)
    kind = rng.randrange(14)
    if kind == 0:
        h[key][rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice(BAD_VALUES)
    elif kind == 1:
        del h[key][rng.choice(["dtype", "shape", "data_offsets"])]
    elif kind == 2:
        h[key]["dtype"] = rng.choice(
            ["F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "U16", "U64", "F8_E4M3", "C64", "F4", "F33", "f32", ""]
        )
    elif kind == 3:
        shape = h[key]["shape"]
        h[key]["shape"] = rng.choice(
            [
                shape[::-1],
                shape + [1],
                shape + [2],
                shape[:-1],
                [s + 1 for s in shape],
                [0] + shape,
                [rng.choice(BAD_VALUES)] + shape,
            ]
        )
    elif kind == 4:
        b, e = h[key]["data_offsets"]
        d = rng.choice([-8, -2, -1, 1, 2, 4, 8, 2**40, 2**64])
        h[key]["data_offsets"] = rng.choice([[b + d, e + d], [b, e + d], [b + d, e], [e, b], [b, b], [0, e - b]])
    elif kind == 5:
        h[key]["data_offsets"] = h[key]["data_offsets"] + [rng.choice([0, 8])]
    elif kind == 6:
        del h[key]
    elif kind == 7:
        h[rng.choice(["new", key + "x"])] = copy.deepcopy(h[rng.choice(keys)])  # overlapping copy
    elif kind == 8:
        h["__metadata__"] = rng.choice([["a"], 3, {"a": 1}, {"a": None}, {"a": {"b": "c"}}, None, {}, "pt"])
    elif kind == 9:
        h = rng.choice([[h], 3, "x", None, [], True])
    elif kind == 10:
        h[key]["extra"] = rng.choice(BAD_VALUES)  # safetensors ignores unknown fields
    elif kind == 11:
        text = json.dumps(h)
        dup = f'"{key}": {json.dumps(h[key])}, '
        return "{" + dup + text[1:], data
    elif kind == 12:
        depth = rng.choice([10, 500, 5000, 60000])
        return json.dumps(h)[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}", data
    else:
        return json.dumps(h), rng.choice(
            [data + b"\0" * rng.choice([1, 8]), data[: -rng.choice([1, 2, 8])], data[: len(data) // 2]]
        )
    return json.dumps(h), data


def _byte_mutant(rng: random.Random, raw: bytes) -> bytes:
    raw = bytearray(raw)
    kind = rng.randrange(4)
    if kind == 0:  # flip bytes anywhere in the length or the header
        (n,) = struct.unpack("<Q", raw[:8])
        for _ in range(rng.choice([1, 1, 2, 5])):
            raw[rng.randrange(8 + n)] ^= 1 << rng.randrange(8)
    elif kind == 1:
        raw = raw[: rng.randrange(len(raw))]
    elif kind == 2:
        raw[rng.randrange(8)] = rng.randrange(256)
    else:  # a byte of the data: still valid, different values
        raw[rng.randrange(len(raw) - 64, len(raw))] ^= 0xFF
    return bytes(raw)


def _check(path) -> str:
    try:
        mapped = MappedSafetensors(path)
        ours = ({k: mapped.tensor(k) for k in mapped.keys()}, dict(mapped.metadata))  # views: no clone, which
        # would turn a bool byte of 0xFE into 1
    except RamLiveError:
        return "refused"
    theirs = safe_read(path)
    assert theirs is not None, f"ram_live reads {path.read_bytes()[:300]!r}, which safetensors refuses"
    assert sorted(ours[0]) == sorted(theirs[0]) and ours[1] == theirs[1]
    for key, tensor in theirs[0].items():
        assert same_bytes(ours[0][key], tensor), key
    return "read"


def test_fuzzed_headers_are_refused_or_read_exactly(tmp_path):
    rng = random.Random(20261203)
    header, data, raw = _valid(tmp_path)
    outcomes = {"refused": 0, "read": 0}
    for i in range(CASES):
        path = tmp_path / f"m{i % 8}.safetensors"
        if i % 3 == 0:
            path.write_bytes(_byte_mutant(rng, raw))
        else:
            text, body = _json_mutant(rng, header, data)
            raw_file(path, text, body)
        outcomes[_check(path)] += 1
    assert sum(outcomes.values()) == CASES
    # both outcomes happen often: the fuzz reaches past the first check and does not only mutate harmlessly
    assert outcomes["refused"] > CASES // 2 and outcomes["read"] > 50, outcomes
