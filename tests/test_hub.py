"""Models by Hugging Face id (``org/name[@revision]``), resolved from the local cache only (ram_live/io/hub.py), in
every path that takes a model: the API, the CLI, mergekit YAML and the evaluation's model/tokenizer. The cache is
built in tmp_path with the hub's own layout (blobs, refs, snapshot symlinks) and pointed at by HF_HUB_CACHE; the
network is switched off for every test."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ram_live import merge, probe
from ram_live.errors import ConfigError, UnsupportedInputError
from ram_live.io.hub import cached_snapshot, hub_cache, resolve_model, split_id

pytest.importorskip("huggingface_hub")


def make_agents(base: dict[str, torch.Tensor], densities: list[float], seed: int) -> list[dict[str, torch.Tensor]]:
    """Agents = base + sparse random deltas of the given densities."""
    g = torch.Generator().manual_seed(seed)
    return [
        {
            k: v + torch.randn(v.shape, generator=g) * 0.01 * (torch.rand(v.shape, generator=g) < d)
            for k, v in base.items()
        }
        for d in densities
    ]


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection attempt fails the test: resolution is local_files_only."""

    def refuse(*args, **kwargs):
        raise AssertionError("ram_live tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _commit(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def add_to_cache(cache: Path, repo: str, files: dict[str, bytes], ref: str | None = "main") -> Path:
    """One snapshot of ``repo`` in the hub cache layout: ``models--org--name/blobs/<sha>``,
    ``snapshots/<commit>/<file>`` symlinks to them, ``refs/<ref>`` holding the commit; returns the snapshot folder."""
    root = cache / ("models--" + repo.replace("/", "--"))
    commit = _commit(f"{repo}/{ref}/{sorted(files)}/{[hashlib.sha256(b).hexdigest() for b in files.values()]}")
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    if ref is not None:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snap


def _model_files(sd: dict[str, torch.Tensor], tmp: Path) -> dict[str, bytes]:
    save_file(sd, tmp / "w.safetensors")
    return {
        "model.safetensors": (tmp / "w.safetensors").read_bytes(),
        "config.json": json.dumps({"model_type": "toy"}).encode(),
    }


@pytest.fixture
def cache(tmp_path, monkeypatch, base_sd):
    """HF_HUB_CACHE = tmp_path/hub with org/base, org/a, org/b (main) and org/a at tag v2 (other weights);
    returns ``(cache, {name: snapshot folder}, {name: state dict})``."""
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.chdir(tmp_path)  # relative ids are not folders here
    a, b, a2 = make_agents(base_sd, [0.1, 0.3, 0.2], seed=3)
    models = {"base": base_sd, "a": a, "b": b}
    folders = {n: add_to_cache(hub, f"org/{n}", _model_files(sd, tmp_path)) for n, sd in models.items()}
    folders["a@v2"] = add_to_cache(hub, "org/a", _model_files(a2, tmp_path), ref="v2")
    models["a@v2"] = a2
    return hub, folders, models


def test_merge_by_id_equals_merge_of_the_snapshot_folder(cache, tmp_path):
    hub, folders, _ = cache
    by_id = merge({"a": "org/a", "b": "org/b"}, base="org/base")
    by_folder = merge({"a": str(folders["a"]), "b": str(folders["b"])}, base=str(folders["base"]))
    assert_bit_identical(by_id, by_folder)
    out = merge({"a": "org/a", "b": "org/b"}, base="org/base", out=tmp_path / "merged")
    assert_bit_identical(load_file(Path(out) / "model.safetensors"), by_folder)
    assert (Path(out) / "config.json").is_file()  # the base's side files, copied from its snapshot folder
    report = probe({"a": "org/a", "b": "org/b"}, base="org/base")
    assert report.statistics() is not None
    from ram_live.selection import search

    scored = []
    result = search(
        {"a": "org/a", "b": "org/b"},
        base="org/base",
        budget=2,
        evaluate=lambda merged: scored.append(float(merged["layers.0.w"].sum())) or scored[-1],
    )
    assert len(scored) == 2 and result is not None


def test_a_revision_resolves_to_its_snapshot(cache):
    hub, folders, models = cache
    assert resolve_model("org/a@v2") == str(folders["a@v2"])
    assert resolve_model("org/a@main") == resolve_model("org/a") == str(folders["a"])
    commit = folders["a@v2"].name
    assert resolve_model(f"org/a@{commit}") == str(folders["a@v2"])  # a commit hash: its snapshot folder
    by_rev = merge({"a": "org/a@v2", "b": "org/b"}, base="org/base")
    assert_bit_identical(by_rev, merge({"a": models["a@v2"], "b": models["b"]}, base=models["base"]))
    assert not torch.equal(by_rev["layers.0.w"], merge({"a": "org/a", "b": "org/b"}, base="org/base")["layers.0.w"])


def test_a_model_fetched_in_part_resolves(cache):
    """huggingface_hub >= 1.x records the repo's file list when it downloads (trees/<commit>.json): files the user
    did not fetch (here pytorch_model.bin) do not make the cached snapshot "incomplete" for ram_live."""
    snap = pytest.importorskip("huggingface_hub._snapshot_download")
    if not hasattr(snap, "write_tree_cache") or not hasattr(snap, "TreeCacheEntry"):
        pytest.skip("this huggingface_hub keeps no tree listing")
    hub, folders, _ = cache

    def entry(size):
        return snap.TreeCacheEntry(size=size, blob_id="0" * 40, lfs_sha256=None, lfs_size=None, xet_hash=None)

    files = {"model.safetensors": entry(1), "config.json": entry(1), "pytorch_model.bin": entry(1)}
    snap.write_tree_cache(str(hub / "models--org--b"), folders["b"].name, files)
    assert resolve_model("org/b") == str(folders["b"])


@pytest.mark.parametrize("ref", ["org/missing", "org/a@nope", "missing-model"])
def test_an_id_not_in_the_cache_is_a_one_line_error_naming_it(cache, ref):
    with pytest.raises(ConfigError) as err:
        merge({"a": ref, "b": "org/b"}, base="org/base")
    message = str(err.value)
    assert repr(ref) in message and "\n" not in message and "local Hugging Face cache" in message
    assert message.startswith("a: ")  # the agent at fault


def test_paths_are_not_ids_and_keep_their_error(cache, tmp_path):
    for text in ("./org/a", "/org/a", "~/org/a", "org/a/b", "..", "a.safetensors", "org\\a", "org/a@"):
        assert split_id(text) is None, text
    assert split_id("org/a@v2") == ("org/a", "v2") and split_id("gpt2") == ("gpt2", None)
    with pytest.raises(UnsupportedInputError, match="no such file"):
        merge({"a": "org/a/b", "b": "org/b"}, base="org/base")
    local = tmp_path / "org" / "a"  # an existing folder wins over the cached id of that name
    local.mkdir(parents=True)
    assert resolve_model("org/a") == "org/a"


def test_without_huggingface_hub_an_id_is_a_missing_path(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    assert cached_snapshot("org/a") is None and resolve_model("org/a") == "org/a"
    with pytest.raises(UnsupportedInputError, match="no such file"):
        merge({"a": "org/a", "b": "org/b"}, base="org/base")


def test_hf_home_and_the_default_cache(cache, monkeypatch, tmp_path):
    hub, folders, _ = cache
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # tmp_path/hub is the cache
    assert hub_cache() == hub and resolve_model("org/b") == str(folders["b"])
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    with pytest.raises(ConfigError, match="org/b"):
        resolve_model("org/b")


def test_cli_takes_ids(cache, tmp_path, capsys):
    from ram_live.cli import main

    hub, folders, _ = cache
    assert main(["merge", "org/a", "org/b", "--base", "org/base", "--out", str(tmp_path / "cli")]) == 0
    by_folder = merge({"a": str(folders["a"]), "b": str(folders["b"])}, base=str(folders["base"]))
    assert_bit_identical(load_file(tmp_path / "cli" / "model.safetensors"), by_folder)
    capsys.readouterr()
    assert main(["merge", "org/a", "org/nope", "--base", "org/base", "--out", str(tmp_path / "cli2")]) == 2
    err = capsys.readouterr().err
    assert "'org/nope'" in err and err.count("\n") == 1


def test_mergekit_yaml_takes_ids(cache, tmp_path):
    pytest.importorskip("yaml")
    from ram_live.mergekit_yaml import from_mergekit_yaml

    hub, folders, _ = cache
    config = tmp_path / "ram.yml"
    config.write_text("merge_method: ram\nbase_model: org/base\nmodels:\n  - model: org/a@v2\n  - model: org/b\n")
    plan = from_mergekit_yaml(config)
    assert plan.base == str(folders["base"])
    assert plan.models == {"a": str(folders["a@v2"]), "b": str(folders["b"])}
    config.write_text("merge_method: ram\nbase_model: org/base\nmodels:\n  - model: org/gone\n")
    with pytest.raises(
        ConfigError,
        match=r"models\[0\]\.model: 'org/gone' is not a local folder.*\(hf download org/gone\), or pass a local folder",
    ):
        from_mergekit_yaml(config)


def test_evaluation_model_and_tokenizer_by_id(cache, tmp_path, tok, llama):
    from ram_live.evaluate.models import Resolver, load_model

    hub, _, _ = cache
    tok.save_pretrained(tmp_path / "tok")
    llama.save_pretrained(tmp_path / "llama")
    for repo, folder in (("org/tok", tmp_path / "tok"), ("org/llama", tmp_path / "llama")):
        add_to_cache(hub, repo, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})
    loaded = load_model("org/llama")
    assert all(torch.equal(v, llama.state_dict()[k]) for k, v in loaded.state_dict().items())
    tokenizer = Resolver(tokenizer="org/tok").tokenizer(None)
    assert tokenizer("1+2")["input_ids"] == tok("1+2")["input_ids"]
    with pytest.raises(ConfigError, match="'org/no-llama'"):
        load_model("org/no-llama")
    with pytest.raises(ConfigError, match="'org/no-tok'"):
        Resolver(tokenizer="org/no-tok").tokenizer(None)


@pytest.fixture
def outside(tmp_path, base_sd):
    """A complete model folder outside the cache (what a hostile revision or ref would have merged), and a file
    outside the cache whose content is that folder's absolute path."""
    a = make_agents(base_sd, [0.5], seed=9)[0]
    folder = tmp_path / "outside"
    folder.mkdir()
    for name, data in _model_files(a, tmp_path).items():
        (folder / name).write_bytes(data)
    pointer = tmp_path / "pointer"
    pointer.write_text(str(folder))
    return folder, pointer


def _refused(text: str, *fragments: str) -> str:
    """``merge`` with agent ``a`` given as ``text``: a one-line ConfigError naming the agent, the id and
    ``fragments``; nothing merged."""
    with pytest.raises(ConfigError) as err:
        merge({"a": text, "b": "org/b"}, base="org/base")
    message = str(err.value)
    assert message.startswith(f"a: {text!r}") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def test_a_revision_that_is_a_path_is_refused_naming_the_id(cache, outside):
    folder, pointer = outside
    for revision, why in (
        (str(pointer), "a leading or trailing /"),
        (str(folder), "a leading or trailing /"),
        ("../../../outside", "'..' in it"),
        ("main/../v2", "'..' in it"),
        ("refs/.hidden", "starts with '.'"),
        ("main.lock", "'.lock'"),
        ("ma in", "a character other than"),
        ("ma\\in", "a character other than"),
        ("x" * 256, "longer than 255"),
    ):
        message = _refused(f"org/a@{revision}", repr(revision[:64])[:-1], why)
        assert "not a branch, tag or commit hash" in message
    assert split_id(f"org/a@{pointer}") == ("org/a", str(pointer))  # an id, whose revision is refused


def test_a_ref_whose_content_points_outside_the_cache_is_refused(cache, outside):
    hub, folders, _ = cache
    folder, _ = outside
    refs = hub / "models--org--a" / "refs"
    for name, content in (
        ("up", os.path.relpath(folder, hub / "models--org--a" / "snapshots")),
        ("abs", str(folder)),
        ("newline", folders["a"].name + "\n"),
        ("empty", ""),
    ):
        (refs / name).write_text(content)
        _refused(f"org/a@{name}", f"revision {name!r}", f"{refs / name} holds {content[:64]!r}, not a commit hash")
    (refs / "good").write_text(folders["a"].name)  # a ref holding a commit hash resolves
    assert resolve_model("org/a@good") == str(folders["a"])


def test_a_ref_file_linked_outside_the_cache_is_not_read(cache, outside, tmp_path):
    hub, folders, _ = cache
    elsewhere = tmp_path / "elsewhere-ref"
    elsewhere.write_text(folders["a"].name)  # a valid commit hash, but the file is outside the cache
    os.symlink(elsewhere, hub / "models--org--a" / "refs" / "linked")
    _refused("org/a@linked", "refs/linked resolves to", "outside its cache folder")


def test_a_snapshot_linked_outside_the_cache_is_refused(cache, outside):
    hub, folders, models = cache
    folder, _ = outside
    root = hub / "models--org--a"
    commit = _commit("hostile")
    os.symlink(folder, root / "snapshots" / commit)  # the whole snapshot folder is a link out
    (root / "refs" / "out").write_text(commit)
    _refused("org/a@out", f"snapshots/{commit} resolves to {os.path.realpath(folder)}", "outside its cache folder")
    _refused(f"org/a@{commit}", "outside its cache folder")  # by commit hash too
    # one file of a real snapshot linked out: refused as well
    snap = add_to_cache(hub, "org/c", _model_files(models["b"], folder.parent))
    (snap / "model.safetensors").unlink()
    os.symlink(folder / "model.safetensors", snap / "model.safetensors")
    with pytest.raises(ConfigError, match=r"^c: 'org/c'.*model\.safetensors in its snapshot resolves to .*outside"):
        merge({"a": "org/a", "c": "org/c"}, base="org/base")


def test_a_blobs_folder_on_another_disk_still_resolves(cache, tmp_path):
    """A cache whose ``blobs`` is a link to another folder (a bigger disk) is not hostile."""
    hub, folders, _ = cache
    blobs = hub / "models--org--b" / "blobs"
    moved = tmp_path / "disk2" / "blobs"
    moved.parent.mkdir()
    blobs.rename(moved)
    os.symlink(moved, blobs)
    assert resolve_model("org/b") == str(folders["b"])


def test_evaluate_takes_an_id_with_and_without_model(cache, tmp_path, tok, llama):
    """``evaluate("org/name")`` loads the cached snapshot whether or not the evaluation holds a ``model=``."""
    import evaluate_helpers
    from ram_live.evaluate import rewards

    hub, _, _ = cache
    tok.save_pretrained(tmp_path / "tok")
    other = evaluate_helpers.model(1)
    other.save_pretrained(tmp_path / "other")
    add_to_cache(hub, "org/other", {p.name: p.read_bytes() for p in (tmp_path / "other").iterdir() if p.is_file()})
    prompts = evaluate_helpers.PROMPTS[:3]

    def text_of(completions, **kwargs):  # a score that differs wherever a completion does
        return [float(sum(ord(c) * (i + 1) for i, c in enumerate(text))) for text in completions]

    plain = rewards(prompts, text_of, tokenizer=tok, max_new_tokens=6)
    held = evaluate_helpers.model(0)  # the module model= holds: each candidate is copied into it
    holding = rewards(prompts, text_of, tokenizer=tok, max_new_tokens=6, model=held)
    by_folder = plain(str(tmp_path / "other"))
    assert by_folder != plain(llama)  # the two models complete differently
    assert plain("org/other") == by_folder
    assert holding("org/other") == by_folder
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in held.state_dict().items())
    with pytest.raises(ConfigError, match="rewards: the evaluated model: 'org/gone'"):
        holding("org/gone")
