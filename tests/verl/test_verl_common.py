"""``ram.base`` by Hugging Face id: the local cache's snapshot folder through :mod:`ram_live.io.hub` (the one
resolution every input uses); an id the cache does not hold is refused, naming it (nothing is downloaded at run
time); no verl needed."""

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
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    calls = []
    real = huggingface_hub.snapshot_download

    def local_only(*args, **kwargs):  # every look-up is the local cache's: never a download
        calls.append(kwargs.get("local_files_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", local_only)
    main = _cache(tmp_path / "hub", "org/base", "main", "a" * 40)
    tag = _cache(tmp_path / "hub", "org/base", "v2", "b" * 40)
    assert common.resolve_base("org/base") == main
    assert common.resolve_base("org/base@v2") == tag
    assert common.resolve_base(str(main)) == main
    assert calls == [True, True]  # the two ids looked up in the local cache only


def test_base_id_not_cached_is_refused_naming_it(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.chdir(tmp_path)
    calls = []
    real = huggingface_hub.snapshot_download

    def local_only(*args, **kwargs):
        calls.append(kwargs.get("local_files_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", local_only)
    _cache(tmp_path / "hub", "org/base", "main", "a" * 40)
    with pytest.raises(
        ConfigError,
        match=r"^ram\.base: 'org/other' is not a local folder or file, nor a model in "
        r"the local Hugging Face cache .*downloads nothing.*\(hf download org/other\), or pass a local folder",
    ):
        common.resolve_base("org/other")
    with pytest.raises(ConfigError, match=r"^ram\.base: 'org/base@v9' .* at revision 'v9'"):
        common.resolve_base("org/base@v9")  # cached, but not at that revision: not fetched either
    with pytest.raises(ConfigError, match="ram.base: 'nobase'"):
        common.resolve_base("nobase")
    assert calls and all(c is True for c in calls)  # looked up in the cache only
    assert not hasattr(common, "_fetch")
    with pytest.raises(ConfigError, match=r"ram\.base: '\./missing/folder' is not a local Hugging Face model"):
        common.resolve_base("./missing/folder")
