"""The snapshot store: format, bit-exact reconstruction, sizes, manifests, fingerprints, listing, pruning, merging
straight from a store."""

from __future__ import annotations

import json
import math
import os
import time
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from ram_live import probe, merge
from ram_live.errors import ConfigError, InputMismatchError, RamLiveError
from ram_live.store import (
    BaseMismatchError,
    CorruptSnapshotError,
    LocalModel,
    LocalTensor,
    SnapshotNotFoundError,
    SnapshotStore,
    fingerprint,
    pack_bits,
    unpack_bits,
)


def _base(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "emb": torch.randn(64, 32, generator=g).bfloat16(),
        "w": torch.randn(48, 40, generator=g),
        "h": torch.randn(40, 16, generator=g).half(),
        "d": torch.randn(5, 7, generator=g, dtype=torch.float64),
        "bias": torch.randn(40, generator=g),
        "scalar": torch.tensor(0.5),
        "empty": torch.zeros(0, 3),
        "ids": torch.arange(10),
        "flag": torch.tensor([True, False, True]),
    }


def _moved(base, density, seed, keys=None):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in base.items():
        if not v.dtype.is_floating_point or (keys is not None and k not in keys):
            out[k] = v.clone()
            continue
        mask = torch.rand(v.shape, generator=g) < density
        moved = (v.double() + 0.5 + torch.rand(v.shape, generator=g, dtype=torch.float64)).to(v.dtype)
        out[k] = torch.where(mask, moved, v)
    return out


def _bits_equal(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.reshape(-1).view(torch.uint8) if a.numel() else a.reshape(-1).to(torch.uint8),
            b.reshape(-1).view(torch.uint8) if b.numel() else b.reshape(-1).to(torch.uint8),
        )
    )


def _assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert _bits_equal(a[k], b[k]), k


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(tmp_path / "store", durable=False)


# ----------------------------------------------------------------------------------------------- encoding


@pytest.mark.parametrize("n", [1, 7, 8, 9, 63, 64, 1001])
def test_pack_bits_is_numpy_little_packbits(n):
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) < 0.4
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n / 8)
    np.testing.assert_array_equal(packed.numpy(), np.packbits(mask.numpy(), bitorder="little"))
    assert torch.equal(unpack_bits(packed, n), mask)


