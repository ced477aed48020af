"""The native encoder/decoder of the store's importance codes (ram_live/store/native_codes.py, csrc/impcodes.c) gives
the torch path's bits at every build level this host runs: codes, maxima, decoded importances and refusals, on
random and edge inputs (zeros, -0.0, denormals, the float32 range's ends, NaN/Inf/negatives), every piece
encoding, lengths off the vector width, one thread and split over threads."""

from __future__ import annotations

import pytest
import torch

from ram_live.kernels import cc

from ram_live.store import native_codes as codes_native
from ram_live.errors import InputMismatchError
from ram_live.store.encoding import Encoded, pack_bits
from ram_live.store.importance_codes import (
    decode_piece,
    decode_piece_torch,
    encode_active,
    encode_active_torch,
    quantize,
)


def _builds():
    if not cc.native_enabled():
        return []
    host = cc.host_level()
    levels = [
        lv
        for lv in ("avx512", "avx2", "neon", "scalar")
        if lv == host or lv == "scalar" or (lv == "avx2" and host == "avx512")
    ]
    return [(lv, codes_native.build(list(cc.flags(lv)))) for lv in levels]


BUILDS = _builds()
LEVELS = [lv for lv, _ in BUILDS]
pytestmark = pytest.mark.skipif(not BUILDS, reason="native kernels off on this host")


def _values(n: int, seed: int) -> torch.Tensor:
    """float32 importances over the whole range: log-uniform from denormals to near the maximum, with zeros,
    -0.0, the smallest denormal, the largest float32 and exact powers of two mixed in."""
    g = torch.Generator().manual_seed(seed)
    e = torch.rand(n, generator=g, dtype=torch.float64) * 277 - 149
    h = torch.exp2(e).clamp_(max=3.4e38).float()
    special = torch.tensor(
        [0.0, -0.0, 1e-45, 1.1754942e-38, 1.1754944e-38, 3.4028235e38, 1.0, 2.0, 0.75, 1.0625, 1.0624999, 1.1875001]
    )
    pick = torch.randint(0, n, (min(n, 64),), generator=g)
    h[pick] = special[torch.randint(0, len(special), (len(pick),), generator=g)]
    return h


def _pieces(n: int, seed: int):
    """(encoding, positions, count, active mask) of several densities; positions as the writer makes them."""
    g = torch.Generator().manual_seed(seed)
    out = [("dense", None, n, torch.ones(n, dtype=torch.bool))]
    for density in (0.0, 0.002, 0.03, 0.3, 0.5, 0.97, 1.0):
        mask = torch.rand(n, generator=g) < density
        c = int(mask.sum())
        out.append(("bitmask", pack_bits(mask), c, mask))
        idx = mask.nonzero().view(-1)
        out.append(("indices", idx.to(torch.int32), c, mask))
        out.append(("indices", idx, c, mask))
    return out


def _kind(encoding: str, positions: torch.Tensor | None) -> str:
    if encoding != "indices":
        return encoding
    return "indices64" if positions.dtype == torch.int64 else "indices32"


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 8, 15, 17, 1000, 4133])
def test_codes_match_torch(level, dtype, n):
    lib = dict(BUILDS)[level]
    assert lib is not None, f"the {level} build failed where the host's own build works"
    for seed in range(3):
        h = _values(n, seed).to(dtype)
        h[torch.isinf(h)] = torch.finfo(dtype).max  # 3.4028235e38 rounds to Inf in bfloat16
        for encoding, positions, count, mask in _pieces(n, seed):
            got = lib.encode(h, _kind(encoding, positions), positions, count)
            want_codes, want_max = quantize(h[mask])
            assert not isinstance(got, int), (encoding, got)
            assert torch.equal(got[0], want_codes), (level, dtype, n, encoding, count)
            assert got[1] == want_max and str(got[1]) == str(want_max)
            # decoding: the torch path's float32 bits, 0 at the entries not stored
            native = lib.decode(got[0], got[1], _kind(encoding, positions), positions, n)
            ref = decode_piece_torch(want_codes, want_max, encoding, positions, n)
            assert torch.equal(native.view(torch.int32), ref.view(torch.int32))
            # bfloat16 holds every decoded importance exactly (3-bit mantissas: the low 16 bits are 0)
            assert not bool((ref.view(torch.int32) & 0xFFFF).any())
            half = lib.decode(got[0], got[1], _kind(encoding, positions), positions, n, torch.bfloat16)
            assert torch.equal(half.float().view(torch.int32), ref.view(torch.int32))


