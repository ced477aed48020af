"""Damaged stores: every single-byte change of a snapshot's data files and of the base's is a
CorruptSnapshotError naming the file (never wrong values), ``verify()`` finds exactly the damaged entry, and
every single-byte change of a manifest gives a library error or the right values."""

from __future__ import annotations

import json
import zlib

import pytest
from test_store_helpers import STEP, base_files, build, data_files, manifest_path, read_all, same

from ram_live.errors import RamLiveError
from ram_live.store import CorruptSnapshotError, SnapshotStore
from ram_live.store.native_crc import allow_wide, native_crc32
from ram_live.store.checksum import crc_range, crc32, crc32_combine


def _flips(path, masks=(0xFF,), every=1):
    """Yield after each single-byte change of ``path`` (each ``every``-th byte; restored afterwards)."""
    data = path.read_bytes()
    for i in range(0, len(data), every):
        for mask in masks:
            damaged = bytearray(data)
            damaged[i] ^= mask
            path.write_bytes(bytes(damaged))
            yield i, mask
    path.write_bytes(data)


def test_every_byte_flip_of_a_snapshot_data_file_is_detected(tmp_path):
    store, _, agent = build(tmp_path / "s")
    root = store.root
    files = data_files(root)
    assert len(files) == 1 and files[0].stat().st_size > 300
    detected = 0
    for i, mask in _flips(files[0], masks=(0x01, 0xFF)):
        with pytest.raises(CorruptSnapshotError) as exc:
            read_all(root)
        assert exc.value.agent == "a" and exc.value.step == STEP and exc.value.file == files[0].name, (i, mask)
        assert files[0].name in str(exc.value)
        detected += 1
    assert detected == 2 * files[0].stat().st_size
    assert same(read_all(root), agent)  # restored: reads again


def test_every_byte_flip_of_the_base_is_detected(tmp_path):
    store, _, agent = build(tmp_path / "s")
    root = store.root
    (base_file,) = base_files(root)
    n = 0
    for i, mask in _flips(base_file):
        with pytest.raises(CorruptSnapshotError) as exc:
            read_all(root)
        assert exc.value.agent is None and exc.value.file == base_file.name, (i, mask)
        assert "base" in str(exc.value)
        n += 1
    assert n == base_file.stat().st_size
    assert same(read_all(root), agent)


def test_verify_finds_exactly_the_damaged_entry(tmp_path):
    store, _, _ = build(tmp_path / "s")
    root = store.root
    report = store.verify()
    assert report.ok and [e.name for e in report.entries] == ["base", "a step 7 (r1)", "other step 7 (r1)"]
    files = base_files(root) + data_files(root) + data_files(root, "other")
    assert report.bytes == sum(p.stat().st_size for p in files)
    for target, name in ((data_files(root)[0], "a step 7 (r1)"), (base_files(root)[0], "base")):
        for i, _ in _flips(target, every=5):
            report = SnapshotStore(root, create=False).verify()
            bad = [e.name for e in report.problems]
            # a damaged base also fails the snapshots' check against it, never an intact file
            assert bad[0] == name and (bad == [name] or name == "base"), (target.name, i, bad)
            assert target.name in report.problems[0].problem
            if i == 200:
                with pytest.raises(CorruptSnapshotError):
                    SnapshotStore(root, create=False).verify(strict=True)
    assert SnapshotStore(root, create=False).verify().ok


@pytest.mark.parametrize("which", ["snapshot", "base"])
def test_every_byte_flip_of_a_manifest_is_an_error_or_the_right_values(tmp_path, which):
    store, _, agent = build(tmp_path / "s")
    root = store.root
    path = manifest_path(root) if which == "snapshot" else root / "_base" / "base.json"
    outcomes = {"error": 0, "right": 0}
    for i, mask in _flips(path, masks=(0x01,)):
        try:
            got = read_all(root)
        except RamLiveError:
            outcomes["error"] += 1
            continue
        assert same(got, agent), (i, mask, path.read_bytes()[max(0, i - 20) : i + 20])
        outcomes["right"] += 1
    # both happen: numbers and names that matter are refused, bytes that do not (e.g. the time) are harmless
    assert outcomes["error"] > 100 and outcomes["right"] > 10, outcomes


