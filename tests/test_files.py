"""Checkpoints on disk: safetensors files and sharded Hugging Face folders in, safetensors out, atomically."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live import NonFiniteError, merge
from tests.conftest import assert_bit_identical, make_agents, snapshot


def _bf16_files(tmp_path, base_sd):
    """A bf16 base and three sparse agents, in memory and as safetensors files (base, agent paths)."""
    base = {k: v.to(torch.bfloat16) for k, v in base_sd.items()}
    agents = make_agents(base, [0.05, 0.5, 0.6], scale=0.05)
    save_file(base, tmp_path / "base.safetensors")
    paths = []
    for i, a in enumerate(agents):
        save_file(a, tmp_path / f"a{i}.safetensors")
        paths.append(str(tmp_path / f"a{i}.safetensors"))
    return base, agents, paths


def test_safetensors_files_in_state_dict_out(tmp_path, base_sd):
    base, agents, paths = _bf16_files(tmp_path, base_sd)
    from_disk = merge(paths, base=tmp_path / "base.safetensors")
    assert_bit_identical(from_disk, merge(agents, base=base))
    out = merge(paths, base=tmp_path / "base.safetensors", out=tmp_path / "merged.safetensors")
    assert out == tmp_path / "merged.safetensors"
    assert_bit_identical(load_file(out), from_disk)


@pytest.fixture(scope="module")
def llama_folders(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("llama")
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    base.save_pretrained(root / "base", max_shard_size="20KB")
    agents = []
    for i, density in enumerate([0.03, 0.46, 0.54]):
        agent = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        agent.load_state_dict(base.state_dict())
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(
                    ((torch.rand(p.shape, generator=g) < density) * torch.randn(p.shape, generator=g) * 0.02).to(
                        p.dtype
                    )
                )
        agent.save_pretrained(root / f"agent{i}", max_shard_size="20KB")
        agents.append(agent)
    return root, base, agents


def test_sharded_hf_folders_in_and_out(tmp_path, llama_folders):
    transformers = pytest.importorskip("transformers")
    root, base, agents = llama_folders
    assert len(list((root / "base").glob("*.safetensors"))) > 1  # really sharded, with an index
    live = merge(agents, base=base)
    out = merge(
        [root / f"agent{i}" for i in range(3)],
        base=root / "base",
        method="ram_plus",
        out=tmp_path / "merged",
        max_shard_bytes=20_000,
    )
    files = sorted(p.name for p in out.iterdir())
    assert "config.json" in files and "model.safetensors.index.json" in files
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {f for f in files if f.endswith(".safetensors")}
    reloaded = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert_bit_identical(snapshot(reloaded), snapshot(live))
    same_loading = transformers.LlamaForCausalLM.from_pretrained(root / "base", dtype=torch.bfloat16)
    same_loading.load_state_dict(live.state_dict())  # bf16 `.to()` also cast the rotary buffers: load alike
    ids = torch.arange(10).view(1, 10)
    assert torch.equal(reloaded(ids).logits, same_loading(ids).logits)
    assert not list(tmp_path.glob(".merged.tmp-*"))


def test_failed_file_merge_writes_nothing(tmp_path, base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    agents[1]["head.weight"][2, 2] = float("nan")  # the last tensor: earlier ones are already merged
    with pytest.raises(NonFiniteError):
        merge(agents, base=base_sd, out=tmp_path / "out")
    with pytest.raises(NonFiniteError):
        merge(agents, base=base_sd, out=tmp_path / "out.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_output_dtype_option(base_sd):
    agents = make_agents(base_sd, [0.5])
    out = merge(agents, base=base_sd, dtype=torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in out.values())


def test_streaming_releases_mapped_pages_range_by_range(tmp_path, base_sd, monkeypatch):
    """With the native kernels, file inputs and file outputs drop each merged range's pages (not whole tensors
    at the end), and the result is unchanged."""
    import ram_live.methods.ram.native as native
    from ram_live.io.safetensors_io import MappedSafetensors, SafetensorsWriter

    if native.kernels() is None:
        pytest.skip("no C compiler: native kernels unavailable")
    base, agents, paths = _bf16_files(tmp_path, base_sd)
    read, written = [], []
    release, done = MappedSafetensors.release, SafetensorsWriter.done
    monkeypatch.setattr(
        MappedSafetensors,
        "release",
        lambda self, key, start=0, stop=None: read.append((key, start, stop)) or release(self, key, start, stop),
    )
    monkeypatch.setattr(
        SafetensorsWriter,
        "done",
        lambda self, key, start=0, stop=None: written.append((key, start, stop)) or done(self, key, start, stop),
    )
    monkeypatch.setattr("ram_live.engine.threads.NATIVE_CHUNK", 64)
    for variant in ("ram", "ram_plus"):
        read.clear()
        written.clear()
        out = merge(paths, base=tmp_path / "base.safetensors", method=variant, out=tmp_path / f"{variant}.safetensors")
        assert_bit_identical(load_file(out), merge(agents, base=base, method=variant))
        big = max(base, key=lambda k: base[k].numel())
        n = base[big].numel()
        assert n > 64
        expected = {(big, s, min(n, s + 64)) for s in range(0, n, 64)}
        assert expected <= set(written)  # every range of the output, as it was merged
        assert expected <= set(read)  # and of every input (4 files each)
        assert sum(1 for r in read if r in expected) == (4 if variant == "ram" else 8) * len(expected)