def test_codes_hand_computed():
    """Codes of a piece with maximum 2.0 (octave 1024 + 8 = 1032): q = octave + 255 - 1032, at least 1, 0 for 0."""
    lib = codes_native.kernels()
    h = torch.tensor([2.0, 1.0, 1.0625, 1.0624999, 0.0, -0.0, 1e-45, 2.0**-40, 1.5])
    codes, m = lib.encode(h, "dense", None, h.numel())
    # 1.0625 = 1 + 1/16 rounds up to 1 + 1/8 (ties away from zero in the integer rounding); 2^-40: 41 octaves
    # below the maximum, past the 31.75 kept: code 1
    assert codes.tolist() == [255, 247, 248, 247, 0, 0, 1, 1, 251] and m == 2.0
    assert decode_piece(codes, m, "dense", None, h.numel()).tolist()[:4] == [2.0, 1.0, 1.125, 1.0]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("order", ["ascending", "descending", "one big at the end"])
def test_growing_maximum_matches_torch(level, order):
    """Codes written against a running maximum that grows (block after block, up to the whole float32 range)
    are moved to the final one: the torch path's bits."""
    lib = dict(BUILDS)[level]
    n = 50_000
    h = _values(n, 3).sort().values
    if order == "descending":
        h = h.flip(0).contiguous()
    elif order == "one big at the end":
        h = h[torch.randperm(n, generator=torch.Generator().manual_seed(1))].clamp(max=1.0)
        h[-1] = 1e30
    mask = torch.rand(n, generator=torch.Generator().manual_seed(2)) < 0.6
    idx = mask.nonzero().view(-1)
    for kind, pos, active in (("dense", None, h), ("bitmask", pack_bits(mask), h[mask]), ("indices64", idx, h[mask])):
        got = lib.encode(h, kind, pos, active.numel())
        want = quantize(active)
        assert torch.equal(got[0], want[0]) and got[1] == want[1], (kind, order)


def test_largest_floats_decode_finite():
    """A maximum near float32's largest (its octave would round up to 2040, which decodes as Inf) counts from
    octave 2039: decoded within 1/16 and finite, on both paths."""
    lib = codes_native.kernels()
    h = torch.tensor([3.4028235e38, 3.3e38, 3.2e38, 1.0, 0.0])
    codes, m = lib.encode(h, "dense", None, 5)
    want = quantize(h)
    assert torch.equal(codes, want[0]) and m == want[1] == float(h[0])
    back = decode_piece(codes, m, "dense", None, 5)
    assert torch.isfinite(back).all() and torch.equal(back, decode_piece_torch(codes, m, "dense", None, 5))
    assert ((back[:3].double() - h[:3].double()).abs() <= h[:3].double() / 16).all()


@pytest.mark.parametrize("level", LEVELS)
def test_tiny_maxima_match_torch(level):
    """A piece whose maximum is a denormal (its octave 0 or 1: the clamp's lower bound passes its upper one)."""
    lib = dict(BUILDS)[level]
    for top in (1e-45, 3e-45, 5.9e-39, 1.1754942e-38):
        h = torch.tensor([top, top / 2, 0.0, top * 0.9, 1e-45], dtype=torch.float32)
        got = lib.encode(h, "dense", None, h.numel())
        want = quantize(h)
        assert torch.equal(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, -1e-39, float("-inf")])
