"""The native kernels' output bits, pinned: sha256 digests of every result of the RAM merge, RAM+, the counts,
the one-read RAM+ (merge_unscaled + rescale), the importance-weighted merge and the probe on fixed seeded
benchmark-like tensors (float32 and bfloat16, K = 1, 2, 3, 5, 8, odd lengths, several eps). The literals were
taken from the kernels before they moved into ``ram_live/csrc`` and became portable vector code, so every build
level this host can run (AVX-512, AVX2, scalar) must give these bits.

Regenerate (only when the merge's semantics change on purpose): ``python tests/test_kernel_digests.py``.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

import ram_live.kernels.importance as wnative
import ram_live.kernels.probe as pnative
import ram_live.kernels.ram as native
from ram_live.settings import SIMD_LEVELS

KS = (1, 2, 3, 5, 8)
LENGTHS = (1, 31, 1000, 4099)
EPS = (0.0, 1e-5, 2.0 ** -9)
DENSITIES = (0.03, 0.46, 0.54, 0.10, 0.25, 0.35, 0.60, 0.05)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

DIGESTS = {
    # counts: max |base| as the portable loops computed it; the AVX-512 loop of before took the unsigned maximum of
    # the raw bits, so any negative entry beat a larger positive one (fixed with the move)
    "counts/bf16": "20e6f403c0faf65fee61456e8fdc618f00f66aa11d1718fc8b79db59622b4740",
    "counts/f32": "f8ad308d38171960ad19fee7df71c1a72825d03a7a62212685768035b1aba79b",
    "merge/bf16": "63a2abbcbf1b2f8e64c8cac870a646a3d94d80cf8c5ba0c79de3e1c77f858e71",
    "merge/f32": "5c2ab7dfeee56a225829bc53ca57232d3adc0dc7b980bd12026849f664e9a03e",
    "probe/bf16": "60f8daa9445bc54d2571aaabca27924c350943aad1dc355bc244dba010a5076a",
    "probe/f32": "5b512fb06d33254346706e527564c8020a0f947ccbef6042fddcc6f6d342b3bc",
    "rescale/bf16": "ebd01b1787407fad0c6657fdeb75f001c2088da376e3129d606fc92002b360be",
    "rescale/f32": "c3779717ce949b58de36ac562e4499f621438f010bd1d29a3934bd4f00f468d2",
    "unscaled/bf16": "3b2a04259fa506913b8e999bc4a290d56ae3c251c30505c88eafc5ee1908c36a",
    "unscaled/f32": "284141e5bb1f82c2616c6c21d281861582ef6b4588a59a3dabc2eda8173be978",
    "weighted/bf16": "d10f2a8e638c688e1af911d158c0b9fb7177b6ef429b812ba9cbc0b6b0573c53",
    "weighted/f32": "2c668eede7a10c06a7b123d01217cf4ab7f37bd064a913e881cc3809698aac0b",
}
#: The probe's Gram sums (float32 lanes into float64) depend on which entries share a lane: one literal for the
#: AVX-512 probe (``simd_bits`` 512) and one for the portable loops (0). Its counts above are the same on all.
GRAM_DIGESTS = {
    512: {"gram/bf16": "30719adf08352baa7411fdad5b0147bc874c1d9d947021c5aafd6576920390c5",
          "gram/f32": "57bb3736e685dadadfede4165be8f7d2340a7b917badedc1a341dc7a3784ca85"},
    0: {"gram/bf16": "ce57c154c1f07b0eed560d15991b14faed11c0dcb0c75f878dfe80bf105952ee",
        "gram/f32": "e7b0690ab6a0cdec7beaaad4ecb1dbf601b38dc959c590fc1289c096a41f7864"},
}


def _inputs(dtype: torch.dtype, n: int, k: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A base and k agents as bench_merge builds them (agent t changes a share DENSITIES[t] of the entries by at
    least max(|w|/64, 1e-4)), plus deltas of exactly 2^-9 (the eps boundary) and tiny ones below 1e-5."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, generator=g) * 0.02
    agents = []
    for t in range(k):
        changed = torch.rand(n, generator=g) < DENSITIES[t]
        step = torch.maximum(base.abs() / 64, torch.full_like(base, 1e-4)) * torch.randn(n, generator=g).sign()
        kind = torch.randint(0, 8, (n,), generator=g)
        delta = torch.where(kind == 0, torch.full_like(base, 2.0 ** -9), step)
        delta = torch.where(kind == 1, torch.full_like(base, 3e-6), delta)
        agents.append(torch.where(changed, base + delta, base))
    return base.to(dtype), [a.to(dtype) for a in agents]


def _importances(base: torch.Tensor, k: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    imps = [torch.rand(base.numel(), generator=g) * 4 for _ in range(k)]
    for h in imps:
        h[:: 7] = 0.0  # zero importances: w = 1 where M = 0
    return [h.to(dtype) for h in imps]


def _bytes(*tensors: torch.Tensor) -> bytes:
    return b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in tensors)


def compute(ram: native.Kernels, weighted: wnative.Kernels, probe: pnative.Kernel) -> dict[str, str]:
    """The digest of each (kernel, input dtype) over all K, lengths and eps."""
    hashes: dict[str, hashlib._Hash] = {}

    def feed(name: str, data: bytes) -> None:
        hashes.setdefault(name, hashlib.sha256()).update(data)

    for dname, dtype in DTYPES.items():
        for k in KS:
            for n in LENGTHS:
                base, agents = _inputs(dtype, n, k, seed=1000 * k + n)
                lambdas = torch.linspace(0.5, 2.0, k, dtype=torch.float32)
                for eps in EPS:
                    for out_name, out_dtype in DTYPES.items():
                        for lam in (None, lambdas):
                            out = torch.zeros(n, dtype=out_dtype)
                            bad = ram.merge(out, base, agents, lam, eps, 0, n)
                            feed(f"merge/{dname}", _bytes(out) + f"{out_name}{bad}".encode())
                    active, unique = torch.zeros(k, dtype=torch.int64), torch.zeros(k, dtype=torch.int64)
                    amax = torch.zeros(2, dtype=torch.float32)
                    bad = ram.counts(base, agents, eps, 0, n, active, unique, amax)
                    feed(f"counts/{dname}", _bytes(active, unique, amax) + str(bool(bad)).encode())
                    if k <= native.MAX_UNSCALED_AGENTS:
                        out = torch.zeros(n, dtype=dtype)
                        planes = torch.zeros(native.planes_numel(n, k), dtype=torch.int32)
                        active.zero_(), unique.zero_()
                        bad = ram.merge_unscaled(out, base, agents, eps, 0, n, planes, active, unique)
                        feed(f"unscaled/{dname}", _bytes(out, active, unique) + str(bad).encode())
                        bad = ram.rescale(out, base, planes, lambdas, 0, n)
                        feed(f"rescale/{dname}", _bytes(out) + str(bad).encode())
                    counts = pnative.ProbeCounts.zeros(k)
                    bad = probe.probe(base, agents, eps, 0, n, counts)
                    feed(f"probe/{dname}", _bytes(counts.active, counts.unique, counts.inter, counts.histogram)
                         + str(bad).encode())
                    feed(f"gram/{dname}", _bytes(counts.gram))
                    if k <= 5:
                        for hname, hdtype in DTYPES.items():
                            imps = _importances(base, k, hdtype, seed=n + k)
                            for lam in (None, lambdas):
                                out = torch.zeros(n, dtype=dtype)
                                bad = weighted.merge_weighted(out, base, agents, imps, lam, eps, 0, n)
                                feed(f"weighted/{dname}", _bytes(out) + f"{hname}{bad}".encode())
    return {name: h.hexdigest() for name, h in sorted(hashes.items())}


def _builds() -> list[tuple[str, tuple]]:
    """(level, (ram, weighted, probe)) for each build level this host can run, each forced by its flags."""
    from ram_live.kernels import cc

    host = cc.host_level()
    levels = [lv for lv in SIMD_LEVELS if lv == host or lv == "scalar" or (lv == "avx2" and host == "avx512")]
    builds = []
    for level in levels:
        flags = cc.flags(level)
        builds.append((level, (native.build(flags), wnative.build(flags), pnative.build(flags))))
    return builds if cc.native_enabled() and native.kernels() is not None else []


BUILDS = _builds()


@pytest.mark.skipif(not BUILDS, reason="no C compiler: native kernels unavailable")
@pytest.mark.parametrize("level", [name for name, _ in BUILDS])
def test_kernel_digests(level):
    kernels = dict(BUILDS)[level]
    assert None not in kernels, f"the {level} build failed where the host's own build works"
    assert kernels[0].simd_bits == (512 if level == "avx512" else 0)
    assert compute(*kernels) == {**DIGESTS, **GRAM_DIGESTS[kernels[2].simd_bits]}


if __name__ == "__main__":
    for name, digest in compute(*BUILDS[0][1]).items():
        print(f'    "{name}": "{digest}",')
