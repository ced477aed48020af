"""Importances stored with snapshots (issue 20): kept at the active entries as 8-bit log codes, read back as a
TensorSource, checksummed and validated like the rest; merge(store.latest_all(), importance="stored") uses them
(every agent must have them)."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from ram_live import merge
from ram_live.errors import ConfigError, InputMismatchError
from ram_live.store import CorruptSnapshotError, SnapshotStore
from ram_live.store.importance_codes import ImportanceSource, dequantize, quantize
from ram_live.store.manifest import check_snapshot


def _setup(tmp_path, n_agents=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = {
        "w": torch.randn(40, 24, generator=g),
        "v": torch.randn(300, generator=g).bfloat16(),
        "buf": torch.arange(6, dtype=torch.int64),
    }
    agents, imps = {}, {}
    for i in range(n_agents):
        a = {k: t.clone() for k, t in base.items()}
        mask = torch.rand(40, 24, generator=g) < 0.3
        a["w"] = torch.where(mask, a["w"] + 0.05 * torch.randn(40, 24, generator=g), a["w"])
        a["v"][i * 50 : i * 50 + 120] += 0.25  # overlaps: shared entries
        agents[f"a{i}"] = a
        imps[f"a{i}"] = {"w": torch.rand(40, 24, generator=g) ** 4, "v": torch.rand(300, generator=g)}
    return base, agents, imps


def _write(tmp_path, base, agents, imps, which=None):
    store = SnapshotStore(tmp_path / "store")
    for name, a in agents.items():
        w = store.writer(name, base=base)
        w.snapshot(a, step=5, importance=imps[name] if which is None or name in which else None)
    return store


def _reference(h):
    """A stored importance from the definition (float64): h rounded to a 3-bit mantissa."""
    h = h.double()
    e = torch.floor(torch.log2(h))
    return (torch.exp2(e) * (1 + torch.floor((h / torch.exp2(e) - 1) * 8 + 0.5) / 8)).float()


def test_round_trip_at_active_entries(tmp_path):
    base, agents, imps = _setup(tmp_path)
    store = _write(tmp_path, base, agents, imps)
    snap = store.latest("a1")
    assert snap.manifest["version"] == 3 and snap.manifest["importance"] == {"encoding": "log8", "steps_per_octave": 8}
    src = snap.importance
    assert sorted(src.keys()) == ["v", "w"]  # buffers and integer tensors carry none
    for key in ("w", "v"):
        active = agents["a1"][key].view(-1) != base[key].view(-1)
        got = src.get(key)
        assert got.dtype == torch.bfloat16 and got.shape == base[key].shape  # exact: 3-bit mantissas
        assert torch.equal(got.float(), ImportanceSource(snap, torch.float32).get(key))
        got = got.float()
        assert torch.all(got.view(-1)[~active] == 0)  # nothing stored at inactive entries
        h = imps["a1"][key].view(-1)
        inside = active & (h >= h[active].max() * 2**-31.5)  # below: clamped to the smallest code
        assert int((active & ~inside).sum()) > 0 or key == "v"
        assert torch.equal(got.view(-1)[inside], _reference(h[inside]))
        floor = got.view(-1)[active & ~inside]
        assert not floor.numel() or (torch.all(floor == floor.min()) and torch.all(floor > 0))  # code 1, not 0
        rel = (got.view(-1)[inside] - h[inside]).abs() / h[inside]
        assert float(rel.max()) <= 1 / 16  # half a step of a 3-bit mantissa
    # the codes themselves are bit-exact: re-encoding the decoded values gives the same codes
    p = snap.manifest["tensors"]["w"]["pieces"][0]
    codes = snap._files.tensor(p["file"], p["importance"])
    again, _ = quantize(dequantize(codes, p["importance_max"]))
    assert torch.equal(again, codes)


def test_quantize_zero_and_tiny():
    h = torch.tensor([0.0, 1.0, 0.5, 1e-30, 2.0**-31.75])
    codes, m = quantize(h)
    assert m == 1.0 and codes.tolist() == [0, 255, 247, 1, 1]  # 0.5: one octave = 8 codes down
    assert dequantize(codes, m).tolist()[:3] == [0.0, 1.0, 0.5]
    assert quantize(torch.zeros(3))[0].tolist() == [0, 0, 0]


def test_snapshot_without_importance_stays_version_2(tmp_path):
    base, agents, imps = _setup(tmp_path, 1)
    store = _write(tmp_path, base, agents, imps, which=())
    snap = store.latest("a0")
    assert snap.manifest["version"] == 2 and "importance" not in snap.manifest and snap.importance is None


def test_store_latest_all_merges_with_stored_importances(tmp_path):
    base, agents, imps = _setup(tmp_path)
    store = _write(tmp_path, base, agents, imps)
    snaps = store.latest_all()
    merged, info = merge(snaps, return_info=True, importance="stored")
    assert info.extra["importance"] == "stored"
    given = {
        n: s.importance.to_state_dict()
        if hasattr(s.importance, "to_state_dict")
        else {k: s.importance.get(k) for k in s.importance.keys()}
        for n, s in snaps.items()
    }
    expect, info2 = merge(
        {n: s.to_state_dict() for n, s in snaps.items()}, base=store.base_source(), importance=given, return_info=True
    )
    assert info2.extra["importance"] == "given"
    for k in ("w", "v"):
        assert torch.equal(merged[k], expect[k])
    plain = merge({n: s.to_state_dict() for n, s in snaps.items()}, base=store.base_source())
    assert not torch.equal(merged["w"], plain["w"])  # the importances change the shared entries


def test_store_without_or_with_partial_importances(tmp_path):
    base, agents, imps = _setup(tmp_path)
    store = _write(tmp_path / "none", base, agents, imps, which=())
    plain_sd = merge({n: s.to_state_dict() for n, s in store.latest_all().items()}, base=store.base_source())
    merged, info = merge(store.latest_all(), return_info=True)
    assert "importance" not in info.extra and torch.equal(merged["w"], plain_sd["w"])
    part = _write(tmp_path / "part", base, agents, imps, which=("a0", "a2"))
    merged2, info2 = merge(part.latest_all(), return_info=True)  # None: plain RAM, whatever the snapshots carry
    assert "importance" not in info2.extra and torch.equal(merged2["w"], plain_sd["w"])
    with pytest.raises(ConfigError, match=r"agent\(s\) 'a1' carry no stored importances"):
        merge(part.latest_all(), importance="stored")


def test_bad_importances_are_refused_before_writing(tmp_path):
    base, agents, imps = _setup(tmp_path, 1)
    store = SnapshotStore(tmp_path / "store")
    w = store.writer("a0", base=base)
    bad = dict(imps["a0"], w=imps["a0"]["w"].clone())
    i = int((agents["a0"]["w"].view(-1) != base["w"].view(-1)).nonzero()[5, 0])  # an active entry
    bad["w"].view(-1)[i] = -1.0
    with pytest.raises(InputMismatchError, match=f"'a0'.*'w'.*flat index {i} is -1.0"):
        w.snapshot(agents["a0"], step=1, importance=bad)
    bad["w"].view(-1)[i] = math.nan
    with pytest.raises(InputMismatchError, match=f"flat index {i} is nan"):
        w.snapshot(agents["a0"], step=1, importance=bad)
    with pytest.raises(InputMismatchError, match="'a0'.*'v'.*shape"):
        w.snapshot(agents["a0"], step=1, importance=dict(imps["a0"], v=torch.ones(299)))
    with pytest.raises(InputMismatchError, match="no tensor 'v'"):
        w.snapshot(agents["a0"], step=1, importance={"w": imps["a0"]["w"]})
    assert store.steps("a0") == [] and not list((tmp_path / "store" / "a0").glob("*.safetensors"))


def test_checksums_cover_importance_codes(tmp_path):
    base, agents, imps = _setup(tmp_path, 1)
    store = _write(tmp_path, base, agents, imps)
    (data,) = sorted((store.root / "a0").glob("*.safetensors"))
    snap = store.latest("a0")
    p = snap.manifest["tensors"]["w"]["pieces"][0]
    header = json.loads(data.read_bytes()[8 : 8 + int.from_bytes(data.read_bytes()[:8], "little")])
    start = 8 + int.from_bytes(data.read_bytes()[:8], "little") + header[p["importance"]]["data_offsets"][0]
    raw = bytearray(data.read_bytes())
    raw[start + 2] ^= 0x10  # one bit of one importance code
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptSnapshotError) as exc:
        store.latest("a0").importance.get("w")
    assert exc.value.file == data.name
    assert not store.verify().ok


def test_manifest_importance_fields_validated(tmp_path):
    base, agents, imps = _setup(tmp_path, 1)
    store = _write(tmp_path, base, agents, imps)
    good = store.latest("a0").manifest
    check_snapshot(good, "a0", 5, good["run"])

    def refused(edit, match):
        m = json.loads(json.dumps(good))
        edit(m)
        with pytest.raises(CorruptSnapshotError, match=match):
            check_snapshot(m, "a0", 5, good["run"])

    refused(lambda m: m.update(version=2), "version 3")
    refused(lambda m: m.update(importance={"encoding": "bf16"}), "log8")
    refused(lambda m: m["tensors"]["w"]["pieces"][0].pop("importance"), "needs 'importance'")
    refused(lambda m: m["tensors"]["w"]["pieces"][0].update(importance_max=math.inf), "finite")
    refused(lambda m: m["tensors"]["w"]["pieces"][0].update(importance_max=-1.0), "finite")
    refused(lambda m: m["tensors"]["w"]["pieces"][0].update(importance="w@0/values"), "named twice")
    refused(
        lambda m: (
            m["tensors"]["buf"]["pieces"][0].update(importance="x", importance_max=1.0)
            if m["tensors"]["buf"]["pieces"][0]["encoding"] != "none"
            else m["tensors"]["buf"]["pieces"][0].update(importance="x", importance_max=1.0)
        ),
        "has no 'importance'",
    )

    def no_head(m):
        del m["importance"]

    refused(no_head, "has no 'importance'")
    # the count of codes the file must hold: a manifest claiming another count is caught when the file is opened
    m = json.loads(json.dumps(good))
    m["tensors"]["w"]["pieces"][0]["importance"] = m["tensors"]["w"]["pieces"][0]["importance"]
    check_snapshot(m, "a0", 5, good["run"])


def test_restricted_snapshot_importance_boxes(tmp_path):
    base, agents, imps = _setup(tmp_path, 1)
    store = _write(tmp_path, base, agents, imps)
    snap = store.latest("a0")
    boxed = snap.restrict({"w": ((8, 0), (16, 24)), "v": ((100,), (50,)), "buf": ((0,), (6,))})
    assert torch.equal(boxed.importance.get("w"), snap.importance.get("w")[8:24])
    assert torch.equal(boxed.importance.get("v"), snap.importance.get("v")[100:150])


def test_merge_reads_store_importances_with_every_method_of_the_family(tmp_path):
    base, agents, imps = _setup(tmp_path)
    store = _write(tmp_path, base, agents, imps)
    snaps = store.latest_all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sd, info = merge(snaps, method="ram_plus", return_info=True, importance="stored")
        assert info.extra["importance"] == "stored"
        _, info = merge(snaps, method="task_arithmetic", scale=0.5, return_info=True)
        assert "importance" not in info.extra  # plain: no importances asked for
    with pytest.raises(ConfigError, match="takes no importance"):
        merge(snaps, method="task_arithmetic", scale=0.5, importance="stored")  # other methods take none