def test_bad_importances_refused_only_at_stored_entries(level, bad):
    lib = dict(BUILDS)[level]
    n = 300
    h = torch.rand(n)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[::3] = True
    idx = mask.nonzero().view(-1).to(torch.int32)
    for at, stored in ((99, True), (100, False)):
        x = h.clone()
        x[at] = bad
        for dtype in (torch.float32, torch.bfloat16):
            y = x.to(dtype)
            for kind, pos in (("bitmask", pack_bits(mask)), ("indices32", idx)):
                got = lib.encode(y, kind, pos, int(mask.sum()))
                assert (got == codes_native.BAD_VALUE) if stored else not isinstance(got, int)
            got = lib.encode(y, "dense", None, n)
            assert got == codes_native.BAD_VALUE
    tiny = torch.tensor([1.0, -1e-45, 0.5])  # the negative denormal nearest 0 (not -0.0: refused)
    assert lib.encode(tiny, "dense", None, 3) == codes_native.BAD_VALUE


def test_encode_active_names_the_culprit_and_matches_torch():
    """The store's entry point: the native path's codes are the torch path's; a bad stored importance raises
    the same InputMismatchError (flat index and value) on either path."""
    n = 5000
    h = _values(n, 7)
    for encoding, positions, count, _ in _pieces(n, 7):
        enc = Encoded(encoding if count else "none", count, None, positions)
        if enc.encoding == "none":
            assert encode_active(h, enc, "w", "a") is None
            continue
        got, want = encode_active(h, enc, "w", "a"), encode_active_torch(h, enc, "w", "a")
        assert torch.equal(got[0], want[0]) and got[1] == want[1]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[1000:3000] = True
    h[2345] = -2.0
    enc = Encoded("bitmask", 2000, None, pack_bits(mask))
    for fn in (encode_active, encode_active_torch):
        with pytest.raises(InputMismatchError, match=r"agent 'a', tensor 'w': flat index 2345 is -2.0"):
            fn(h, enc, "w", "a")


def test_split_over_threads_matches(monkeypatch):
    """Pieces split over threads (ranges of whole bitmask bytes) give the one-range bits."""
    lib = codes_native.kernels()
    n = 100_003
    h = _values(n, 11)
    monkeypatch.setattr(codes_native, "SPLIT", 1000)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 4))
    try:
        for encoding, positions, count, mask in _pieces(n, 11):
            got = lib.encode(h, _kind(encoding, positions), positions, count)
            want = quantize(h[mask])
            assert torch.equal(got[0], want[0]) and got[1] == want[1], (encoding, count)
        bad = h.clone()
        bad[n - 5] = float("nan")
        assert lib.encode(bad, "dense", None, n) == codes_native.BAD_VALUE
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("level", LEVELS)
def test_decode_refuses_positions_that_do_not_match(level):
    """A bitmask marking another count than the codes, an index outside the piece, a dense piece of the wrong
    length: None on both paths (the store raises CorruptSnapshotError)."""
    lib = dict(BUILDS)[level]
    codes = torch.full((10,), 200, dtype=torch.uint8)
    mask = torch.zeros(64, dtype=torch.bool)
    for marked in (9, 11, 0):
        mask.zero_()
        mask[:marked] = True
        assert lib.decode(codes, 1.0, "bitmask", pack_bits(mask), 64) is None
        assert decode_piece_torch(codes, 1.0, "bitmask", pack_bits(mask), 64) is None
    for idx in (torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 64]), torch.tensor([-1, 1, 2, 3, 4, 5, 6, 7, 8, 9])):
        for dt in (torch.int32, torch.int64):
            kind = "indices32" if dt == torch.int32 else "indices64"
            assert lib.decode(codes, 1.0, kind, idx.to(dt), 64) is None
            assert decode_piece_torch(codes, 1.0, "indices", idx.to(dt), 64) is None
    assert lib.decode(codes, 1.0, "dense", None, 11) is None
    assert decode_piece_torch(codes, 1.0, "dense", None, 11) is None
    empty = torch.zeros(0, dtype=torch.uint8)
    mask.zero_()
    assert torch.equal(lib.decode(empty, 0.0, "bitmask", pack_bits(mask), 64), torch.zeros(64))
    mask[3] = True
    assert lib.decode(empty, 0.0, "bitmask", pack_bits(mask), 64) is None
