"""Writes: a full disk is an OutOfSpaceError before the rename (never a SIGBUS) with every temp file removed;
file systems that cannot reserve are written without mmap, bit-identically; the final rename never replaces an
output another process made meanwhile; outputs follow the umask; stale temp folders of killed merges go."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import textwrap
import time

import pytest
from safetensors.torch import load_file

import ram_live
from ram_live import OutOfSpaceError, OutputExistsError, merge
from ram_live.io import outputs
from ram_live.io.outputs import clean_stale, rename_noreplace
from ram_live.cli import main
from tests.conftest import assert_bit_identical


@pytest.fixture
def inputs(base_sd):
    return {"a": {k: v + 1 for k, v in base_sd.items()}, "b": {k: v * 2 for k, v in base_sd.items()}}, base_sd


def _want(inputs):
    agents, base = inputs
    return merge(agents, base=base, method="task_arithmetic", scale=0.5)


def _merge(inputs, out, **kw):
    agents, base = inputs
    return merge(agents, base=base, method="task_arithmetic", scale=0.5, out=out, **kw)


def _enospc(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("out", ["merged", "merged.safetensors"])
def test_full_disk_at_the_reservation_is_a_library_error_and_leaves_nothing(tmp_path, inputs, out, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    with pytest.raises(OutOfSpaceError, match=rf"no space left on device writing .*{out}.*: needs \d+ bytes"):
        _merge(inputs, tmp_path / "deep" / out, max_shard_bytes=2000)
    assert list(tmp_path.iterdir()) == []  # the temp folder and the folders made for the output are gone


def test_full_disk_while_writing_without_mmap(tmp_path, inputs, monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", lambda *a: _raise(errno.EOPNOTSUPP))
    real = os.pwrite
    calls = []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) > 3:
            _enospc()
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(OutOfSpaceError, match="no space left on device writing"):
        _merge(inputs, tmp_path / "merged")
    assert len(calls) == 4 and list(tmp_path.iterdir()) == []


def _raise(code):
    raise OSError(code, os.strerror(code))


@pytest.mark.parametrize("why", ["no fallocate", "copy-on-write"])
def test_without_a_reservation_the_file_is_written_by_pwrite_bit_identically(tmp_path, inputs, monkeypatch, why):
    if why == "no fallocate":
        monkeypatch.setattr(os, "posix_fallocate", lambda *a: _raise(errno.EOPNOTSUPP))
    else:
        monkeypatch.setattr(outputs, "_copy_on_write", lambda fd: True)
    writes = []
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: (writes.append(off), real(fd, data, off))[1])
    path = _merge(inputs, tmp_path / "merged", max_shard_bytes=3000)
    assert len(writes) > len(inputs[1])  # the header and every tensor went through pwrite
    loaded = {}
    for shard in sorted(path.glob("*.safetensors")):
        loaded.update(load_file(str(shard)))
    assert len(list(path.glob("*.safetensors"))) > 1
    assert_bit_identical(loaded, _want(inputs))


def _mount_tmpfs(where, size):
    where.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_a_real_full_tmpfs_gives_the_error_not_sigbus(tmp_path):
    """A 1 MiB tmpfs and a 4 MiB output, in a child process (a SIGBUS would kill it: status -7)."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "1m"):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount)")
    try:
        code = textwrap.dedent(f"""
            import torch, ram_live
            base = {{"w": torch.zeros(1024, 1024)}}
            try:
                ram_live.merge([{{"w": torch.ones(1024, 1024)}}], base=base, method="task_arithmetic",
                               out={str(disk / "merged")!r})
            except ram_live.OutOfSpaceError as exc:
                print("OUT OF SPACE", exc)
        """)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=os.getcwd()
        )
        assert done.returncode == 0, done.stderr
        assert "OUT OF SPACE no space left on device writing" in done.stdout
        assert "needs 4194" in done.stdout
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, timeout=30)


