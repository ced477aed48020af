"""The streaming benchmark's floors move exactly a merge's bytes: each floor's output is the last input's tensors
bit for bit, in the base's shard layout (so every input range was read and every output byte written), with work
items that cross tensor and page boundaries; and ``benchmarks/_host.py`` names the ISA from the cpuinfo flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import _host
import bench_stream

# bf16 bytes: 700,000 / 74 / 614,400; with shard_bytes 800,000 the floors' output has two shards, [a, b] and [c]
SHAPES = {"a.weight": (700, 500), "b.bias": (37,), "c.weight": (300, 1024)}
SHARDS = {"model-00001-of-00002.safetensors": ["a.weight", "b.bias"], "model-00002-of-00002.safetensors": ["c.weight"]}


def _folders(root: Path, n: int) -> list[Path]:
    folders = []
    g = torch.Generator().manual_seed(7)
    for i in range(n):
        folder = root / f"m{i}"
        folder.mkdir()
        weight_map = {}
        for shard, keys in SHARDS.items():
            save_file(
                {k: torch.randn(SHAPES[k], generator=g).to(torch.bfloat16) for k in keys},
                str(folder / shard),
                metadata={"format": "pt"},
            )
            weight_map.update(dict.fromkeys(keys, shard))
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        (folder / "config.json").write_text("{}")
        folders.append(folder)
    return folders


def _read(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for key, shard in index.items():
        with safe_open(str(folder / shard), framework="pt") as f:
            out[key] = f.get_tensor(key)
    return out


@pytest.mark.parametrize("io", ["pread", "mmap"])
@pytest.mark.parametrize("chunk", [bench_stream.FLOOR_CHUNK, 5000])
def test_parallel_floor_writes_the_last_inputs_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io: str, chunk: int
) -> None:
    monkeypatch.setattr(bench_stream, "FLOOR_CHUNK", chunk)
    folders = _folders(tmp_path, 3)
    out = tmp_path / "out"
    result = bench_stream.child_floor_parallel(
        {"inputs": [str(f) for f in folders], "out": str(out), "io": io, "shard_bytes": 800_000}
    )
    assert result["workers"] >= 1 and result["t_end"] >= result["t_start"]
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(SHARDS)
    got, want = _read(out), _read(folders[-1])
    assert list(got) == sorted(SHAPES)
    for key in SHAPES:
        assert got[key].dtype == torch.bfloat16 and got[key].shape == SHAPES[key]
        assert torch.equal(got[key].view(torch.int16), want[key].view(torch.int16)), key
    # the single-thread row writes the same bytes
    single = tmp_path / "single"
    bench_stream.child_floor(
        {"inputs": [str(f) for f in folders], "out": str(single), "io": "mmap", "shard_bytes": 800_000}
    )
    for shard in SHARDS:
        assert (single / shard).read_bytes() == (out / shard).read_bytes()


def test_isa_from_cpuinfo_flags() -> None:
    x86 = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx avx2 {}\n\nprocessor\t: 1\n"
    assert _host.isa_of(x86.format("avx512f avx512bw"), "x86_64") == "AVX-512"
    assert _host.isa_of(x86.format(""), "x86_64") == "AVX2"
    # whole flags only: avx512_vnni alone (no avx512f) is not AVX-512
    assert _host.isa_of(x86.format("avx512_vnni"), "x86_64") == "AVX2"
    assert _host.isa_of("flags\t\t: fpu sse2 avx\n", "x86_64") == "x86_64"
    assert _host.isa_of("processor\t: 0\nFeatures\t: fp asimd evtstrm\n", "aarch64") == "aarch64"
    assert _host.cpu_label().endswith(f"({_host.cpu_isa()})")