def test_crc32_is_zlibs_on_every_length_and_alignment_on_each_path():
    import ctypes
    import os

    data = bytearray(os.urandom(5000))
    view = memoryview(data)
    paths = [None] + ([False, True] if native_crc32() is not None else [])
    try:
        for wide in paths:
            if wide is not None:
                allow_wide(wide)
            for off in (0, 1, 5, 16, 63):
                for n in list(range(0, 300)) + [511, 512, 513, 1023, 4097, 5000 - 63]:
                    part = view[off : off + n]
                    assert crc_range([part]) == zlib.crc32(bytes(part)), (wide, off, n)
                    assert crc_range([part], 12345) == zlib.crc32(bytes(part), 12345)
        assert crc_range([memoryview(bytes(data))]) == zlib.crc32(data)  # read-only: zlib's path
    finally:
        allow_wide(True)
    big = memoryview(bytearray(os.urandom(9 << 20)))
    assert crc32([big[:3], big[3:]], threads=3) == zlib.crc32(big) == crc32([big], threads=1)
    a, b = bytes(data[:777]), bytes(data[777:])
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)
    assert ctypes is not None


def test_a_manifest_with_its_checksum_removed_or_changed_is_refused(tmp_path):
    store, _, agent = build(tmp_path / "s")
    path = manifest_path(store.root)
    m = json.loads(path.read_text())
    good = m["files"][0]["crc32"]
    m["files"][0]["crc32"] = f"{int(good, 16) ^ 1:08x}"
    path.write_text(json.dumps(m))
    with pytest.raises(CorruptSnapshotError, match="checksum mismatch"):
        read_all(store.root)
    del m["files"][0]["crc32"]
    path.write_text(json.dumps(m))
    with pytest.raises(CorruptSnapshotError, match="no crc32"):
        read_all(store.root)
    m["files"][0]["crc32"] = good
    path.write_text(json.dumps(m))
    assert same(read_all(store.root), agent)


def flip_last_byte(path):
    """One bit of the file's last byte flipped: a checksum mismatch, sizes intact."""
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 0x10
    path.write_bytes(bytes(damaged))


def test_cli_verify_reports_damage_with_exit_status_1(tmp_path, capsys):
    from ram_live.cli import main

    store, _, _ = build(tmp_path / "s")
    assert main(["stores", str(store.root), "--verify", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["checked"] == 3 and report["problems"] == 0
    (data,) = data_files(store.root)
    flip_last_byte(data)
    assert main(["stores", str(store.root), "--verify"]) == 1
    out = capsys.readouterr().out
    assert "checksum mismatch" in out and data.name in out and "1 with problems" in out
    assert main(["stores", str(store.root)]) == 0  # the listing still lists (sizes are intact)


def _errors(merge, times=3):
    """The (class, message, file) of ``merge()``'s CorruptSnapshotError, ``times`` times in a row."""
    out = []
    for _ in range(times):
        with pytest.raises(CorruptSnapshotError) as exc:
            merge()
        out.append((type(exc.value), str(exc.value), exc.value.file))
    return out


def test_a_store_object_reused_after_a_failed_base_check_fails_the_same_way(tmp_path):
    from ram_live import merge

    store, _, _ = build(tmp_path / "s")
    (base_file,) = base_files(store.root)
    flip_last_byte(base_file)
    store = SnapshotStore(store.root, create=False)
    snaps = store.latest_all()
    errors = _errors(lambda: merge(snaps)) + _errors(lambda: merge(store.latest_all()))
    assert len(set(errors)) == 1, errors  # the second and later uses: the first error again, never an assert
    cls, message, file = errors[0]
    assert cls is CorruptSnapshotError and file == base_file.name and base_file.name in message
    assert "checksum mismatch" in message and "base" in message
    # the base is shared, so a snapshot whose own files are intact cannot merge either
    with pytest.raises(CorruptSnapshotError, match=base_file.name):
        merge({"other": store.open("other", STEP)})


def test_a_store_object_reused_after_a_failed_snapshot_check_fails_the_same_way(tmp_path):
    from ram_live import merge

    store, base, _ = build(tmp_path / "s")
    (data,) = data_files(store.root)
    flip_last_byte(data)
    store = SnapshotStore(store.root, create=False)
    snaps = store.latest_all()
    errors = _errors(lambda: merge(snaps)) + _errors(lambda: merge({"a": store.open("a", STEP)}))
    assert len(set(errors)) == 1, errors
    cls, message, file = errors[0]
    assert cls is CorruptSnapshotError and file == data.name and data.name in message and "'a'" in message
    assert errors[0][1].count("checksum mismatch") == 1
    # the intact snapshot of the same store object (same cached base) still merges, bit for bit as a fresh one
    other = snaps["other"]
    got = merge({"other": other})
    want = merge({"other": SnapshotStore(store.root, create=False).open("other", STEP)})
    assert same(got, want)
    assert same(other.to_state_dict(), read_all(store.root, "other"))
    assert not same(got, base)  # the merge moved the weights (not a no-op)
