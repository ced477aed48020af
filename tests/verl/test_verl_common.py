"""``ram.base`` by Hugging Face id: the local cache's snapshot folder through :mod:`ram_live.io.hub` (the one
resolution every input uses), else verl's fetch of ``model.path``; no verl needed."""

from __future__ import annotations

import pytest

from ram_live.errors import ConfigError
from ram_live.integrations.verl import common

pytest.importorskip("huggingface_hub")


def _cache(root, repo: str, ref: str, commit: str):
    folder = root / f"models--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    return snap


def test_base_by_id_is_the_cached_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    fetched = []
    monkeypatch.setattr(common, "_fetch", lambda repo, revision: fetched.append((repo, revision)))  # no network
    main = _cache(tmp_path / "hub", "org/base", "main", "a" * 40)
    tag = _cache(tmp_path / "hub", "org/base", "v2", "b" * 40)
    assert common.resolve_base("org/base") == main
    assert common.resolve_base("org/base@v2") == tag
    assert fetched == []
    with pytest.raises(ConfigError, match="ram.base: 'org/other'"):
        common.resolve_base("org/other")
    assert fetched == [("org/other", None)]  # not cached: verl's fetch, which failed here
    with pytest.raises(ConfigError, match="ram.base: 'nobase'"):
        common.resolve_base("nobase")  # a bare name that is not cached is not fetched
    assert fetched == [("org/other", None)]