@pytest.mark.parametrize(
    "out, intruder",
    [("merged.safetensors", "file"), ("merged", "file"), ("merged", "folder"), ("merged", "empty folder")],
)
def test_an_output_created_during_the_merge_is_never_replaced(tmp_path, inputs, monkeypatch, out, intruder):
    target = tmp_path / out
    real = outputs.rename_noreplace

    def racing(src, dst):
        if intruder == "file":
            dst.write_text("someone else's")
        else:
            dst.mkdir()
            if intruder == "folder":
                (dst / "theirs.txt").write_text("someone else's")
        return real(src, dst)

    monkeypatch.setattr(outputs, "rename_noreplace", racing)
    with pytest.raises(OutputExistsError, match="created by another process while the merge ran"):
        _merge(inputs, target)
    if intruder == "file":
        assert target.read_text() == "someone else's"
    elif intruder == "folder":
        assert os.listdir(target) == ["theirs.txt"]
    else:
        assert os.listdir(target) == []
    assert sorted(os.listdir(tmp_path)) == [out]  # no temp folder left


def test_writing_into_a_given_empty_folder_while_it_is_merged_into(tmp_path, inputs, monkeypatch):
    """An empty output folder that existed when the merge started is replaced (the user's choice); a file put
    into it meanwhile makes it someone else's: an error, the file kept."""
    target = tmp_path / "merged"
    target.mkdir()
    real = outputs.rename_noreplace
    monkeypatch.setattr(outputs, "rename_noreplace", lambda s, d: real(s, d))
    path = _merge(inputs, target)
    assert_bit_identical(load_file(str(path / "model.safetensors")), _want(inputs))
    other = tmp_path / "other"
    other.mkdir()
    sink_begin = ram_live.io.sinks.SafetensorsSink.begin

    def begin(self, plan, specs):
        sink_begin(self, plan, specs)
        (other / "late.txt").write_text("x")

    monkeypatch.setattr(ram_live.io.sinks.SafetensorsSink, "begin", begin)
    with pytest.raises(OutputExistsError, match="written into it while the merge ran"):
        _merge(inputs, other)
    assert os.listdir(other) == ["late.txt"] and sorted(os.listdir(tmp_path)) == ["merged", "other"]


@pytest.mark.parametrize("kind", ["file", "folder"])
@pytest.mark.parametrize("renameat2", [True, False])
def test_rename_noreplace(tmp_path, kind, renameat2, monkeypatch):
    if not renameat2:
        monkeypatch.setattr(outputs, "_renameat2", lambda s, d: False)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir() if kind == "folder" else src.write_text("new")
    dst.write_text("old")
    with pytest.raises(FileExistsError):
        rename_noreplace(src, dst)
    assert dst.read_text() == "old" and src.exists()
    dst.unlink()
    rename_noreplace(src, dst)
    assert dst.exists() and not src.exists()


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_outputs_follow_the_umask(tmp_path, inputs, umask):
    old = os.umask(umask)
    try:
        folder = _merge(inputs, tmp_path / "merged", max_shard_bytes=3000)
        single = _merge(inputs, tmp_path / "merged.safetensors")
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o777 & ~umask
    files = list(folder.iterdir()) + [single]
    assert len(files) > 2 and any(f.name.endswith(".index.json") for f in files)
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f


def _old(path, seconds=3600):
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def _temp_tree(parent, name):
    folder = parent / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    _old(folder)
    return folder


