"""A sharded folder's index names only plain files of the folder: '..', absolute paths and sub-folders are
refused before anything is opened; a shard that is a symlink (Hugging Face caches link to blobs) is read."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from ram_live import UnsupportedInputError, merge
from ram_live.io.sources import SafetensorsSource
from tests.conftest import assert_bit_identical


def _sharded(folder, weight_map, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture
def outside(tmp_path):
    """A valid safetensors file outside the model folder, holding what the index asks for."""
    (tmp_path / "other").mkdir()
    save_file({"w": torch.full((3,), 7.0)}, str(tmp_path / "other" / "x.safetensors"))
    return tmp_path / "other" / "x.safetensors"


@pytest.mark.parametrize(
    "name",
    [
        "../other/x.safetensors",
        "sub/../../other/x.safetensors",
        "./x.safetensors",
        "other/x.safetensors",
        "..",
        ".",
        "",
        "x.safetensors\0",
        "a\\b.safetensors",
    ],
)
def test_names_that_leave_or_are_not_plain_files_are_refused(tmp_path, outside, name):
    folder = _sharded(tmp_path / "model", {"w": name}, {})
    (folder / "sub").mkdir()
    with pytest.raises(UnsupportedInputError, match="not a file name in the index's folder") as err:
        SafetensorsSource(folder)
    assert "'w'" in str(err.value) and "model.safetensors.index.json" in str(err.value)


def test_an_absolute_path_is_refused_and_not_opened(tmp_path, outside, monkeypatch):
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    for name in ("/etc/passwd", str(outside)):
        folder = _sharded(tmp_path / f"model{len(opened)}", {"w": name}, {})
        with pytest.raises(UnsupportedInputError, match="not a file name"):
            SafetensorsSource(folder)
    assert "/etc/passwd" not in opened and str(outside) not in opened


@pytest.mark.parametrize("value", [3, None, ["a.safetensors"], {"f": "a.safetensors"}])
def test_names_that_are_not_strings(tmp_path, value):
    with pytest.raises(UnsupportedInputError, match="'w'"):
        SafetensorsSource(_sharded(tmp_path / "m", {"w": value}, {}))


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}}', "duplicate key 'w'"),
        ('{"weight_map": {"w": "a.safetensors"}, "metadata": {"total_size": NaN}}', "NaN"),
        ('{"weight_map": ["a.safetensors"]}', "weight_map is not a mapping"),
        ("[1, 2]", "weight_map is not a mapping"),
        ('{"weight_map": ' * 50_000 + "{}" + "}" * 50_000, "nested too deeply"),
    ],
)
def test_malformed_index(tmp_path, text, why):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(UnsupportedInputError, match=why):
        SafetensorsSource(folder)


def test_a_symlinked_shard_is_read_as_hugging_face_caches_lay_them_out(tmp_path, base_sd):
    """snapshots/<rev>/model-0000x.safetensors -> ../../blobs/<sha>: the name is a plain name in the folder, the
    link may point anywhere; values are the blob's, bit-exact."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    keys = list(base_sd)
    halves = {"model-00001-of-00002.safetensors": keys[:2], "model-00002-of-00002.safetensors": keys[2:]}
    folder = tmp_path / "snapshots" / "rev"
    folder.mkdir(parents=True)
    weight_map = {}
    for i, (name, names) in enumerate(halves.items()):
        save_file({k: base_sd[k] for k in names}, str(blobs / f"sha{i}"))
        (folder / name).symlink_to(os.path.relpath(blobs / f"sha{i}", folder))
        weight_map.update(dict.fromkeys(names, name))
    _sharded(folder, weight_map, {})
    source = SafetensorsSource(folder)
    assert_bit_identical({k: source.get(k) for k in source.keys()}, base_sd)
    agents = {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v - 1 for k, v in base_sd.items()}}
    assert_bit_identical(
        merge(agents, base=folder, method="task_arithmetic", scale=1.0),
        merge(agents, base=base_sd, method="task_arithmetic", scale=1.0),
    )


def test_a_symlink_to_a_folder_or_a_dangling_one_is_refused(tmp_path):
    folder = _sharded(tmp_path / "m", {"w": "dir.safetensors", "v": "gone.safetensors"}, {})
    (folder / "dir.safetensors").symlink_to(tmp_path)
    with pytest.raises(UnsupportedInputError, match="is a folder"):
        SafetensorsSource(folder)
    _sharded(folder, {"v": "gone.safetensors"}, {})
    (folder / "gone.safetensors").symlink_to(tmp_path / "nothing")
    with pytest.raises(UnsupportedInputError, match="missing"):
        SafetensorsSource(folder)
