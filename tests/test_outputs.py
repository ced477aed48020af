"""Merged folders that load and can be traced (ram_live/io/model_files.py, through ram_live/io/outputs.py and the
sinks): every kind of base that has a config — a live transformers model, a folder, a cached id, a snapshot store
made from one — gives a folder that ``AutoModelForCausalLM.from_pretrained`` loads, with the merge's weights bit
for bit, the base's tokenizer, and a ``ram_merge.json`` whose checksums are recomputed here from the inputs."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

import evaluate_helpers as h  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import ram_live  # noqa: E402
from ram_live import merge  # noqa: E402
from ram_live.cli import main  # noqa: E402
from ram_live.errors import NonFiniteError  # noqa: E402
from ram_live.store import SnapshotStore  # noqa: E402
from ram_live import RAMSchedule  # noqa: E402
from test_hub import add_to_cache  # noqa: E402

RAM_PLUS_OPTIONS = {
    "r": 0.1,
    "alpha": 2.0,
    "shared": "mean",
    "activity": "abs",
    "eps": 1e-05,
    "rho_scope": "global",
    "exclude": [],
}
NOT_COPIED = ("pytorch_model.bin", "tf_model.h5", "pytorch_model.bin.index.json", ".hidden", "adapter_config.json")
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def moved(seed: int, density: float = 0.3) -> transformers.LlamaForCausalLM:
    """The base (seed 0) plus a sparse random change: an agent."""
    m = h.model(0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_((torch.rand(p.shape, generator=g) < density) * torch.randn(p.shape, generator=g) * 0.05)
    return m


def crc_of_file(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}


def crc_of_tensors(state: dict[str, torch.Tensor]) -> str:
    crc = 0
    for t in state.values():
        crc = zlib.crc32(t.contiguous().view(torch.uint8).numpy().tobytes(), crc)
    return f"{crc:08x}"


def loads_as(folder: Path, expected: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> None:
    """``from_pretrained(folder)`` works (in the config's dtype) and holds ``expected`` bit for bit."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    assert type(model).__name__ == "LlamaForCausalLM"
    state = model.state_dict()
    assert sorted(state) == sorted(expected)
    for key, value in expected.items():
        assert state[key].dtype == dtype == value.dtype, key
        assert torch.equal(state[key].view(torch.uint8), value.view(torch.uint8)), key


def tokenizes_like(folder: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok("two plus two =")["input_ids"] == h.tokenizer()("two plus two =")["input_ids"]
    assert tok.chat_template == h.CHAT


def record(folder: Path) -> dict:
    document = json.loads((folder / "ram_merge.json").read_text())
    assert document["format"] == "ram_live.merge" and document["version"] == 1
    assert document["ram_live"] == ram_live.__version__
    return document


@pytest.fixture
def base_folder(tmp_path) -> Path:
    """The base saved as a Hugging Face folder with its tokenizer, and files that must not be copied."""
    folder = tmp_path / "base"
    h.model(0).save_pretrained(folder)
    h.tokenizer().save_pretrained(folder)
    for name in NOT_COPIED[:-1]:  # an adapter_config.json would make transformers load the base as an adapter
        (folder / name).write_text("not a side file")
    (folder / "ram_merge.json").write_text('{"an": "older merge"}')
    (folder / "README.md").write_text("the base")
    return folder


def test_a_live_model_base_gives_a_loadable_traced_folder(tmp_path):
    base, agents = h.model(0), {"a": moved(1), "b": moved(2)}
    architectures = base.config.architectures
    expected = merge(agents, base=base.state_dict())
    out = merge(agents, base=base, out=tmp_path / "merged", max_shard_bytes=30_000)
    names = sorted(p.name for p in out.iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "ram_merge.json"} <= set(names)
    assert len([n for n in names if n.endswith(".safetensors")]) > 1  # sharded, and still loads
    loads_as(out, expected)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert config["model_type"] == "llama" and config["hidden_size"] == 32
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 1
    assert base.config.architectures == architectures  # the live model's config is not changed
    doc = record(out)
    assert doc["method"] == "ram_plus" and doc["options"] == RAM_PLUS_OPTIONS and doc["dtype"] is None
    assert doc["base"] == {
        "name": "base",
        "kind": "module",
        "tensors_crc32": crc_of_tensors(base.state_dict()),
        "class": "LlamaForCausalLM",
    }
    assert doc["agents"] == [
        {"name": n, "kind": "module", "tensors_crc32": crc_of_tensors(m.state_dict())} for n, m in agents.items()
    ]
    _, info = merge(agents, base=base.state_dict(), return_info=True)
    assert doc["lambdas"] == info.lambdas and set(doc["rho"]) == {"a", "b"}


def test_a_live_model_loaded_from_a_folder_brings_its_tokenizer(tmp_path, base_folder):
    base = transformers.AutoModelForCausalLM.from_pretrained(base_folder)
    agents = [moved(1), moved(2)]
    out = merge(agents, base=base, out=tmp_path / "merged", method="ties", density=0.5)
    loads_as(out, merge(agents, base=base.state_dict(), method="ties", density=0.5))
    tokenizes_like(out)
    assert (out / "README.md").read_text() == "the base"
    for name in NOT_COPIED:
        assert not (out / name).exists(), name
    doc = record(out)
    assert doc["method"] == "ties" and doc["options"]["density"] == 0.5
    assert doc["base"]["files_from"] == str(base_folder) and doc["base"]["kind"] == "module"
    assert [a["name"] for a in doc["agents"]] == ["agent_0", "agent_1"]


def test_a_folder_base_with_dtype_loads_in_that_dtype(tmp_path, base_folder):
    for i in (1, 2):
        moved(i).save_pretrained(tmp_path / f"agent{i}")
    agents = {"coder": str(tmp_path / "agent1"), "tools": tmp_path / "agent2"}
    (base_folder / "adapter_config.json").write_text("{}")  # a folder base is read by ram_live only
    expected = merge(agents, base=base_folder, dtype=torch.bfloat16)
    out = merge(agents, base=str(base_folder), out=tmp_path / "merged", dtype=torch.bfloat16)
    loads_as(out, expected, torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((base_folder / "config.json").read_text())["dtype"] == "float32"  # the base's is untouched
    tokenizes_like(out)
    assert not any((out / name).exists() for name in NOT_COPIED)
    doc = record(out)
    assert doc["dtype"] == "bfloat16" and "older merge" not in (out / "ram_merge.json").read_text()
    for entry, (name, given) in zip(doc["agents"], agents.items()):
        folder = Path(given)
        assert entry == {
            "name": name,
            "given": str(given),
            "kind": "safetensors",
            "path": str(folder),
            "files": [{"name": "model.safetensors", **crc_of_file(folder / "model.safetensors")}],
        }
    assert doc["base"]["path"] == str(base_folder) and doc["base"]["given"] == str(base_folder)
    assert doc["base"]["files"] == [{"name": "model.safetensors", **crc_of_file(base_folder / "model.safetensors")}]


def test_a_cached_id_base_loads(tmp_path, monkeypatch, base_folder):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.chdir(tmp_path)
    snaps = {"org/base": add_to_cache(hub, "org/base", {p.name: p.read_bytes() for p in base_folder.iterdir()})}
    for i, repo in ((1, "org/a"), (2, "org/b")):
        moved(i).save_pretrained(tmp_path / repo)
        snaps[repo] = add_to_cache(hub, repo, {p.name: p.read_bytes() for p in (tmp_path / repo).iterdir()}, ref="v2")
    agents = {"a": "org/a@v2", "b": "org/b@v2"}
    out = merge(agents, base="org/base", out=tmp_path / "merged")
    loads_as(out, merge({"a": moved(1), "b": moved(2)}, base=h.model(0).state_dict()))
    tokenizes_like(out)
    assert not (out / "pytorch_model.bin").exists()
    doc = record(out)
    assert doc["base"]["given"] == "org/base" and doc["base"]["path"] == str(snaps["org/base"])
    for entry, (name, given) in zip(doc["agents"], agents.items()):
        snap = snaps[given.split("@")[0]]
        assert entry["given"] == given and entry["path"] == str(snap)
        assert entry["files"] == [{"name": "model.safetensors", **crc_of_file(snap / "model.safetensors")}]


def test_the_cli_merge_of_a_store_made_in_training_loads(tmp_path, base_folder, capsys):
    """A store whose base was a live model (here attached by a training schedule) keeps its config and tokenizer;
    ``ram-live merge --store`` writes a folder that loads, and names each snapshot's checksummed files."""
    store = tmp_path / "store"
    for name, seed in (("a", 1), ("b", 2)):
        model = transformers.AutoModelForCausalLM.from_pretrained(base_folder)
        schedule = RAMSchedule(store, name, durable=False)
        schedule.attach(model)
        with torch.no_grad():
            for p, q in zip(model.parameters(), moved(seed).parameters()):
                p.copy_(q)
        schedule.snapshot(model, 10)
    kept = store / "_base" / "model"
    assert {"config.json", "generation_config.json", "README.md"} | TOKENIZER_FILES == {p.name for p in kept.iterdir()}
    out = tmp_path / "merged"
    capsys.readouterr()
    assert main(["merge", "--store", str(store), "--out", str(out), "--dtype", "bf16"]) == 0
    assert "no config.json" not in capsys.readouterr().out
    snapshots = SnapshotStore(store).latest_all()
    loads_as(out, merge(snapshots, dtype=torch.bfloat16), torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    tokenizes_like(out)
    doc = record(out)
    assert [(a["name"], a["kind"], a["agent"], a["step"]) for a in doc["agents"]] == [
        ("a", "snapshot", "a", 10),
        ("b", "snapshot", "b", 10),
    ]
    for entry, snap in zip(doc["agents"], snapshots.values()):
        assert entry["store"] == str(store) and entry["base_fingerprint"] == snap.manifest["base_fingerprint"]
        assert entry["files"] == snap.manifest["files"]
        for f in entry["files"]:
            assert crc_of_file(store / entry["agent"] / f["name"]) == {"bytes": f["bytes"], "crc32": f["crc32"]}
    base = json.loads((store / "_base" / "base.json").read_text())
    assert doc["base"]["kind"] == "store base" and doc["base"]["fingerprint"] == base["fingerprint"]
    assert doc["base"]["files"] == base["files"]


def test_a_store_of_state_dicts_gives_weights_and_provenance_only(tmp_path, base_sd, capsys):
    """A base without a config (a state dict) gives no config to copy: the folder holds weights and
    ``ram_merge.json``, and ``ram-live merge`` says that it will not load as it is."""
    store = SnapshotStore(tmp_path / "store", durable=False)
    agent = {k: v + 0.01 for k, v in base_sd.items()}
    store.writer("a", base=base_sd).snapshot(agent, 1)
    assert not (tmp_path / "store" / "_base" / "model").exists()
    out = merge(store.latest_all(), out=tmp_path / "merged")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "ram_merge.json"]
    assert record(out)["agents"][0]["kind"] == "snapshot"
    capsys.readouterr()
    assert main(["merge", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "cli")]) == 0
    assert (
        f"note: {tmp_path / 'cli'} holds the weights and ram_merge.json but no config.json" in capsys.readouterr().out
    )


def test_a_single_file_output_holds_the_weights_only(tmp_path):
    base, agents = h.model(0), [moved(1), moved(2)]
    out = merge(agents, base=base, out=tmp_path / "merged.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["merged.safetensors"]
    expected = merge(agents, base=base.state_dict())
    assert all(torch.equal(v, expected[k]) for k, v in load_file(out).items())


def test_bad_input_writes_nothing(tmp_path, base_folder):
    base = transformers.AutoModelForCausalLM.from_pretrained(base_folder)
    bad = moved(1)
    with torch.no_grad():
        bad.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError):
        merge([moved(2), bad], base=base, out=tmp_path / "out" / "merged")
    assert sorted(os.listdir(tmp_path)) == ["base"]


@pytest.mark.parametrize(
    "method, options",
    [("ram_plus", {"r": 0.2}), ("ram", {"exclude": ("b",)}), ("ties", {"density": 0.4}), ("dare_ties", {"seed": 3})],
)
def test_the_recorded_method_and_options_repeat_the_merge(tmp_path, base_sd, method, options):
    g = torch.Generator().manual_seed(5)

    def agent():
        return {
            k: v + (torch.rand(v.shape, generator=g) < 0.3) * torch.randn(v.shape, generator=g)
            for k, v in base_sd.items()
        }

    agents = {n: agent() for n in "abc"}
    out = merge(agents, base=base_sd, method=method, out=tmp_path / "merged", **options)
    doc = record(out)
    again = merge(agents, base=base_sd, method=doc["method"], **doc["options"])
    written = load_file(out / "model.safetensors")
    assert sorted(again) == sorted(written)
    assert all(torch.equal(again[k], written[k]) for k in again)
    assert doc["base"] == {"name": "base", "kind": "state dict", "tensors_crc32": crc_of_tensors(base_sd)}


def test_file_checksums_over_several_windows(tmp_path, monkeypatch):
    from ram_live.io import model_files

    monkeypatch.setattr(model_files, "_WINDOW", 1 << 16)
    for size in (0, 1, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, 300_001):
        data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(size))
        path = tmp_path / f"f{size}"
        path.write_bytes(data.numpy().tobytes())
        assert model_files.file_crc32(path) == crc_of_file(path)["crc32"], size
