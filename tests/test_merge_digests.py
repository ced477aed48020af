"""The merges' output bits, pinned end to end: sha256 digests of what :func:`ram_live.merge` returns for every
registered method (several settings each) on fixed seeded benchmark-like models, through each engine path (the
native kernels, the torch kernels with ``RAM_LIVE_NATIVE=0``, ``compile=True``, the one-read RAM+ into memory, the
streaming two-pass write to safetensors, importance-weighted RAM, tensor-local ρ), plus the λ the merges report.

The fixtures are drawn the same on every CPU (:func:`tests.reference.portable_randn`; ``torch.randn`` is not), so the
literals hold on every machine and under every torch CPU dispatch: the merges' arithmetic is correctly rounded
single operations with contraction off in the native kernels and the torch paths alike (CI runs this file again
under ``ATEN_CPU_CAPABILITY=avx2`` and ``default``). The literals were re-taken with those fixtures (issue 27) by
the code whose old-fixture digests, taken before the engine was split into a package (issue 18), it still met.
Regenerate (only when a merge's semantics change on purpose): ``PYTHONPATH=. python tests/test_merge_digests.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ram_live
from tests.reference import portable_randn
from ram_live.kernels import cc

SHAPES = {
    "embed.weight": (97, 48),
    "block.0.attn.weight": (48, 48),
    "block.0.mlp.weight": (130, 48),
    "block.0.norm.weight": (48,),
    "head.bias": (1,),
    "lm_head.weight": (97, 48),
}
DENSITIES = (0.04, 0.45, 0.55, 0.12, 0.3)

#: (method, options) merged in every path; ``importance`` marks a curvature-aware RAM case.
CASES = {
    "ram": ("ram", {}),
    "ram_changed": ("ram", {"activity": "changed", "eps": 0.0}),
    "ram_eps": ("ram", {"eps": 2.0**-9}),
    "ram_lambdas": ("ram", {"lambdas": {"a0": 1.5, "a1": 0.5, "a2": 2.0}}),
    "ram_exclude": ("ram", {"exclude": ["a1"]}),
    "ram_plus": ("ram_plus", {}),
    "ram_plus_inf": ("ram_plus", {"r": 0.3, "alpha": math.inf}),
    "ram_plus_tensor": ("ram_plus", {"r": 0.2, "alpha": 1.0, "rho_scope": "tensor"}),
    "ram_plus_soft": ("ram_plus_soft", {"r": 0.2}),
    "ram_importance": ("ram", {"importance": True}),
    "ram_plus_importance": ("ram_plus", {"importance": True}),
    "linear": ("linear", {}),
    "task_arithmetic": ("task_arithmetic", {"scale": 0.7}),
    "ties": ("ties", {"density": 0.3, "scale": 1.0}),
    "dare_linear": ("dare_linear", {"density": 0.5, "seed": 3}),
    "dare_ties": ("dare_ties", {"density": 0.5, "seed": 3}),
}
#: engine paths: (name, merge keyword options, environment)
PATHS = {
    "native": ({}, {}),
    "torch": ({"compile": False}, {"RAM_LIVE_NATIVE": "0"}),
    "file": ({"out": True, "chunk_numel": 4096}, {}),
    "small_chunks": ({"chunk_numel": 1000, "compile": False}, {"RAM_LIVE_NATIVE": "0"}),
}


def _models(dtype: torch.dtype, k: int = 3, seed: int = 7) -> tuple[dict, dict, dict]:
    """A base, ``k`` agents (agent t changes a share DENSITIES[t] of each tensor by steps of ~|w|/64, some at
    exactly the eps boundary 2^-9) and positive importances with zeros, all seeded."""
    g = torch.Generator().manual_seed(seed)
    base = {key: portable_randn(shape, g) * 0.02 for key, shape in SHAPES.items()}
    agents, importance = {}, {}
    for t in range(k):
        sd, imp = {}, {}
        for key, w in base.items():
            changed = torch.rand(w.shape, generator=g) < DENSITIES[t]
            step = torch.maximum(w.abs() / 64, torch.full_like(w, 1e-4)) * portable_randn(w.shape, g).sign()
            kind = torch.randint(0, 8, w.shape, generator=g)
            delta = torch.where(kind == 0, torch.full_like(w, 2.0**-9), step)
            sd[key] = torch.where(changed, w + delta, w).to(dtype)
            h = torch.rand(w.shape, generator=g) * 3
            h.view(-1)[::5] = 0.0
            imp[key] = h
        agents[f"a{t}"], importance[f"a{t}"] = sd, imp
    return {k_: v.to(dtype) for k_, v in base.items()}, agents, importance


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """``env`` set in ``os.environ`` for the block, the old values back after it."""
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _digest(out: dict, extra: str = "") -> str:
    h = hashlib.sha256()
    for key in sorted(out):
        t = out[key].contiguous()
        h.update(f"{key}:{t.dtype}:{list(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(extra.encode())
    return h.hexdigest()


def _run(case: str, path: str, dtype: torch.dtype, tmp: Path) -> str:
    method, options = CASES[case]
    options = dict(options)
    kwargs, env = PATHS[path]
    kwargs = dict(kwargs)
    base, agents, importance = _models(dtype)
    if options.pop("importance", False):
        options["importance"] = importance
    if kwargs.pop("out", False):
        kwargs["out"] = tmp / f"{case}_{path}_{dtype}".replace("torch.", "")
    with _environment(env):
        result, info = ram_live.merge(agents, base, method, return_info=True, **kwargs, **options)
    if "out" in kwargs:
        result = {}
        for file in sorted(Path(kwargs["out"]).glob("*.safetensors")):
            result.update(load_file(file))
    lambdas = {name: round(float(v), 12) for name, v in sorted((info.lambdas or {}).items())}
    return _digest(result, repr(lambdas))


def _probe_report(dtype: torch.dtype, path: str) -> dict:
    base, agents, _ = _models(dtype)
    env = PATHS[path][1]
    with _environment(env):
        return ram_live.probe(agents, base, eps=2.0**-9, r=0.2, alpha=1.0).to_dict()


def _probe(dtype: torch.dtype, path: str) -> str:
    """The digest of the probe's report but its cosines, every float at full precision: all of it comes from
    integer counts by single IEEE operations (the same bits on every CPU)."""
    report = _probe_report(dtype, path)
    report["pairwise"].pop("cosine")
    return hashlib.sha256(repr(report).encode()).hexdigest()


#: How far a reported cosine may be from the float64 reference (the native Gram sums float32 lanes first).
COSINE_TOLERANCE = 1e-6


def _reference_cosines(dtype: torch.dtype) -> list[list[float]]:
    """Cosines of the raw task vectors in float64: τ in float32 as the probe forms it, exact float64 products."""
    base, agents, _ = _models(dtype)
    taus = [
        torch.cat([(a[key].float() - base[key].float()).reshape(-1) for key in SHAPES]).double()
        for a in agents.values()
    ]
    gram = [[float((u * v).sum()) for v in taus] for u in taus]
    return [[gram[i][j] / math.sqrt(gram[i][i] * gram[j][j]) for j in range(len(taus))] for i in range(len(taus))]


def compute(tmp: Path) -> dict[str, str]:
    out = {}
    for dname, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        for path in ("native", "torch"):
            out[f"probe/{path}/{dname}"] = _probe(dtype, path)
    for dname, dtype in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        for case in CASES:
            for path in PATHS:
                out[f"{case}/{path}/{dname}"] = _run(case, path, dtype, tmp)
    return out


DIGESTS: dict[str, str] = {
    "probe/native/bf16": "c8cbedd279b4159681c00785d9d573191393249704a143ae1724df74692ae6a2",
    "probe/torch/bf16": "c8cbedd279b4159681c00785d9d573191393249704a143ae1724df74692ae6a2",
    "probe/native/f32": "02b7a905deaf40e3942f2708e30dc5251b97d234eac17a65c4c6b29d3c8c021b",
    "probe/torch/f32": "02b7a905deaf40e3942f2708e30dc5251b97d234eac17a65c4c6b29d3c8c021b",
    "ram/native/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram/torch/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram/file/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram/small_chunks/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram_changed/native/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram_changed/torch/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram_changed/file/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram_changed/small_chunks/bf16": "be3d4333037a19ddfb2276214f7dd2fb611516031c3185670edc8b867d36f992",
    "ram_eps/native/bf16": "070d9b348fb26a5c5f3d558ea5e6335f45b59fa242c0a1788e2169e336a3c8d3",
    "ram_eps/torch/bf16": "070d9b348fb26a5c5f3d558ea5e6335f45b59fa242c0a1788e2169e336a3c8d3",
    "ram_eps/file/bf16": "070d9b348fb26a5c5f3d558ea5e6335f45b59fa242c0a1788e2169e336a3c8d3",
    "ram_eps/small_chunks/bf16": "070d9b348fb26a5c5f3d558ea5e6335f45b59fa242c0a1788e2169e336a3c8d3",
    "ram_lambdas/native/bf16": "07bdaba91f8db82f4d527588db453e3dde89ba579859f15c43e3fef8b5b00216",
    "ram_lambdas/torch/bf16": "07bdaba91f8db82f4d527588db453e3dde89ba579859f15c43e3fef8b5b00216",
    "ram_lambdas/file/bf16": "07bdaba91f8db82f4d527588db453e3dde89ba579859f15c43e3fef8b5b00216",
    "ram_lambdas/small_chunks/bf16": "07bdaba91f8db82f4d527588db453e3dde89ba579859f15c43e3fef8b5b00216",
    "ram_exclude/native/bf16": "c7e4bfa07bce32f3552d8fd8d7b1aacb312d064e782b7149d6a5a46a4a6b6187",
    "ram_exclude/torch/bf16": "c7e4bfa07bce32f3552d8fd8d7b1aacb312d064e782b7149d6a5a46a4a6b6187",
    "ram_exclude/file/bf16": "c7e4bfa07bce32f3552d8fd8d7b1aacb312d064e782b7149d6a5a46a4a6b6187",
    "ram_exclude/small_chunks/bf16": "c7e4bfa07bce32f3552d8fd8d7b1aacb312d064e782b7149d6a5a46a4a6b6187",
    "ram_plus/native/bf16": "3ea4ffacd179ec4f9f48b7da6f5f265c1a376647327ed8979ecf65704d94dc3a",
    "ram_plus/torch/bf16": "3ea4ffacd179ec4f9f48b7da6f5f265c1a376647327ed8979ecf65704d94dc3a",
    "ram_plus/file/bf16": "3ea4ffacd179ec4f9f48b7da6f5f265c1a376647327ed8979ecf65704d94dc3a",
    "ram_plus/small_chunks/bf16": "3ea4ffacd179ec4f9f48b7da6f5f265c1a376647327ed8979ecf65704d94dc3a",
    "ram_plus_inf/native/bf16": "e1f0ef2e44de9081becda9b3432d9a98774a3d68509bb9692a681d3d5e05b05d",
    "ram_plus_inf/torch/bf16": "e1f0ef2e44de9081becda9b3432d9a98774a3d68509bb9692a681d3d5e05b05d",
    "ram_plus_inf/file/bf16": "e1f0ef2e44de9081becda9b3432d9a98774a3d68509bb9692a681d3d5e05b05d",
    "ram_plus_inf/small_chunks/bf16": "e1f0ef2e44de9081becda9b3432d9a98774a3d68509bb9692a681d3d5e05b05d",
    "ram_plus_tensor/native/bf16": "fcd1322c99c16e3333adcf9bad07ce3d22710abc83c71254ad6c08d5e9d1ab23",
    "ram_plus_tensor/torch/bf16": "fcd1322c99c16e3333adcf9bad07ce3d22710abc83c71254ad6c08d5e9d1ab23",
    "ram_plus_tensor/file/bf16": "fcd1322c99c16e3333adcf9bad07ce3d22710abc83c71254ad6c08d5e9d1ab23",
    "ram_plus_tensor/small_chunks/bf16": "fcd1322c99c16e3333adcf9bad07ce3d22710abc83c71254ad6c08d5e9d1ab23",
    "ram_plus_soft/native/bf16": "935cadbcaa6235538e3a2ee12eeb56d6862d04be16a2a5c55d37e0a07b8efd4f",
    "ram_plus_soft/torch/bf16": "935cadbcaa6235538e3a2ee12eeb56d6862d04be16a2a5c55d37e0a07b8efd4f",
    "ram_plus_soft/file/bf16": "935cadbcaa6235538e3a2ee12eeb56d6862d04be16a2a5c55d37e0a07b8efd4f",
    "ram_plus_soft/small_chunks/bf16": "935cadbcaa6235538e3a2ee12eeb56d6862d04be16a2a5c55d37e0a07b8efd4f",
    "ram_importance/native/bf16": "2e0c614c697d6797cbb054bcd432b56a3e66e6cf4bd3803d5eda35039d693a2b",
    "ram_importance/torch/bf16": "2e0c614c697d6797cbb054bcd432b56a3e66e6cf4bd3803d5eda35039d693a2b",
    "ram_importance/file/bf16": "2e0c614c697d6797cbb054bcd432b56a3e66e6cf4bd3803d5eda35039d693a2b",
    "ram_importance/small_chunks/bf16": "2e0c614c697d6797cbb054bcd432b56a3e66e6cf4bd3803d5eda35039d693a2b",
    "ram_plus_importance/native/bf16": "06df2076dd73dc4cf36cd008d249b878c5cd1a50de1be7c96efc61b3ca713f06",
    "ram_plus_importance/torch/bf16": "06df2076dd73dc4cf36cd008d249b878c5cd1a50de1be7c96efc61b3ca713f06",
    "ram_plus_importance/file/bf16": "06df2076dd73dc4cf36cd008d249b878c5cd1a50de1be7c96efc61b3ca713f06",
    "ram_plus_importance/small_chunks/bf16": "06df2076dd73dc4cf36cd008d249b878c5cd1a50de1be7c96efc61b3ca713f06",
    "linear/native/bf16": "d62a1950541be4c4377416c25b5d0c146bc1a691a78d0d7f5ca3c6447f1e8284",
    "linear/torch/bf16": "d62a1950541be4c4377416c25b5d0c146bc1a691a78d0d7f5ca3c6447f1e8284",
    "linear/file/bf16": "d62a1950541be4c4377416c25b5d0c146bc1a691a78d0d7f5ca3c6447f1e8284",
    "linear/small_chunks/bf16": "d62a1950541be4c4377416c25b5d0c146bc1a691a78d0d7f5ca3c6447f1e8284",
    "task_arithmetic/native/bf16": "174b97da6a94ee37faeee51d77714ef66daa3218b94970029fcd6b344e5d4eef",
    "task_arithmetic/torch/bf16": "174b97da6a94ee37faeee51d77714ef66daa3218b94970029fcd6b344e5d4eef",
    "task_arithmetic/file/bf16": "174b97da6a94ee37faeee51d77714ef66daa3218b94970029fcd6b344e5d4eef",
    "task_arithmetic/small_chunks/bf16": "174b97da6a94ee37faeee51d77714ef66daa3218b94970029fcd6b344e5d4eef",
    "ties/native/bf16": "48fc50af0ef9e8ccff4042095cbc8a0048e68f9ce8b60e848c87b19cf9ace560",
    "ties/torch/bf16": "48fc50af0ef9e8ccff4042095cbc8a0048e68f9ce8b60e848c87b19cf9ace560",
    "ties/file/bf16": "48fc50af0ef9e8ccff4042095cbc8a0048e68f9ce8b60e848c87b19cf9ace560",
    "ties/small_chunks/bf16": "48fc50af0ef9e8ccff4042095cbc8a0048e68f9ce8b60e848c87b19cf9ace560",
    "dare_linear/native/bf16": "1c224fbaf33d0903fd903875f91759091ea775dc9d9f15db7d509fe070f75bbd",
    "dare_linear/torch/bf16": "1c224fbaf33d0903fd903875f91759091ea775dc9d9f15db7d509fe070f75bbd",
    "dare_linear/file/bf16": "1c224fbaf33d0903fd903875f91759091ea775dc9d9f15db7d509fe070f75bbd",
    "dare_linear/small_chunks/bf16": "1c224fbaf33d0903fd903875f91759091ea775dc9d9f15db7d509fe070f75bbd",
    "dare_ties/native/bf16": "aec54f4f4a0cbbdc8b2d200d4064bcccfa19196fd1a06df51e94036db271e06e",
    "dare_ties/torch/bf16": "aec54f4f4a0cbbdc8b2d200d4064bcccfa19196fd1a06df51e94036db271e06e",
    "dare_ties/file/bf16": "aec54f4f4a0cbbdc8b2d200d4064bcccfa19196fd1a06df51e94036db271e06e",
    "dare_ties/small_chunks/bf16": "aec54f4f4a0cbbdc8b2d200d4064bcccfa19196fd1a06df51e94036db271e06e",
    "ram/native/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram/torch/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram/file/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram/small_chunks/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram_changed/native/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram_changed/torch/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram_changed/file/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram_changed/small_chunks/f32": "b59ec228851fd7e0021054a89bf57f8c402a67e976a695c90d32522d8c97a97e",
    "ram_eps/native/f32": "d7385516a7bee76c29322f49b7805ba7e7fd5928ff2c2e2b63ecca2ff229487e",
    "ram_eps/torch/f32": "d7385516a7bee76c29322f49b7805ba7e7fd5928ff2c2e2b63ecca2ff229487e",
    "ram_eps/file/f32": "d7385516a7bee76c29322f49b7805ba7e7fd5928ff2c2e2b63ecca2ff229487e",
    "ram_eps/small_chunks/f32": "d7385516a7bee76c29322f49b7805ba7e7fd5928ff2c2e2b63ecca2ff229487e",
    "ram_lambdas/native/f32": "b4c1c6f20af7d485461ce82c715f82bab67943b9218810d7662fcd908969f163",
    "ram_lambdas/torch/f32": "b4c1c6f20af7d485461ce82c715f82bab67943b9218810d7662fcd908969f163",
    "ram_lambdas/file/f32": "b4c1c6f20af7d485461ce82c715f82bab67943b9218810d7662fcd908969f163",
    "ram_lambdas/small_chunks/f32": "b4c1c6f20af7d485461ce82c715f82bab67943b9218810d7662fcd908969f163",
    "ram_exclude/native/f32": "1077b9b23767b8abaeff65086516db103dbc7211b5944dd1083c0f7c9a5b9c66",
    "ram_exclude/torch/f32": "1077b9b23767b8abaeff65086516db103dbc7211b5944dd1083c0f7c9a5b9c66",
    "ram_exclude/file/f32": "1077b9b23767b8abaeff65086516db103dbc7211b5944dd1083c0f7c9a5b9c66",
    "ram_exclude/small_chunks/f32": "1077b9b23767b8abaeff65086516db103dbc7211b5944dd1083c0f7c9a5b9c66",
    "ram_plus/native/f32": "138ec9f763116edde05e1c34df53a84c24c5651ee198e115aff07e958f9da3ad",
    "ram_plus/torch/f32": "138ec9f763116edde05e1c34df53a84c24c5651ee198e115aff07e958f9da3ad",
    "ram_plus/file/f32": "138ec9f763116edde05e1c34df53a84c24c5651ee198e115aff07e958f9da3ad",
    "ram_plus/small_chunks/f32": "138ec9f763116edde05e1c34df53a84c24c5651ee198e115aff07e958f9da3ad",
    "ram_plus_inf/native/f32": "6a3c2a52bd56fa828b57c0019150d69e9f489a4fe068ace768ece2295887d36e",
    "ram_plus_inf/torch/f32": "6a3c2a52bd56fa828b57c0019150d69e9f489a4fe068ace768ece2295887d36e",
    "ram_plus_inf/file/f32": "6a3c2a52bd56fa828b57c0019150d69e9f489a4fe068ace768ece2295887d36e",
    "ram_plus_inf/small_chunks/f32": "6a3c2a52bd56fa828b57c0019150d69e9f489a4fe068ace768ece2295887d36e",
    "ram_plus_tensor/native/f32": "f22cc583bcd6b0baa65fb35f475f479ff935971dd7980916c98add0be2134f61",
    "ram_plus_tensor/torch/f32": "f22cc583bcd6b0baa65fb35f475f479ff935971dd7980916c98add0be2134f61",
    "ram_plus_tensor/file/f32": "f22cc583bcd6b0baa65fb35f475f479ff935971dd7980916c98add0be2134f61",
    "ram_plus_tensor/small_chunks/f32": "f22cc583bcd6b0baa65fb35f475f479ff935971dd7980916c98add0be2134f61",
    "ram_plus_soft/native/f32": "d7fc5fb871c3a58a3f3277ce5fe1fedc46a15281237e79459695ebf6b29ddf31",
    "ram_plus_soft/torch/f32": "d7fc5fb871c3a58a3f3277ce5fe1fedc46a15281237e79459695ebf6b29ddf31",
    "ram_plus_soft/file/f32": "d7fc5fb871c3a58a3f3277ce5fe1fedc46a15281237e79459695ebf6b29ddf31",
    "ram_plus_soft/small_chunks/f32": "d7fc5fb871c3a58a3f3277ce5fe1fedc46a15281237e79459695ebf6b29ddf31",
    "ram_importance/native/f32": "fb41004c6c342b27b4b2441eeb201fac7e856ca35a0a97441e8fbcf40277e156",
    "ram_importance/torch/f32": "fb41004c6c342b27b4b2441eeb201fac7e856ca35a0a97441e8fbcf40277e156",
    "ram_importance/file/f32": "fb41004c6c342b27b4b2441eeb201fac7e856ca35a0a97441e8fbcf40277e156",
    "ram_importance/small_chunks/f32": "fb41004c6c342b27b4b2441eeb201fac7e856ca35a0a97441e8fbcf40277e156",
    "ram_plus_importance/native/f32": "240fb8943924c78a136b64bed63d2560b1c8c5eb7a445b573d47bf842091f145",
    "ram_plus_importance/torch/f32": "240fb8943924c78a136b64bed63d2560b1c8c5eb7a445b573d47bf842091f145",
    "ram_plus_importance/file/f32": "240fb8943924c78a136b64bed63d2560b1c8c5eb7a445b573d47bf842091f145",
    "ram_plus_importance/small_chunks/f32": "240fb8943924c78a136b64bed63d2560b1c8c5eb7a445b573d47bf842091f145",
    "linear/native/f32": "4e88bb1e679e0111f11f40a6ee203d094fd5fa7973100302eccaf3a23d44f79c",
    "linear/torch/f32": "4e88bb1e679e0111f11f40a6ee203d094fd5fa7973100302eccaf3a23d44f79c",
    "linear/file/f32": "4e88bb1e679e0111f11f40a6ee203d094fd5fa7973100302eccaf3a23d44f79c",
    "linear/small_chunks/f32": "4e88bb1e679e0111f11f40a6ee203d094fd5fa7973100302eccaf3a23d44f79c",
    "task_arithmetic/native/f32": "7c52562c2874076bc487228958232ff218293fca1b186b54cba4bfb4c1e2b1d5",
    "task_arithmetic/torch/f32": "7c52562c2874076bc487228958232ff218293fca1b186b54cba4bfb4c1e2b1d5",
    "task_arithmetic/file/f32": "7c52562c2874076bc487228958232ff218293fca1b186b54cba4bfb4c1e2b1d5",
    "task_arithmetic/small_chunks/f32": "7c52562c2874076bc487228958232ff218293fca1b186b54cba4bfb4c1e2b1d5",
    "ties/native/f32": "8fbde0890bbeeeba58e236b81107ed4309afd92bd2f77a27db11fbd684e77af2",
    "ties/torch/f32": "8fbde0890bbeeeba58e236b81107ed4309afd92bd2f77a27db11fbd684e77af2",
    "ties/file/f32": "8fbde0890bbeeeba58e236b81107ed4309afd92bd2f77a27db11fbd684e77af2",
    "ties/small_chunks/f32": "8fbde0890bbeeeba58e236b81107ed4309afd92bd2f77a27db11fbd684e77af2",
    "dare_linear/native/f32": "c418cd125fceea2aed1c0d381355bf26cf6148138e3a085daf01db2bbe459a6d",
    "dare_linear/torch/f32": "c418cd125fceea2aed1c0d381355bf26cf6148138e3a085daf01db2bbe459a6d",
    "dare_linear/file/f32": "c418cd125fceea2aed1c0d381355bf26cf6148138e3a085daf01db2bbe459a6d",
    "dare_linear/small_chunks/f32": "c418cd125fceea2aed1c0d381355bf26cf6148138e3a085daf01db2bbe459a6d",
    "dare_ties/native/f32": "19e46c8f97632185ab3884f029dc1db1dec39ef2f1fe5cb6b43f887b4f4482c8",
    "dare_ties/torch/f32": "19e46c8f97632185ab3884f029dc1db1dec39ef2f1fe5cb6b43f887b4f4482c8",
    "dare_ties/file/f32": "19e46c8f97632185ab3884f029dc1db1dec39ef2f1fe5cb6b43f887b4f4482c8",
    "dare_ties/small_chunks/f32": "19e46c8f97632185ab3884f029dc1db1dec39ef2f1fe5cb6b43f887b4f4482c8",
}


@pytest.mark.parametrize("dname", ["bf16", "f32"])
@pytest.mark.parametrize("case", list(CASES))
def test_merge_digests(case, dname, tmp_path):
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dname]
    for path in PATHS:
        if path == "native" and not (cc.native_enabled()):
            continue
        assert _run(case, path, dtype, tmp_path) == DIGESTS[f"{case}/{path}/{dname}"], (case, path, dname)


@pytest.mark.parametrize("dname", ["bf16", "f32"])
@pytest.mark.parametrize("path", ["native", "torch"])
def test_probe_digests(path, dname):
    """Every number of the report but the cosines: one literal for both paths and every CPU; the cosines within
    :data:`COSINE_TOLERANCE` of the float64 reference."""
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dname]
    assert _probe(dtype, path) == DIGESTS[f"probe/{path}/{dname}"]
    cosine = _probe_report(dtype, path)["pairwise"]["cosine"]
    want = _reference_cosines(dtype)
    for row, want_row in zip(cosine, want, strict=True):
        assert row == pytest.approx(want_row, abs=COSINE_TOLERANCE, rel=0)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, digest in compute(Path(tmp)).items():
            print(f'    "{name}": "{digest}",')
