"""Output paths of file merges: bad ``out=`` paths are refused up front, and a failed merge leaves the disk as it
found it, folders included."""

import os

import pytest
import ram_live
from safetensors.torch import load_file, save_file

from ram_live import ConfigError, NonFiniteError, merge
from ram_live.io.sinks import SafetensorsSink
from tests.conftest import assert_bit_identical, make_agents


def _tree(root):
    """Every path under ``root``, relative, symlinks not followed."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _bad_agents(base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    agents[1]["head.weight"][2, 2] = float("nan")  # the last tensor: earlier ones are already merged
    return agents


@pytest.mark.parametrize("out", ["o2/new/deep/m.safetensors", "o2/new/deep/m"])
def test_failed_merge_removes_the_folders_it_created(tmp_path, base_sd, out):
    with pytest.raises(NonFiniteError):
        merge(_bad_agents(base_sd), base=base_sd, method="ram", out=tmp_path / out, max_shard_bytes=1000)
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("out", ["keep/new/m.safetensors", "keep/new/m"])
def test_failed_merge_keeps_folders_that_existed(tmp_path, base_sd, out):
    (tmp_path / "keep").mkdir()
    with pytest.raises(NonFiniteError):
        merge(_bad_agents(base_sd), base=base_sd, method="ram", out=tmp_path / out)
    assert _tree(tmp_path) == ["keep"]


def test_failed_merge_keeps_an_empty_output_folder(tmp_path, base_sd):
    (tmp_path / "out").mkdir()
    with pytest.raises(NonFiniteError):
        merge(_bad_agents(base_sd), base=base_sd, method="ram", out=tmp_path / "out")
    assert _tree(tmp_path) == ["out"]


def test_created_folders_stay_after_a_successful_merge(tmp_path, base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    out = merge(agents, base=base_sd, method="ram", out=tmp_path / "a/b/m.safetensors")
    assert out == tmp_path / "a/b/m.safetensors"
    assert _tree(tmp_path) == ["a", "a/b", "a/b/m.safetensors"]
    out = merge(agents, base=base_sd, method="ram", out=tmp_path / "c/d/m", max_shard_bytes=1000)
    shards = sorted(p.name for p in out.iterdir())
    assert len(shards) > 2 and "model.safetensors.index.json" in shards
    assert _tree(tmp_path / "c") == ["d", "d/m"] + [f"d/m/{name}" for name in shards]


def test_existing_file_as_output_folder(tmp_path, base_sd):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"output .*f exists and is not a folder"):
        SafetensorsSink(tmp_path / "f")
    # refused before merging: the NaN is never reached
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        merge(_bad_agents(base_sd), base=base_sd, method="ram", out=tmp_path / "f")
    assert _tree(tmp_path) == ["f"] and (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("out", ["file.txt/x.safetensors", "file.txt/a/b/x"])
def test_output_under_a_file(tmp_path, base_sd, out):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"cannot write output .*: its parent .*file\.txt is a file, not a folder"):
        SafetensorsSink(tmp_path / out)
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        merge(_bad_agents(base_sd), base=base_sd, method="ram", out=tmp_path / out)
    assert _tree(tmp_path) == ["file.txt"] and (tmp_path / "file.txt").read_text() == "x"


def test_symlink_to_an_empty_folder_is_written_through(tmp_path, base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    (tmp_path / "empty").mkdir()
    os.symlink("empty", tmp_path / "link")
    out = merge(agents, base=base_sd, method="ram", out=tmp_path / "link")
    assert out == tmp_path / "link"
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == "empty"
    assert _tree(tmp_path) == ["empty", "empty/model.safetensors", "empty/ram_merge.json", "link"]
    assert_bit_identical(load_file(tmp_path / "empty/model.safetensors"), merge(agents, base=base_sd, method="ram"))


def test_failed_merge_through_a_symlink_keeps_it(tmp_path, base_sd):
    (tmp_path / "empty").mkdir()
    os.symlink("empty", tmp_path / "link")
    with pytest.raises(NonFiniteError):
        merge(_bad_agents(base_sd), base=base_sd, method="ram", out=tmp_path / "link")
    assert _tree(tmp_path) == ["empty", "link"] and (tmp_path / "link").is_symlink()


def test_symlink_to_a_non_empty_folder_is_refused(tmp_path, base_sd):
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    os.symlink("full", tmp_path / "link")
    with pytest.raises(ConfigError, match="link exists and is not empty"):
        merge(make_agents(base_sd, [0.5]), base=base_sd, method="ram", out=tmp_path / "link")
    assert _tree(tmp_path) == ["full", "full/x", "link"]


def _failing_split_merge(rank, tmp):
    paths = [str(tmp / f"a{i}.safetensors") for i in range(2)]
    with pytest.raises(ram_live.RamLiveError):
        merge(paths, base=str(tmp / "base.safetensors"), method="ram", out=tmp / "new/deep/out", process_group=True)


def test_failed_split_merge_removes_the_folders_it_created(tmp_path, base_sd):
    from tests.test_distributed import spawn

    agents = _bad_agents(base_sd)
    save_file(base_sd, tmp_path / "base.safetensors")
    for i, a in enumerate(agents):
        save_file(a, tmp_path / f"a{i}.safetensors")
    spawn(_failing_split_merge, tmp_path)
    assert _tree(tmp_path) == ["a0.safetensors", "a1.safetensors", "base.safetensors"]


def test_folder_outputs_get_the_mode_of_a_plain_mkdir(tmp_path, base_sd):
    """mkdtemp makes its folder 0700; the renamed output folder must be readable as any folder made here is."""
    from ram_live import merge

    agents = make_agents(base_sd, [0.5])
    out = merge(agents, base=base_sd, out=tmp_path / "merged")
    (tmp_path / "plain").mkdir()
    assert out.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777