def test_stale_temp_folders_are_removed_by_the_next_merge_into_that_folder(tmp_path, inputs):
    parent = tmp_path / "runs"
    parent.mkdir()
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    stale = _temp_tree(parent, ".merged.tmp-abc12_xy")
    (stale / "link").symlink_to(outside)  # removed as a link, never followed
    _old(stale)
    held = _temp_tree(parent, ".merged.tmp-live0001")  # a live merge holds its lock
    young = parent / ".merged.tmp-young001"
    young.mkdir()  # just made: its writer may not have locked it yet
    other = _temp_tree(parent, ".other.tmp-abcdefgh")  # another output's: the next merge of "merged" leaves it
    (parent / ".merged.tmp-linklink").symlink_to(outside)
    _old(parent / ".merged.tmp-linklink")
    plain = parent / ".merged.tmp-afile001"
    plain.write_text("a file")
    _old(plain)
    mine = parent / ".merged.tmp-BAD!"  # not the library's naming
    mine.mkdir()
    _old(mine)
    lock = os.open(held, os.O_RDONLY)
    fcntl.flock(lock, fcntl.LOCK_SH)
    try:
        path = _merge(inputs, parent / "merged")
        assert_bit_identical(load_file(str(path / "model.safetensors")), _want(inputs))
        assert not stale.exists()
        left = sorted(os.listdir(parent))
        assert left == sorted(
            ["merged", held.name, young.name, other.name, ".merged.tmp-linklink", plain.name, mine.name]
        )
        assert (outside / "keep.txt").read_text() == "keep"
        assert clean_stale(parent, "merged") == []  # nothing stale of "merged" left; "young" is young
        # any output's, of any age: the held one, links, files and other names are still kept
        assert sorted(clean_stale(parent, min_age=0)) == sorted([young, other])
    finally:
        os.close(lock)
    assert clean_stale(parent, min_age=0) == [held]  # its writer is gone
    assert (outside / "keep.txt").read_text() == "keep" and plain.exists() and mine.exists()


def test_a_killed_merge_leaves_a_temp_folder_that_clean_removes(tmp_path, capsys):
    """A child takes a temp folder as a merge does and is SIGKILLed: its lock goes with it."""
    code = textwrap.dedent(f"""
        import os, signal, pathlib
        from ram_live.io.outputs import locked_temp_folder
        tmp, fd = locked_temp_folder(pathlib.Path({str(tmp_path)!r}), "merged")
        (tmp / "model.safetensors").write_bytes(b"half")
        print(tmp, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert done.returncode == -9
    left = tmp_path / os.path.basename(done.stdout.strip())
    assert left.is_dir() and left.name.startswith(".merged.tmp-")
    assert main(["clean", str(tmp_path)]) == 0  # younger than the default 60 s: kept
    assert left.exists() and "no stale temporary folder" in capsys.readouterr().out
    assert main(["clean", str(tmp_path), "--min-age", "0"]) == 0
    assert not left.exists() and f"removed {left}" in capsys.readouterr().out


def test_cli_reports_a_full_disk_in_one_line_with_status_2(tmp_path, base_sd, monkeypatch, capsys):
    from safetensors.torch import save_file

    save_file(base_sd, str(tmp_path / "base.safetensors"))
    save_file({k: v + 1 for k, v in base_sd.items()}, str(tmp_path / "a.safetensors"))
    monkeypatch.setattr(os, "posix_fallocate", _enospc)
    status = main(
        [
            "merge",
            str(tmp_path / "a.safetensors"),
            "--base",
            str(tmp_path / "base.safetensors"),
            "--out",
            str(tmp_path / "out"),
            "-q",
        ]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"ram-live: error: no space left on device writing {tmp_path / 'out'}")
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors", "base.safetensors"]
    assert issubclass(OutOfSpaceError, OSError) and issubclass(OutOfSpaceError, ram_live.RamLiveError)


def test_cli_errors_are_one_line_even_when_the_message_is_not(capsys):
    from ram_live.cli import run_command

    def run():
        raise ram_live.ConfigError("first line\nsecond line\n\tthird")

    assert run_command(run, "ram-live", debug=False) == 2
    assert capsys.readouterr().err == "ram-live: error: first line second line third\n"
    assert main(["clean", "/nonexistent/folder"]) == 2
    assert "is not a folder" in capsys.readouterr().err
