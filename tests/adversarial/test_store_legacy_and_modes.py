"""Stores written before manifests carried checksums (version 1, data files by ``safetensors.save_file``) still
load, with an UnverifiedSnapshotWarning; every file and folder the store creates follows the umask."""

from __future__ import annotations

import json
import os
import stat

import pytest
from safetensors.torch import load_file, save_file
from test_store_helpers import RUN, STEP, build, read_all, same

from ram_live.cli import main
from ram_live.store import SnapshotStore, UnverifiedSnapshotWarning


def _as_version_1(root, manifest_path, folder):
    """Rewrite a manifest and its data files as ram_live wrote them before checksums: version 1, no crc32, data
    written by safetensors' own writer."""
    m = json.loads(manifest_path.read_text())
    for f in m["files"]:
        path = folder / f["name"]
        save_file(load_file(str(path)), str(path), metadata={"format": m["format"]})
        f["bytes"] = path.stat().st_size
        del f["crc32"]
    if "stats" in m:
        m["stats"]["bytes"] = sum(f["bytes"] for f in m["files"])
    m["version"] = 1
    if "run" in m:  # and as it was named before stores knew runs
        del m["run"], m["run_started"]
        manifest_path.unlink()
        manifest_path = manifest_path.with_name(f"{m['step']:012d}.json")
        (root / "store.json").write_text(json.dumps({"format": "ram_live.store", "version": 1}))
    manifest_path.write_text(json.dumps(m, indent=1))


def test_a_store_without_checksums_loads_with_a_warning(tmp_path, capsys):
    store, _, agent = build(tmp_path / "s")
    root = store.root
    _as_version_1(root, root / "_base" / "base.json", root / "_base")
    _as_version_1(root, root / "a" / f"{STEP:012d}.{RUN}.json", root / "a")
    store.prune(0, "other")
    with pytest.warns(UnverifiedSnapshotWarning) as caught:
        got = read_all(root)
    assert same(got, agent)
    messages = [str(w.message) for w in caught if issubclass(w.category, UnverifiedSnapshotWarning)]
    assert any("base" in m for m in messages) and any("'a' step 7" in m for m in messages)
    assert all("no checksums" in m for m in messages)
    report = SnapshotStore(root, create=False).verify()
    assert report.ok and [e.name for e in report.unverified] == ["base", "a step 7"]
    assert main(["stores", str(root), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "no checksums" in out and "2 without checksums" in out
    # a new snapshot in the old store is checksummed (the base stays as it was written)
    store = SnapshotStore(root)
    with pytest.warns(UnverifiedSnapshotWarning):
        store.snapshot("b", agent, 9)
    m = store.list("b")[0].manifest
    assert m["version"] == 2 and all(len(f["crc32"]) == 8 for f in m["files"])


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_files_and_folders_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        store, base, agent = build(tmp_path / "s")
        store.prune(0, "other")
        store.writer("a", base).snapshot(agent, STEP + 1)
    finally:
        os.umask(old)
    root = store.root
    seen = 0
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(folder, d)).st_mode) == dir_mode, d
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) == file_mode, f
            seen += 1
    # store.json, base.json, the base's data, and a's two manifests and data files
    assert seen == 7
