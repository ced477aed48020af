"""Hostile base folders (ram_live/io/side_files.py, ram_live/io/model_files.py): a side file linked outside the base
folder is never copied (a link to /proc/self/environ put the environment, tokens included, into the merged folder):
a ConfigError naming it, before anything is written; a ``config.json`` that cannot be rewritten for ``dtype=`` (NaN,
deep nesting) is a ConfigError naming the file, and the CLI prints no traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_live import merge
from ram_live.cli import main
from ram_live.errors import ConfigError
from ram_live.io.model_files import store_files_of
from ram_live.io.side_files import copy_side_files, side_files

SECRET = "HF_TOKEN=hf_not_a_real_token_but_secret"


def base_folder(root: Path, base_sd: dict[str, torch.Tensor]) -> Path:
    folder = root / "base"
    folder.mkdir()
    save_file(base_sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "float32"}))
    (folder / "tokenizer.json").write_text('{"version": "1.0"}')
    return folder


def agents(base_sd):
    return {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "environ"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def written(root: Path) -> list[str]:
    """Everything under ``root`` but the inputs."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.parts[len(root.parts)] == "out")


@pytest.mark.parametrize("target", ["secret", "/proc/self/environ", "relative"])
@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json", "config.json"])
def test_a_side_file_linked_outside_the_base_folder_is_refused_before_anything_is_written(
    tmp_path, base_sd, secret, target, name, capsys
):
    folder = base_folder(tmp_path, base_sd)
    link = folder / name
    link.unlink(missing_ok=True)
    if target == "/proc/self/environ" and not os.path.exists(target):
        pytest.skip("no /proc here")
    link.symlink_to({"secret": str(secret), "relative": "../elsewhere/environ"}.get(target, target))
    for dtype in (None, torch.bfloat16):
        with pytest.raises(ConfigError, match=f"{name} is a link to .*, outside the folder"):
            merge(agents(base_sd), base=str(folder), out=tmp_path / "out", dtype=dtype)
        assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=f"{name} is a link"):
        store_files_of(str(folder))()  # what a store keeps of its base
    with pytest.raises(ConfigError, match=f"{name} is a link"):
        copy_side_files(folder, tmp_path / "elsewhere")  # checked again where the files are copied
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["environ"]
    capsys.readouterr()
    code = main(["merge", f"a={save(tmp_path, 'a', base_sd)}", "--base", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"{name} is a link" in err and "Traceback" not in err and SECRET not in err
    assert not (tmp_path / "out").exists()


def save(root: Path, name: str, base_sd) -> Path:
    path = root / f"{name}.safetensors"
    save_file({k: v + 1 for k, v in base_sd.items()}, str(path))
    return path


def test_links_inside_the_folder_and_the_hub_cache_layout_are_copied(tmp_path, base_sd):
    folder = base_folder(tmp_path, base_sd)
    (folder / "tokenizer_config.json").symlink_to("tokenizer.json")  # inside: copied, as a file
    (folder / "dangling.json").symlink_to("nowhere.json")  # no file behind it: not a side file
    (folder / "loop.json").symlink_to("loop.json")
    merge(agents(base_sd), base=str(folder), out=tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "tokenizer_config.json").read_text() == '{"version": "1.0"}'
    assert not (out / "tokenizer_config.json").is_symlink()
    assert not (out / "dangling.json").exists() and not (out / "loop.json").exists()
    # a Hugging Face cache snapshot: every file is a link into the repository's blobs/
    repo = tmp_path / "hub" / "models--org--base"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink():
            (blobs / f"blob-{f.name}").write_bytes(f.read_bytes())
            (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob-{f.name}"))
    assert sorted(side_files(snapshot)) == ["config.json", "tokenizer.json"]
    merge(agents(base_sd), base=str(snapshot), out=tmp_path / "out2")
    assert (tmp_path / "out2" / "tokenizer.json").read_text() == '{"version": "1.0"}'
    # a --local-dir download that links its large files into the cache (huggingface_hub < 0.23)
    local = tmp_path / "local"
    local.mkdir()
    save_file(base_sd, str(local / "model.safetensors"))
    (local / "tokenizer.json").symlink_to(blobs / "blob-tokenizer.json")
    merge(agents(base_sd), base=str(local), out=tmp_path / "out4")
    assert (tmp_path / "out4" / "tokenizer.json").read_text() == '{"version": "1.0"}'
    # a file in a folder merely named blobs is no cache file
    (tmp_path / "x" / "blobs").mkdir(parents=True)
    (tmp_path / "x" / "blobs" / "secret").write_text(SECRET)
    (local / "tokenizer_config.json").symlink_to(tmp_path / "x" / "blobs" / "secret")
    with pytest.raises(ConfigError, match="tokenizer_config.json is a link to"):
        merge(agents(base_sd), base=str(local), out=tmp_path / "out5")
    # a blob that is itself a link out of the cache is refused
    (blobs / "blob-tokenizer.json").unlink()
    (blobs / "blob-tokenizer.json").symlink_to(tmp_path / "base" / "tokenizer.json")
    with pytest.raises(ConfigError, match="tokenizer.json is a link to"):
        merge(agents(base_sd), base=str(snapshot), out=tmp_path / "out3")
    assert not (tmp_path / "out3").exists()


def test_the_verl_integration_copies_only_checked_side_files(tmp_path, base_sd, secret):
    from ram_live.integrations.verl.common import copy_side_files as verl_copy
    from ram_live.integrations.verl.common import resolve_base

    folder = base_folder(tmp_path, base_sd)
    (folder / ".hidden").write_text("x")
    dest = tmp_path / "dest"
    dest.mkdir()
    verl_copy(folder, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "tokenizer.json"]
    (folder / "special_tokens_map.json").symlink_to(secret)
    with pytest.raises(ConfigError, match="special_tokens_map.json is a link"):
        resolve_base(str(folder))  # at configuration, before training
    with pytest.raises(ConfigError, match="special_tokens_map.json is a link"):
        verl_copy(folder, dest)
    assert SECRET not in "".join(p.read_text() for p in dest.iterdir())


def deep(levels: int) -> str:
    return '{"model_type": "llama", "x": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"model_type": "llama", "rope_theta": NaN}', "holds NaN or Infinity"),
        ('{"model_type": "llama", "rope_theta": Infinity}', "holds NaN or Infinity"),
        ('{"model_type": "llama", "rope_scaling": {"factor": -Infinity}}', "holds NaN or Infinity"),
        (deep(100_000), "nested too deeply"),
    ],
    ids=["nan", "inf", "nested-inf", "deep"],
)
def test_a_config_that_cannot_be_rewritten_for_dtype_is_a_config_error_naming_it(tmp_path, base_sd, text, why, capsys):
    folder = base_folder(tmp_path, base_sd)
    (folder / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=f"base config {folder / 'config.json'} .*{why}"):
        merge(agents(base_sd), base=str(folder), out=tmp_path / "out", dtype=torch.bfloat16)
    assert not (tmp_path / "out").exists()
    capsys.readouterr()
    a = save(tmp_path, "a", base_sd)
    code = main(["merge", f"a={a}", "--base", str(folder), "--out", str(tmp_path / "out"), "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "config.json" in err and why in err
    assert not (tmp_path / "out").exists()
    merge(agents(base_sd), base=str(folder), out=tmp_path / "out")  # without dtype=: copied as it is
    assert (tmp_path / "out" / "config.json").read_text() == text


def test_copied_side_files_keep_the_bases_mode_and_times(tmp_path, base_sd):
    folder = base_folder(tmp_path, base_sd)
    os.chmod(folder / "tokenizer.json", 0o640)
    os.utime(folder / "tokenizer.json", (1_000_000_000, 1_000_000_000))
    merge(agents(base_sd), base=str(folder), out=tmp_path / "out")
    st = (tmp_path / "out" / "tokenizer.json").stat()
    assert st.st_mode & 0o777 == 0o640 and st.st_mtime == 1_000_000_000
