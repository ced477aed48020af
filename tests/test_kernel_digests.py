"""The native kernels' output bits, pinned: sha256 digests of every result of the RAM merge, RAM+, the counts,
the one-read RAM+ (merge_unscaled + rescale), the importance-weighted merge and the probe on fixed seeded
benchmark-like tensors (float32 and bfloat16, K = 1, 2, 3, 5, 8, odd lengths, several eps). The fixtures are drawn
the same on every CPU (:func:`tests.reference.portable_randn`, :func:`_linspace`), so the literals hold on every
machine and under every torch CPU dispatch (CI runs this file under ``ATEN_CPU_CAPABILITY=avx2`` and ``default``
too); every build level this host can run (AVX-512, AVX2, scalar) must give them. Re-taken with those fixtures
(issue 27) by the kernels that met the old fixtures' literals, which predate the kernels' move into
``ram_live/csrc``.

Regenerate (only when the merge's semantics change on purpose): ``PYTHONPATH=. python tests/test_kernel_digests.py``.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

import ram_live.methods.ram.native_weighted as wnative
import ram_live.kernels.probe as pnative
import ram_live.methods.ram.native as native
from ram_live.settings import SIMD_LEVELS
from tests.reference import portable_randn

KS = (1, 2, 3, 5, 8)
LENGTHS = (1, 31, 1000, 4099)
EPS = (0.0, 1e-5, 2.0**-9)
DENSITIES = (0.03, 0.46, 0.54, 0.10, 0.25, 0.35, 0.60, 0.05)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}

DIGESTS = {
    # counts: max |base| as the portable loops computed it; the AVX-512 loop of before took the unsigned maximum of
    # the raw bits, so any negative entry beat a larger positive one (fixed with the move)
    "counts/bf16": "ba2effce406074f109a6b1195a56216502da294da353b8317804cfa2698392c8",
    "counts/f32": "ec71e29360534a8f086d881bdfc48628b41b99748b7b89bfa01a94c483764a67",
    "merge/bf16": "09b8acb34f919327b4a61d980467bf4e5595855fca4e4fe5f6a98833e179d84c",
    "merge/f32": "be507f62a6826059addb9956287b77d091ff67dd0edaa94e358dfb5cae903ff5",
    "probe/bf16": "609a71aa8e83dae21c9ee9b97624d2e0a3573f918c63e6f9408708e279d37ed4",
    "probe/f32": "c87b85aea68ac7495053023c0432a18737c9173c6cc9c1ddc4fe3eb16f054ee5",
    "rescale/bf16": "157ecb2f7c2234ce0c657ec654051b340a75b25e03282697836c452fb1c1427d",
    "rescale/f32": "93ee32b3306d7701a1b201962dad6609babebcfa1bc3de0710c300acfb5653ee",
    "unscaled/bf16": "b73c3a290a3c3a2323d0236ddb0995680649a641a94f9874f6fff3321de74265",
    "unscaled/f32": "5450cad4189f681953e76e15b2c875a3d67ce8668bce9259367d66085b600e1a",
    "weighted/bf16": "2fad645163751b3a763dc86f2403cfbdeaba5e732620c3a9e783f135de700bce",
    "weighted/f32": "f0709a1aa260fe22f6a23fa9636d3c8f69f1779f716aa3bfdb208023d149d3da",
}
#: The probe's Gram sums (float32 lanes into float64) depend on which entries share a lane: one literal for the
#: AVX-512 probe (``simd_bits`` 512) and one for the portable loops (0). Its counts above are the same on all.
GRAM_DIGESTS = {
    512: {
        "gram/bf16": "d8cf78edd247cf7f448be4c72e1f15abc8ac8e2c6a5f9276c5427eed99cd005d",
        "gram/f32": "a0b5cde2f989a6b17a432ef6f8bb23f2673c47aa38262ad282665e33a21c59e7",
    },
    0: {
        "gram/bf16": "d4f19f7cf86057e2a2ae5e65d18d2c135d6a74905b3b275ef4f6803a903f670f",
        "gram/f32": "c7242256cfd6d51e5c7f9fe0fee8c02f8cd1311ff2a1982052f4adf360e74d78",
    },
}


def _inputs(dtype: torch.dtype, n: int, k: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A base and k agents as bench_merge builds them (agent t changes a share DENSITIES[t] of the entries by at
    least max(|w|/64, 1e-4)), plus deltas of exactly 2^-9 (the eps boundary) and tiny ones below 1e-5."""
    g = torch.Generator().manual_seed(seed)
    base = portable_randn(n, g) * 0.02
    agents = []
    for t in range(k):
        changed = torch.rand(n, generator=g) < DENSITIES[t]
        step = torch.maximum(base.abs() / 64, torch.full_like(base, 1e-4)) * portable_randn(n, g).sign()
        kind = torch.randint(0, 8, (n,), generator=g)
        delta = torch.where(kind == 0, torch.full_like(base, 2.0**-9), step)
        delta = torch.where(kind == 1, torch.full_like(base, 3e-6), delta)
        agents.append(torch.where(changed, base + delta, base))
    return base.to(dtype), [a.to(dtype) for a in agents]


def _linspace(start: float, end: float, k: int) -> torch.Tensor:
    """``torch.linspace`` in float64 Python arithmetic, rounded once to float32: the same on every CPU (torch's
    own rounds differently under its AVX2 and scalar dispatch)."""
    step = (end - start) / (k - 1) if k > 1 else 0.0
    return torch.tensor([start + step * t for t in range(k)], dtype=torch.float32)


def _importances(base: torch.Tensor, k: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    imps = [torch.rand(base.numel(), generator=g) * 4 for _ in range(k)]
    for h in imps:
        h[::7] = 0.0  # zero importances: w = 1 where M = 0
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
                lambdas = _linspace(0.5, 2.0, k)
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
                    feed(
                        f"probe/{dname}",
                        _bytes(counts.active, counts.unique, counts.inter, counts.histogram) + str(bad).encode(),
                    )
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