@pytest.mark.parametrize("path", ["numpy", "torch"])
@pytest.mark.parametrize(
    "density,encoding", [(0.0, "none"), (0.01, "indices"), (0.2, "bitmask"), (0.6, "bitmask"), (1.0, "dense")]
)
def test_encoding_is_the_smallest_and_reconstruction_bit_exact(store, density, encoding, path, monkeypatch):
    """Both selection paths: numpy's on CPU tensors, torch's (any device; here the CPU without numpy)."""
    import ram_live.store.encoding as store_module

    if path == "torch":
        monkeypatch.setattr(store_module, "_NUMPY", None)
    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(200, 100, generator=g).bfloat16(), "big": torch.randn(300_001, generator=g).half()}
    agent = {"w": base["w"].clone(), "big": base["big"].clone()}
    big_idx = torch.randperm(300_001, generator=g)[: int(density * 300_001)]
    agent["big"][big_idx] += 1.0  # spans two steps of the CPU path (2^18 elements each)
    n = 20000
    count = round(density * n)
    idx = torch.randperm(n, generator=g)[:count]
    agent["w"].view(-1)[idx] += 1.0  # every chosen entry changes (|w| + 1 is representable apart from w)
    changed = int((agent["w"].view(torch.int16) != base["w"].view(torch.int16)).sum())
    assert changed == count
    snap = store.writer("a", base).snapshot(agent, 1)
    piece = snap.manifest["tensors"]["w"]["pieces"][0]
    assert piece["encoding"] == encoding and piece["count"] == count
    assert _bits_equal(snap.get("w"), agent["w"]) and _bits_equal(snap.get("big"), agent["big"])
    assert snap.manifest["tensors"]["big"]["pieces"][0]["count"] == big_idx.numel()
    # sizes: values (2 bytes each) + positions, vs a dense copy of 40 000 bytes
    payload = {"none": 0, "indices": count * (2 + 4), "bitmask": count * 2 + n // 8, "dense": n * 2}[encoding]
    big = snap.manifest["tensors"]["big"]["pieces"][0]
    nb, cb = 300_001, big["count"]
    payload += {"none": 0, "indices": cb * (2 + 4), "bitmask": cb * 2 + (nb + 7) // 8, "dense": nb * 2}[big["encoding"]]
    assert snap.dense_bytes == 2 * n + 2 * nb
    header = snap.bytes - payload
    assert 0 <= header < 512, (snap.bytes, payload)
    assert snap.changed == count + cb


def test_every_dtype_and_odd_values_round_trip_bit_exactly(store):
    base = _base()
    agent = _moved(base, 0.3, 1)
    agent["w"][0, 0] = float("nan")
    agent["w"][0, 1] = -0.0 if base["w"][0, 1] == 0 else -base["w"][0, 1]
    agent["bias"][3] = float("inf")
    base["h"][1, 1] = 0.0
    agent["h"][1, 1] = -0.0  # same value, different bits: stored
    agent["ids"][2] = 99
    agent["flag"][1] = True
    agent["scalar"] = torch.tensor(-0.25)
    snap = store.writer("a", base).snapshot(agent, 7)
    for key in base:
        assert _bits_equal(snap.get(key), agent[key]), key
    assert snap.manifest["tensors"]["h"]["pieces"][0]["count"] >= 1
    assert snap.manifest["tensors"]["empty"]["pieces"][0]["encoding"] == "none"
    full = snap.to_state_dict()
    assert sorted(full) == sorted(agent) and all(_bits_equal(full[k], agent[k]) for k in agent)


# ----------------------------------------------------------------------------------------------- manifests


def test_manifest_fields_and_layout(store):
    base = _base()
    writer = store.writer("coder", base)
    before = time.time()
    snap = writer.snapshot(_moved(base, 0.05, 2), 50, epoch=3, extra={"reward": 0.7})
    m = json.loads((store.root / "coder" / f"000000000050.{writer.run}.json").read_text())
    assert m == snap.manifest and m["run"] == writer.run == snap.run and before - 1 <= m["run_started"]
    assert m["format"] == "ram_live.snapshot" and m["version"] == 2
    assert (m["agent"], m["step"], m["epoch"], m["extra"]) == ("coder", 50, 3, {"reward": 0.7})
    assert m["base_fingerprint"] == writer.fingerprint == store.base_fingerprint == fingerprint(base)
    assert m["dtype"] in ("bfloat16", "float32") and m["tensors"]["emb"]["dtype"] == "bfloat16"
    assert m["activity"] == {"rule": "changed"}
    assert before - 1 <= m["time"] <= time.time() + 1 and m["time_iso"].endswith("Z")
    assert m["stats"]["numel"] == sum(v.numel() for v in base.values())
    assert m["stats"]["bytes"] == sum(f["bytes"] for f in m["files"]) == snap.bytes
    for f in m["files"]:
        data = (store.root / "coder" / f["name"]).read_bytes()
        assert len(data) == f["bytes"] and f["crc32"] == f"{zlib.crc32(data):08x}"  # the plain CRC-32 of the file
    base_manifest = json.loads((store.root / "_base" / "base.json").read_text())
    assert base_manifest["version"] == 2
    for f in base_manifest["files"]:
        assert f["crc32"] == f"{zlib.crc32((store.root / '_base' / f['name']).read_bytes()):08x}"
    names = sorted(os.listdir(store.root / "coder"))
    assert names[-1] == f"000000000050.{writer.run}.json" and len(names) == 2
    assert not [n for n in os.listdir(store.root / "coder") if n.startswith(".tmp")]
    assert json.loads((store.root / "store.json").read_text()) == {"format": "ram_live.store", "version": 2}


def test_readers_trust_only_manifests(store):
    base = _base()
    writer = store.writer("a", base)
    writer.snapshot(_moved(base, 0.1, 1), 1)
    folder = store.root / "a"
    (folder / "000000000002-deadbeef0000.p0.safetensors").write_bytes(b"half a file")  # a killed write's data
    (folder / ".tmp-1234-000000000003.json").write_text("{")  # a killed manifest write
    assert store.steps("a") == [1] and [i.step for i in store.list("a")] == [1]
    assert store.latest("a").step == 1
    assert sorted(p.name for p in store.gc(grace_s=3600)) == []
    removed = store.gc(grace_s=0)
    assert sorted(p.name for p in removed) == [
        ".tmp-1234-000000000003.json",
        "000000000002-deadbeef0000.p0.safetensors",
    ]
    assert store.latest("a").step == 1


def test_a_snapshot_of_another_base_is_refused(store, tmp_path):
    base = _base()
    run = store.writer("a", base).run
    store.writer("a", base, run=run).snapshot(_moved(base, 0.1, 1), 1)
    other = _moved(base, 0.001, 9, keys={"w"})
    with pytest.raises(BaseMismatchError, match="fingerprint"):
        store.writer("b", other)
    # a manifest that claims another base (e.g. the store's base was replaced under it) is refused on open
    path = store.root / "a" / f"000000000001.{run}.json"
    m = json.loads(path.read_text())
    m["base_fingerprint"] = "rlfp1-" + "0" * 40
    path.write_text(json.dumps(m))
    with pytest.raises(BaseMismatchError):
        store.open("a", 1)
    assert issubclass(BaseMismatchError, RamLiveError) and issubclass(BaseMismatchError, ValueError)


def test_fingerprint_sees_one_bit_and_not_the_sharding():
    base = _base()
    fp = fingerprint(base)
    assert fp == fingerprint({k: v.clone() for k, v in base.items()})
    flipped = {k: v.clone() for k, v in base.items()}
    flipped["emb"].view(torch.int16)[3, 4] ^= 1
    assert fingerprint(flipped) != fp
    renamed = {("x" if k == "w" else k): v for k, v in base.items()}
    assert fingerprint(renamed) != fp
    # the same tensors cut into boxes (as ranks of a sharded model hold them) add up to the same sums
    import ram_live.store.encoding as store_module
    from ram_live.store.hashing import _box_hash

    # numpy's CPU path and torch's (other devices) compute the same integers
    for key, value in base.items():
        if value.numel():
            with_numpy = _box_hash(value, (0,) * value.dim(), tuple(value.shape))
            saved, store_module._NUMPY = store_module._NUMPY, None
            try:
                assert _box_hash(value, (0,) * value.dim(), tuple(value.shape)) == with_numpy, key
            finally:
                store_module._NUMPY = saved

    w = base["w"]
    whole = _box_hash(w, (0, 0), tuple(w.shape))
    parts = [
        _box_hash(w[:20, :15], (0, 0), w.shape),
        _box_hash(w[:20, 15:], (0, 15), w.shape),
        _box_hash(w[20:, :].contiguous(), (20, 0), w.shape),
    ]
    assert tuple(sum(p[i] for p in parts) % 2**64 for i in range(2)) == whole


# ----------------------------------------------------------------------------------------------- listing


def test_list_latest_prune(store):
    base = _base()
    wa, wb = store.writer("a", base), store.writer("b", base)
    for step in (5, 10, 15, 20):
        wa.snapshot(_moved(base, 0.05, step), step)
    wb.snapshot(_moved(base, 0.05, 99), 3)
    assert store.agents() == ["a", "b"]
    assert [(i.agent, i.step) for i in store.list()] == [("a", 5), ("a", 10), ("a", 15), ("a", 20), ("b", 3)]
    assert store.latest("a").step == 20 and store.latest("b").step == 3
    assert {k: s.step for k, s in store.latest_all().items()} == {"a": 20, "b": 3}
    opened = store.open("a", 5)  # a reader holding a snapshot that gets pruned keeps reading it
    removed = store.prune(keep=2)
    assert [(i.agent, i.step) for i in removed] == [("a", 5), ("a", 10)]
    assert store.steps("a") == [15, 20] and store.steps("b") == [3]
    assert _bits_equal(opened.get("w"), _moved(base, 0.05, 5)["w"])
    assert len(os.listdir(store.root / "a")) == 4  # two manifests + two data files
    with pytest.raises(SnapshotNotFoundError):
        store.open("a", 5)
    with pytest.raises(SnapshotNotFoundError):
        store.latest("nobody")
    with pytest.raises(ConfigError):
        store.latest("../etc")
    with pytest.raises(ConfigError):
        store.writer("_base", base)
    assert store.prune(keep=0, agent="b")[0].step == 3 and store.agents() == ["a"]


def test_retaking_a_step_replaces_it(store):
    base = _base()
    w = store.writer("a", base)
    w.snapshot(_moved(base, 0.05, 1), 4)
    again = _moved(base, 0.2, 2)
    w.snapshot(again, 4)
    assert store.steps("a") == [4] and _bits_equal(store.latest("a").get("emb"), again["emb"])
    assert len(os.listdir(store.root / "a")) == 2


def test_store_errors(tmp_path):
    with pytest.raises(SnapshotNotFoundError):
        SnapshotStore(tmp_path / "nothing", create=False)
    store = SnapshotStore(tmp_path / "s")
    with pytest.raises(SnapshotNotFoundError, match="no base"):
        store.base_source()
    base = _base()
    w = store.writer("a", base)
    with pytest.raises(InputMismatchError, match="dtype"):
        w.snapshot({k: (v.float() if k == "emb" else v) for k, v in base.items()}, 1)
    with pytest.raises(InputMismatchError):
        w.snapshot({k: v for k, v in base.items() if k != "w"}, 1)
    w.snapshot(base, 1)
    path = tmp_path / "s" / "a" / f"000000000001.{w.run}.json"
    m = json.loads(path.read_text())
    m["files"][0]["bytes"] += 1
    path.write_text(json.dumps(m))
    with pytest.raises(CorruptSnapshotError):
        store.open("a", 1)


# ----------------------------------------------------------------------------------------------- merging


def test_ram_merge_straight_from_the_store_equals_the_live_merge(store):
    base = _base()
    agents = {"coder": _moved(base, 0.03, 1), "tools": _moved(base, 0.46, 2), "memory": _moved(base, 0.54, 3)}
    for i, (name, sd) in enumerate(agents.items()):
        store.writer(name, base).snapshot(sd, 10 * (i + 1))
    latest = store.latest_all()
    assert list(latest) == ["coder", "memory", "tools"]  # by name
    latest = {name: latest[name] for name in agents}  # the live merge's order (float sums depend on it)
    for variant in ("ram", "ram_plus", "ram_plus_soft"):
        ours, info = merge(latest, method=variant, return_info=True)  # no base=: the store's
        ref, ref_info = merge(agents, base=base, method=variant, return_info=True)
        _assert_same(ours, ref)
        assert info.lambdas == ref_info.lambdas
    assert probe(latest).to_dict()["agents"] == probe(agents, base=base).to_dict()["agents"]
    # snapshots of two stores with different bases do not mix without a base
    other = SnapshotStore(store.root.parent / "other", durable=False)
    other.writer("x", _base(5)).snapshot(_base(5), 1)
    with pytest.raises(RamLiveError, match="different base"):
        merge({"coder": latest["coder"], "x": other.latest("x")})


def test_lossy_abs_snapshots_merge_like_the_live_agents(store):
    base = {k: v for k, v in _base().items() if v.dtype == torch.float32 and v.numel()}
    g = torch.Generator().manual_seed(4)
    agents = {}
    for name in ("a", "b"):
        sd = {}
        for k, v in base.items():
            tiny = torch.rand(v.shape, generator=g) < 0.5
            sd[k] = v + torch.where(tiny, 1e-6, 0.1) * torch.randn(v.shape, generator=g)
        agents[name] = sd
        store.writer(name, base, activity="abs", eps=1e-5).snapshot(sd, 1)
    snap = store.latest("a")
    assert snap.manifest["activity"] == {"rule": "abs", "eps": 1e-5} and not snap.lossless
    assert snap.changed < snap.numel * 0.6
    _assert_same(merge(store.latest_all()), merge(agents, base=base))


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight


def test_modules_with_tied_weights_and_buffers(store):
    torch.manual_seed(0)
    base = _Tied()
    agent = _Tied()
    agent.load_state_dict(base.state_dict())
    with torch.no_grad():
        agent.emb.weight[3] += 1
        agent.norm.running_mean += 0.5
    snap = store.writer("a", base).snapshot(agent, 1)
    assert snap.aliases() == {"head.weight": "emb.weight"}
    assert snap.spec("norm.running_mean").is_buffer and not snap.spec("emb.weight").is_buffer
    assert _bits_equal(snap.get("head.weight"), agent.emb.weight.detach())
    assert _bits_equal(snap.get("norm.running_mean"), agent.norm.running_mean)
    merged = merge({"a": snap}, base=base)  # a module out; buffers from the base; tie kept
    assert merged.head.weight is merged.emb.weight
    assert torch.equal(merged.emb.weight, agent.emb.weight) and torch.equal(
        merged.norm.running_mean, base.norm.running_mean
    )


def test_store_snapshot_streams_the_base_from_disk(store):
    base = _base()
    store.writer("a", base)
    agent = _moved(base, 0.1, 8)
    snap = store.snapshot("b", agent, 3)
    assert snap.manifest["base_fingerprint"] == store.base_fingerprint
    for k in base:
        assert _bits_equal(snap.get(k), agent[k])


def test_pieces_boxes_and_restricted_merges(store):
    """A sharded snapshot written as pieces (as two ranks would), read whole, by other boxes, and merged
    shard-wise: equals the merge of the whole tensors."""
    from ram_live.store.encoding import encode
    from ram_live.store.writer import activity_rule, piece_entry, CaptureTotals

    base = {k: v for k, v in _base().items() if v.dtype.is_floating_point and v.dim() == 2 and v.numel()}
    agents = {"a": _moved(base, 0.1, 1), "b": _moved(base, 0.4, 2)}
    whole = LocalModel.from_obj(base)
    store.set_base(base)
    fp = store.base_fingerprint

    def cut(sd, rank):  # rank 0 holds the first rows, rank 1 the rest (like Shard(0))
        tensors = {}
        for k, v in sd.items():
            half = v.shape[0] // 2
            lo, hi = (0, half) if rank == 0 else (half, v.shape[0])
            tensors[k] = LocalTensor(v[lo:hi].clone(), tuple(v.shape), (lo, 0))
        return LocalModel(tensors, {}, list(sd))

    for name, sd in agents.items():
        parts, totals = [], CaptureTotals()
        for rank in (0, 1):
            local, local_base = cut(sd, rank), cut(base, rank)
            tensors, pieces = {}, {}
            for k, t in local.tensors.items():
                rule = activity_rule("changed", 0)
                enc = encode(t.tensor.reshape(-1), local_base.tensors[k].tensor.reshape(-1), rule)
                pieces[k] = [piece_entry(k, rank, t, enc, tensors)]
                totals.add(t, enc)
            parts.append(store.write_part(name, 1, f"n{rank}", rank, tensors, pieces))
        run, started = store.open_run(name)
        rule = activity_rule("changed", 0)
        store.commit_snapshot(name, 1, parts, whole, fp, rule, totals, None, None, run=run, run_started=started)
    snaps = store.latest_all()
    assert len(snaps["a"].manifest["files"]) == 2
    for name, sd in agents.items():
        for k in sd:
            assert _bits_equal(snaps[name].get(k), sd[k])
            # a box across both pieces
            box = ((1, 2), (sd[k].shape[0] - 2, 3))
            assert _bits_equal(snaps[name].get_box(k, *box), sd[k][1:-1, 2:5])
    ref, info = merge(agents, base=base, return_info=True)
    # restricted sources (what each rank of a sharded merge reads), here with the whole model as one box
    full_sources = {n: s.restrict(whole.boxes(), n) for n, s in snaps.items()}
    merged, info2 = merge(full_sources, base=whole, return_info=True)
    _assert_same(merged, ref)
    assert info2.lambdas == info.lambdas
    half = {k: ((0, 0), (v.shape[0] // 2, v.shape[1])) for k, v in base.items()}
    merged_half = merge({n: s.restrict(half, n) for n, s in snaps.items()}, method="ram")
    ref_ram = merge(agents, base=base, method="ram")
    for k, v in merged_half.items():
        assert _bits_equal(v, ref_ram[k][: v.shape[0]])


@pytest.mark.parametrize("density", [0.01, 0.2, 0.97, 1.0])
def test_cpu_path_in_many_small_steps_and_threads(store, monkeypatch, density):
    """Steps of 64 elements over several threads: sparse and dense steps mixed in one tensor, each encoding."""
    import ram_live.store.encoding as store_module

    monkeypatch.setattr(store_module, "_CPU_CHUNK", 64)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    g = torch.Generator().manual_seed(5)
    base = {"w": torch.randn(10_000, generator=g).bfloat16(), "v": torch.randn(333, generator=g)}
    agent = {k: v.clone() for k, v in base.items()}
    for v in agent.values():
        v[torch.rand(v.shape, generator=g) < density] += 1.0
        v[:64] += 1.0  # one whole step changed: dense steps inside a sparse tensor
    snap = store.writer("a", base).snapshot(agent, 1)
    for k, value in base.items():
        assert _bits_equal(snap.get(k), agent[k]), k
        assert snap.manifest["tensors"][k]["pieces"][0]["count"] == int((agent[k] != value).sum())
    expected = {0.01: "indices", 0.2: "bitmask", 0.97: "dense", 1.0: "dense"}[density]
    assert snap.manifest["tensors"]["w"]["pieces"][0]["encoding"] == expected


_AT = float(torch.tensor(1e-3))  # float32(1e-3) > 1e-3
_BOUNDARY = {  # name: (base, agent, eps, entries active by hand)
    "f32": (
        torch.zeros(6),
        torch.tensor([_AT, -_AT, 2e-3, float(torch.nextafter(torch.tensor(_AT), torch.tensor(0.0))), 0.0, 5e-4]),
        1e-3,
        3,
    ),
    "bf16": (
        torch.ones(6, dtype=torch.bfloat16),
        torch.tensor([1 + 2**-7, 1 - 2**-7, 1 + 2**-6, 1 - 2**-8, 1.0, 1 + 2**-7], dtype=torch.bfloat16),
        2**-7 - 2**-40,
        4,
    ),
}


@pytest.mark.parametrize("case", sorted(_BOUNDARY))
@pytest.mark.parametrize("how", ["writer", "store"])
def test_lossy_snapshot_keeps_what_the_merge_counts_at_eps(tmp_path, case, how):
    base, agent, eps, by_hand = _BOUNDARY[case]
    store = SnapshotStore(tmp_path / "s", durable=False)
    if how == "writer":
        snap = store.writer("a", {"w": base}, activity="abs", eps=eps).snapshot({"w": agent}, 1)
    else:
        store.set_base({"w": base})
        snap = store.snapshot("a", {"w": agent}, 1, activity="abs", eps=eps)
    assert snap.changed == by_hand
    kept = snap.get("w")
    assert int((kept != base).sum()) == by_hand
    merged = merge([{"w": agent}, {"w": base.clone()}], base={"w": base}, method="ram", eps=eps)
    from_snapshot = merge([store.latest("a"), {"w": base.clone()}], base={"w": base}, method="ram", eps=eps)
    assert torch.equal(
        merged["w"].view(torch.int16 if case == "bf16" else torch.int32),
        from_snapshot["w"].view(torch.int16 if case == "bf16" else torch.int32),
    )
    assert int((merged["w"] != base).sum()) == by_hand
