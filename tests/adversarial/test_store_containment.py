"""Hostile manifests and folders: no file outside the agent's folder (or of another agent or step) is read or
deleted, symlinks are never followed, only regular files of the store's own names are deleted, and a manifest
that does not tile a tensor with pieces is refused (never the base's values in place of changed ones)."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from test_store_helpers import RUN, STEP, build, data_files, manifest_path, read_all, same

from ram_live.errors import RamLiveError
from ram_live.store import CorruptSnapshotError, SnapshotNotFoundError, SnapshotStore, StoreWarning


@pytest.fixture
def world(tmp_path):
    """A store, plus sentinel files outside it and in another agent's folder."""
    store, base, agent = build(tmp_path / "store")
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "somefile"
    sentinel.write_text("keep me")
    bait = outside / f"{STEP:012d}-abcdef012345.p0.safetensors"  # a store-like name, outside the store
    bait.write_bytes(data_files(store.root)[0].read_bytes())
    return store, base, agent, tmp_path, [sentinel, bait] + data_files(store.root, "other")


def _survive(files):
    return {p: p.read_bytes() for p in files}


def _rewrite(path, edit):
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


HOSTILE = [
    "../../outside/somefile",
    f"../../outside/{STEP:012d}-abcdef012345.p0.safetensors",
    "/etc/passwd",
    "../other/{other}",
    "{other_abs}",
    f"sub/{STEP:012d}-abcdef012345.p0.safetensors",
    f"{STEP + 1:012d}-abcdef012345.p0.safetensors",  # another step's name
    f"{STEP:012d}.{RUN}.json",  # the manifest itself
    ".",
    "",
    f"{STEP:012d}-abcdef012345.p0.safetensors\x00.txt",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_manifest_naming_files_elsewhere_is_refused_and_prune_deletes_none_of_them(world, hostile):
    store, base, agent, tmp, keep = world
    other_name = data_files(store.root, "other")[0].name
    name = hostile.format(other=other_name, other_abs=store.root / "other" / other_name)
    before = _survive(keep)
    _rewrite(manifest_path(store.root), lambda m: m["files"][0].__setitem__("name", name))
    with pytest.raises(CorruptSnapshotError, match="not a data file name"):
        read_all(store.root)
    assert not store.verify().ok
    # re-taking the step replaces the hostile manifest; prune removes the snapshot: neither touches those files
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.writer("a", base, run=RUN).snapshot(agent, STEP)
    assert any(issubclass(w.category, StoreWarning) for w in caught) or name == f"{STEP:012d}.{RUN}.json"
    assert same(read_all(store.root), agent)
    _rewrite(manifest_path(store.root), lambda m: m["files"][0].__setitem__("name", name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreWarning)
        assert [i.step for i in store.prune(0, "a")] == [STEP]
    assert _survive(keep) == before
    assert store.steps("a") == [] and store.steps("other") == [STEP]
    assert same(read_all(store.root, "other"), {k: v + (2.0 if k == "w" else 0) for k, v in base.items()})


def test_another_agents_file_of_the_same_step_is_never_read_as_this_agents(world):
    store, *_ = world
    theirs = data_files(store.root, "other")[0].name
    _rewrite(manifest_path(store.root), lambda m: m["files"][0].__setitem__("name", theirs))
    with pytest.raises(SnapshotNotFoundError):  # looked up in a's folder only, where there is no such file
        read_all(store.root)


def test_symlinks_are_never_followed_nor_deleted_through(world):
    store, base, agent, tmp, keep = world
    before = _survive(keep)
    (data,) = data_files(store.root)
    target = tmp / "outside" / "real.safetensors"
    data.rename(target)
    data.symlink_to(target)  # a valid name in a's folder, pointing outside
    with pytest.raises(CorruptSnapshotError, match="regular file"):
        read_all(store.root)
    store.prune(0, "a")
    assert data.is_symlink() and target.exists()  # the link is not a regular file: left alone, target too
    store.gc(grace_s=0)
    assert data.is_symlink() and target.exists()
    # a symlinked agent folder is no agent of the store: not listed, not opened, nothing deleted through it
    evil = store.root / "evil"
    evil.symlink_to(store.root / "other")
    assert store.agents() == ["other"]
    with pytest.raises(CorruptSnapshotError, match="symlink"):
        store.open("evil", STEP)
    assert store.prune(0, "evil") == [] and store.gc(grace_s=0) == []
    # a symlinked manifest is refused too
    link = manifest_path(store.root)
    link.symlink_to(manifest_path(store.root, "other"))
    with pytest.raises(CorruptSnapshotError, match="regular file"):
        store.open("a", STEP)
    assert _survive(keep) == before


def test_fifos_are_refused_without_blocking(world):
    store, *_ = world
    (data,) = data_files(store.root)
    data.unlink()
    os.mkfifo(data)
    with pytest.raises(CorruptSnapshotError, match="regular file"):
        read_all(store.root)
    manifest = manifest_path(store.root)
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(CorruptSnapshotError, match="regular file"):
        store.open("a", STEP)


def test_gc_and_prune_delete_only_regular_files_of_the_stores_names(world):
    store, base, agent, tmp, keep = world
    a = store.root / "a"
    orphan = a / f"{STEP + 5:012d}-abcdef012345.p0.safetensors"  # a killed write's data: goes
    orphan.write_bytes(b"x" * 10)
    tmp_manifest = a / f".tmp-0123456789ab-{STEP + 5:012d}.json"  # a killed manifest write: goes
    tmp_manifest.write_text("{")
    user = [
        a / "notes.txt",
        a / f"{STEP:012d}.{RUN}.json.bak",
        a / "000000000001-x.p0.safetensors.old",
        store.root / "results" / "table.csv",
        store.root / "_base" / "README",
        store.root / ".git" / "x",
    ]
    for p in user:
        p.parent.mkdir(exist_ok=True)
        p.write_text("user data")
    folder_named_like_data = a / f"{STEP + 6:012d}-abcdef012345.p0.safetensors"
    folder_named_like_data.mkdir()
    removed = store.gc(grace_s=0)
    assert sorted(p.name for p in removed) == sorted([orphan.name, tmp_manifest.name])
    assert all(p.exists() for p in user) and folder_named_like_data.is_dir()
    store.prune(0)
    assert all(p.exists() for p in user) and folder_named_like_data.is_dir()
    assert all(p.exists() for p in keep[:2])  # the sentinels outside (other's files went with prune(0))
    assert not os.listdir(store.root / "other")


def test_a_corrupt_manifest_keeps_its_files_from_gc(world):
    store, *_ = world
    manifest = manifest_path(store.root)
    manifest.write_text("{ not json")
    assert store.gc(grace_s=0) == []  # which files it named is unknown: none of its step's files go
    assert data_files(store.root, "other")[0].exists()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m["tensors"]["w"].__setitem__("pieces", []), "tile"),
        (lambda m: m["tensors"]["e"]["pieces"].append(dict(m["tensors"]["e"]["pieces"][0])), "named twice|tile"),
        (lambda m: m["tensors"]["w"]["pieces"][0].__setitem__("shape", [8, 16]), "tile"),
        (lambda m: m["tensors"]["w"]["pieces"][0].__setitem__("offsets", [1, 0]), "outside"),
        (lambda m: m["tensors"]["w"]["pieces"][0].__setitem__("encoding", "none"), "count|has no"),
        (lambda m: m["tensors"]["w"]["pieces"][0].__setitem__("count", 300), "count"),
        (lambda m: m["tensors"]["w"]["pieces"][0].__setitem__("count", 2), "needs|stats"),
        (lambda m: m["tensors"]["b"]["pieces"][0].__setitem__("encoding", "indices"), "needs"),
        (lambda m: m["tensors"]["b"].__setitem__("dtype", "float32"), "needs|stats"),
        (lambda m: m["tensors"]["b"].__setitem__("shape", [5, 2]), "entries|tile"),
        (lambda m: m["tensors"].pop("s"), "keys|stats"),
        (
            lambda m: m["tensors"]["e"]["pieces"][0].__setitem__(
                "positions", m["tensors"]["w"]["pieces"][0]["positions"]
            ),
            "named twice|needs",
        ),
        (lambda m: m["files"].append(dict(m["files"][0])), "twice"),
        (lambda m: m.__setitem__("files", []), "no file"),
        (lambda m: m["stats"].__setitem__("changed", 0), "stats"),
        (lambda m: m.__setitem__("version", 4), "newer"),
        (lambda m: m.__setitem__("step", STEP + 1), "says"),
        (lambda m: m.__setitem__("agent", "other"), "says"),
        (lambda m: m.__setitem__("activity", {"rule": "abs", "eps": -1}), "activity"),
    ],
)
def test_invalid_manifests_are_refused(world, edit, match):
    store, *_ = world
    _rewrite(manifest_path(store.root), edit)
    with pytest.raises(RamLiveError, match=match):
        read_all(store.root)


def test_store_json_and_base_of_the_wrong_shape_are_library_errors(tmp_path):
    root = tmp_path / "s"
    root.mkdir()
    for bad in ("[1, 2]", '{"format": "ram_live.store", "version": "1"}', "NaN", "[" * 100000):
        (root / "store.json").write_text(bad)
        with pytest.raises(CorruptSnapshotError):
            SnapshotStore(root)
