"""Seeded fuzz of 1,200 manifest mutations (structure: values deleted, retyped, renumbered, renamed to paths
outside; bytes: flipped, inserted, cut) of a snapshot's and of the base's manifest: reading gives a library
error or the right values, never anything else; reading, re-taking the step and pruning never open or delete
a file outside the agent's folder and ``_base`` (os.open and every unlink are recorded), and sentinel files
outside the store and in another agent's folder survive byte for byte."""

from __future__ import annotations

import copy
import json
import os
import random
import warnings
from pathlib import Path

import pytest
from test_store_helpers import RUN, STEP, build, read_all, same

from ram_live.errors import RamLiveError
from ram_live.store import SnapshotStore, StoreWarning
from ram_live.store.format import data_step, is_base_data, is_store_temp, manifest_name

N = 1200


def _paths(node, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _mutate(doc, rng, hostile):
    """One random structural mutation of ``doc`` (in place)."""
    paths = [p for p, _ in _paths(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key, value = path[-1], parent[path[-1]]
    op = rng.randrange(7)
    if op == 0:
        del parent[key]
    elif op == 1 and isinstance(value, int) and not isinstance(value, bool):
        parent[key] = value + rng.choice([-1, 1, -value - 1, 2**31, 2**63])
    elif op == 2 and isinstance(value, str) and value:
        i = rng.randrange(len(value))
        parent[key] = value[:i] + rng.choice("0a/._-x\\") + value[i + 1 :]
    elif op == 3 and isinstance(parent, list) and len(parent) > 1:
        j = rng.randrange(len(parent))
        parent[key], parent[j] = parent[j], parent[key]
    elif op == 4 and isinstance(parent, list):
        parent.append(copy.deepcopy(value))
    elif op == 5:
        parent[key] = rng.choice(hostile)
    else:
        parent[key] = rng.choice([None, True, 0, -1, 1.5, 2**40, "", "x", [], {}, [0], {"a": 1}, [[[[]]]]])


def _bytes_mutation(data: bytes, rng) -> bytes:
    i = rng.randrange(len(data))
    op = rng.randrange(3)
    if op == 0:
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
    if op == 1:
        return data[:i] + bytes([rng.randrange(256)]) + data[i:]
    return data[:i] + data[i + rng.randrange(1, 40) :]


def test_manifest_fuzz_gives_errors_or_right_values_and_touches_nothing_outside(tmp_path, monkeypatch):
    store, base, agent = build(tmp_path / "store")
    root = store.root
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinels = [outside / "somefile", outside / f"{STEP:012d}-abcdef012345.p0.safetensors", outside / "base.json"]
    for p in sentinels:
        p.write_bytes(b"sentinel " + p.name.encode())
    other = root / "other"
    protected = {p: p.read_bytes() for p in sentinels + [q for q in other.iterdir()]}
    names = {
        k: [f["name"] for f in json.loads((root / k / m).read_text())["files"]]
        for k, m in (("a", manifest_name(STEP, RUN)), ("_base", "base.json"))
    }
    hostile = [
        "../../outside/somefile",
        f"../../outside/{STEP:012d}-abcdef012345.p0.safetensors",
        str(outside / "somefile"),
        "/etc/passwd",
        f"../other/{os.listdir(other)[0]}",
        "../_base/base.json",
        f"{STEP + 1:012d}-abcdef012345.p0.safetensors",
        "base-abcdef012345.p0.safetensors",
        names["a"][0],
        names["_base"][0],
        "..",
        "a/../../x",
        "\x00",
        "~" * 5000,
    ]
    pristine = {p: p.read_bytes() for folder in ("a", "_base") for p in (root / folder).iterdir()}
    writer = store.writer("a", base, run=RUN)

    opened, unlinked = [], []
    real_open, real_unlink = os.open, os.unlink

    def rec_open(path, *args, **kwargs):
        opened.append(os.path.abspath(path))
        return real_open(path, *args, **kwargs)

    def rec_unlink(path, *args, **kwargs):
        unlinked.append(os.path.abspath(path))
        return real_unlink(path, *args, **kwargs)

    allowed = {str(root / "a"), str(root / "_base"), str(root)}
    rng = random.Random(20261203)
    outcomes = {"error": 0, "right": 0, "struct": 0, "bytes": 0}
    monkeypatch.setattr(os, "open", rec_open)
    monkeypatch.setattr(os, "unlink", rec_unlink)
    monkeypatch.setattr(os, "remove", rec_unlink)
    warnings.simplefilter("ignore", StoreWarning)
    for trial in range(N):
        for folder in ("a", "_base"):  # back to the pristine store
            for p in (root / folder).iterdir():
                if p not in pristine:
                    real_unlink(p)  # not recorded: only the store's own removals are
        for p, data in pristine.items():
            if not p.exists() or p.read_bytes() != data:
                p.write_bytes(data)
        target = root / "a" / manifest_name(STEP, RUN) if rng.random() < 0.7 else root / "_base" / "base.json"
        raw = target.read_bytes()
        if rng.random() < 0.75:
            doc = json.loads(raw)
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                _mutate(doc, rng, hostile)
            target.write_text(json.dumps(doc))
            outcomes["struct"] += 1
        else:
            target.write_bytes(_bytes_mutation(raw, rng))
            outcomes["bytes"] += 1
        try:
            got = read_all(root)
        except RamLiveError:
            outcomes["error"] += 1
        else:
            assert same(got, agent), (trial, target.read_bytes()[:2000])
            outcomes["right"] += 1
        try:
            SnapshotStore(root, create=False).verify(["a"])  # reports, never raises
            if rng.random() < 0.5:
                writer.snapshot(agent, STEP)  # re-taking the step over the mutated manifest
            SnapshotStore(root, create=False).prune(0, "a")
            SnapshotStore(root, create=False).gc(grace_s=0)
        except RamLiveError:
            pass
    monkeypatch.undo()
    print(outcomes, len(opened), "opened", len(unlinked), "deleted")
    assert outcomes["error"] > N // 4 and outcomes["right"] > 20 and outcomes["bytes"] > 200, outcomes
    for path in opened:  # gc reads every agent's manifests (to know what they reference), nothing else of theirs
        p = Path(path)
        assert str(p.parent) in allowed or (p.parent == other and p.name == manifest_name(STEP, RUN)), f"opened {path}"
    assert unlinked
    for path in unlinked:
        p = Path(path)
        assert str(p.parent) in (str(root / "a"), str(root / "_base")), f"deleted {path}"
        own = (
            data_step(p.name) is not None or p.name == manifest_name(STEP, RUN)
            if p.parent.name == "a"
            else is_base_data(p.name)
        )
        assert own or is_store_temp(p.name, base=p.parent.name == "_base"), f"deleted {path}"
    for p, data in protected.items():
        assert p.read_bytes() == data, p
    assert len(opened) > N


@pytest.mark.parametrize("seed", range(3))
def test_store_json_fuzz(tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path / "s"
    SnapshotStore(root)
    raw = (root / "store.json").read_bytes()
    for _ in range(100):
        doc = json.loads(raw)
        _mutate(doc, rng, ["x"])
        (root / "store.json").write_bytes(rng.choice([json.dumps(doc).encode(), _bytes_mutation(raw, rng)]))
        try:
            SnapshotStore(root, create=False).agents()
        except RamLiveError:
            pass
