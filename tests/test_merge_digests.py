"""The merges' output bits, pinned end to end: sha256 digests of what :func:`ram_live.merge` returns for every
registered method (several settings each) on fixed seeded benchmark-like models, through each engine path (the
native kernels, the torch kernels with ``RAM_LIVE_NATIVE=0``, ``compile=True``, the one-read RAM+ into memory, the
streaming two-pass write to safetensors, importance-weighted RAM, tensor-local ρ), plus the λ the merges report.

The literals were taken before the engine was split into a package (issue 18): the redesign must not change a bit.
Regenerate (only when a merge's semantics change on purpose): ``python tests/test_merge_digests.py``.
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
from ram_live.kernels import cc

SHAPES = {"embed.weight": (97, 48), "block.0.attn.weight": (48, 48), "block.0.mlp.weight": (130, 48),
          "block.0.norm.weight": (48,), "head.bias": (1,), "lm_head.weight": (97, 48)}
DENSITIES = (0.04, 0.45, 0.55, 0.12, 0.3)

#: (method, options) merged in every path; ``importance`` marks a curvature-aware RAM case.
CASES = {
    "ram": ("ram", {}),
    "ram_changed": ("ram", {"activity": "changed", "eps": 0.0}),
    "ram_eps": ("ram", {"eps": 2.0 ** -9}),
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
    base = {key: torch.randn(shape, generator=g) * 0.02 for key, shape in SHAPES.items()}
    agents, importance = {}, {}
    for t in range(k):
        sd, imp = {}, {}
        for key, w in base.items():
            changed = torch.rand(w.shape, generator=g) < DENSITIES[t]
            step = torch.maximum(w.abs() / 64, torch.full_like(w, 1e-4)) * torch.randn(w.shape, generator=g).sign()
            kind = torch.randint(0, 8, w.shape, generator=g)
            delta = torch.where(kind == 0, torch.full_like(w, 2.0 ** -9), step)
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


def _probe(dtype: torch.dtype, path: str) -> str:
    base, agents, _ = _models(dtype)
    env = PATHS[path][1]
    with _environment(env):
        report = ram_live.probe(agents, base, eps=2.0 ** -9, r=0.2, alpha=1.0)
    return hashlib.sha256(repr(_rounded(report.to_dict())).encode()).hexdigest()


def _rounded(value):
    """Floats to 6 significant digits: the probe's Gram sums depend on the SIMD width (float32 lanes)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


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
    "probe/native/bf16": "96fd82444da2a63b37868d603aa337fc172fe314c64fb49c996bbceb3b71714b",
    "probe/torch/bf16": "96fd82444da2a63b37868d603aa337fc172fe314c64fb49c996bbceb3b71714b",
    "probe/native/f32": "58a86894ec829f093dcc41a6e93f883d3dcb24c514b136fe92b0b5b560072d34",
    "probe/torch/f32": "58a86894ec829f093dcc41a6e93f883d3dcb24c514b136fe92b0b5b560072d34",
    "ram/native/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram/torch/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram/file/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram/small_chunks/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram_changed/native/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram_changed/torch/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram_changed/file/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram_changed/small_chunks/bf16": "bb746b4b83d93960ed865a2e523517b97332709060a35359fdfa291811f0e433",
    "ram_eps/native/bf16": "33c63ad8b1a275af8424e5776b65c825725f3c8a52a7c0276ba101bd770af22f",
    "ram_eps/torch/bf16": "33c63ad8b1a275af8424e5776b65c825725f3c8a52a7c0276ba101bd770af22f",
    "ram_eps/file/bf16": "33c63ad8b1a275af8424e5776b65c825725f3c8a52a7c0276ba101bd770af22f",
    "ram_eps/small_chunks/bf16": "33c63ad8b1a275af8424e5776b65c825725f3c8a52a7c0276ba101bd770af22f",
    "ram_lambdas/native/bf16": "e0f0ad054a8b4f360176d198eb65e65809bb9960d48f4f0637bf51841800f634",
    "ram_lambdas/torch/bf16": "e0f0ad054a8b4f360176d198eb65e65809bb9960d48f4f0637bf51841800f634",
    "ram_lambdas/file/bf16": "e0f0ad054a8b4f360176d198eb65e65809bb9960d48f4f0637bf51841800f634",
    "ram_lambdas/small_chunks/bf16": "e0f0ad054a8b4f360176d198eb65e65809bb9960d48f4f0637bf51841800f634",
    "ram_exclude/native/bf16": "61cbec0f5beb3385884c9b69361c4aa49d04b142934788b6360ce04d08c63b98",
    "ram_exclude/torch/bf16": "61cbec0f5beb3385884c9b69361c4aa49d04b142934788b6360ce04d08c63b98",
    "ram_exclude/file/bf16": "61cbec0f5beb3385884c9b69361c4aa49d04b142934788b6360ce04d08c63b98",
    "ram_exclude/small_chunks/bf16": "61cbec0f5beb3385884c9b69361c4aa49d04b142934788b6360ce04d08c63b98",
    "ram_plus/native/bf16": "8fd05a6b0ce4acceda2ec6462b7a946497aa9f4f60f7d9b2c6012c416da86469",
    "ram_plus/torch/bf16": "8fd05a6b0ce4acceda2ec6462b7a946497aa9f4f60f7d9b2c6012c416da86469",
    "ram_plus/file/bf16": "8fd05a6b0ce4acceda2ec6462b7a946497aa9f4f60f7d9b2c6012c416da86469",
    "ram_plus/small_chunks/bf16": "8fd05a6b0ce4acceda2ec6462b7a946497aa9f4f60f7d9b2c6012c416da86469",
    "ram_plus_inf/native/bf16": "6e8c7350aebf3275c14ebd7f60ccc1f8af75c3877c7bb85bbb63c23dd5cc9161",
    "ram_plus_inf/torch/bf16": "6e8c7350aebf3275c14ebd7f60ccc1f8af75c3877c7bb85bbb63c23dd5cc9161",
    "ram_plus_inf/file/bf16": "6e8c7350aebf3275c14ebd7f60ccc1f8af75c3877c7bb85bbb63c23dd5cc9161",
    "ram_plus_inf/small_chunks/bf16": "6e8c7350aebf3275c14ebd7f60ccc1f8af75c3877c7bb85bbb63c23dd5cc9161",
    "ram_plus_tensor/native/bf16": "4fdc243d3dc55dcfd61748506ba64ec2ea8d2e60673baba4fee669cddd073b70",
    "ram_plus_tensor/torch/bf16": "4fdc243d3dc55dcfd61748506ba64ec2ea8d2e60673baba4fee669cddd073b70",
    "ram_plus_tensor/file/bf16": "4fdc243d3dc55dcfd61748506ba64ec2ea8d2e60673baba4fee669cddd073b70",
    "ram_plus_tensor/small_chunks/bf16": "4fdc243d3dc55dcfd61748506ba64ec2ea8d2e60673baba4fee669cddd073b70",
    "ram_plus_soft/native/bf16": "b257670c22d22e0ed31b293eb3c745a3182e7eb0a6f61fd207d132442bee19d4",
    "ram_plus_soft/torch/bf16": "b257670c22d22e0ed31b293eb3c745a3182e7eb0a6f61fd207d132442bee19d4",
    "ram_plus_soft/file/bf16": "b257670c22d22e0ed31b293eb3c745a3182e7eb0a6f61fd207d132442bee19d4",
    "ram_plus_soft/small_chunks/bf16": "b257670c22d22e0ed31b293eb3c745a3182e7eb0a6f61fd207d132442bee19d4",
    "ram_importance/native/bf16": "2f14fb5e8525a2b7b17a0b70b8a550a316e3453438c41835ca27ac73007b1e0a",
    "ram_importance/torch/bf16": "2f14fb5e8525a2b7b17a0b70b8a550a316e3453438c41835ca27ac73007b1e0a",
    "ram_importance/file/bf16": "2f14fb5e8525a2b7b17a0b70b8a550a316e3453438c41835ca27ac73007b1e0a",
    "ram_importance/small_chunks/bf16": "2f14fb5e8525a2b7b17a0b70b8a550a316e3453438c41835ca27ac73007b1e0a",
    "ram_plus_importance/native/bf16": "f7807fd44ef205e28b51c961127493b15c36f5dfd52dcc769e3adb106026dcf2",
    "ram_plus_importance/torch/bf16": "f7807fd44ef205e28b51c961127493b15c36f5dfd52dcc769e3adb106026dcf2",
    "ram_plus_importance/file/bf16": "f7807fd44ef205e28b51c961127493b15c36f5dfd52dcc769e3adb106026dcf2",
    "ram_plus_importance/small_chunks/bf16": "f7807fd44ef205e28b51c961127493b15c36f5dfd52dcc769e3adb106026dcf2",
    "linear/native/bf16": "86d72a20f69400e460b1457a69691c5268c97343eb1b6dbff7aa8c562ea4e32e",
    "linear/torch/bf16": "86d72a20f69400e460b1457a69691c5268c97343eb1b6dbff7aa8c562ea4e32e",
    "linear/file/bf16": "86d72a20f69400e460b1457a69691c5268c97343eb1b6dbff7aa8c562ea4e32e",
    "linear/small_chunks/bf16": "86d72a20f69400e460b1457a69691c5268c97343eb1b6dbff7aa8c562ea4e32e",
    "task_arithmetic/native/bf16": "16dc0216ed9cb0eb17638e2026225eda528f8c5b8810d185b8ea0acf6fd16f2d",
    "task_arithmetic/torch/bf16": "16dc0216ed9cb0eb17638e2026225eda528f8c5b8810d185b8ea0acf6fd16f2d",
    "task_arithmetic/file/bf16": "16dc0216ed9cb0eb17638e2026225eda528f8c5b8810d185b8ea0acf6fd16f2d",
    "task_arithmetic/small_chunks/bf16": "16dc0216ed9cb0eb17638e2026225eda528f8c5b8810d185b8ea0acf6fd16f2d",
    "ties/native/bf16": "7f716c4ef58079df16dc03f53710cc4040946b0e97161b84e3457659b0b996a0",
    "ties/torch/bf16": "7f716c4ef58079df16dc03f53710cc4040946b0e97161b84e3457659b0b996a0",
    "ties/file/bf16": "7f716c4ef58079df16dc03f53710cc4040946b0e97161b84e3457659b0b996a0",
    "ties/small_chunks/bf16": "7f716c4ef58079df16dc03f53710cc4040946b0e97161b84e3457659b0b996a0",
    "dare_linear/native/bf16": "fd08c99bb509cd5d56c84dbc1775f7f317463dcc3718b0630bcb0b35a270982d",
    "dare_linear/torch/bf16": "fd08c99bb509cd5d56c84dbc1775f7f317463dcc3718b0630bcb0b35a270982d",
    "dare_linear/file/bf16": "fd08c99bb509cd5d56c84dbc1775f7f317463dcc3718b0630bcb0b35a270982d",
    "dare_linear/small_chunks/bf16": "fd08c99bb509cd5d56c84dbc1775f7f317463dcc3718b0630bcb0b35a270982d",
    "dare_ties/native/bf16": "f17b0899a5e89e1671a3e76d3764e1ffd47a87083b4dd68ab38db3e70ac01524",
    "dare_ties/torch/bf16": "f17b0899a5e89e1671a3e76d3764e1ffd47a87083b4dd68ab38db3e70ac01524",
    "dare_ties/file/bf16": "f17b0899a5e89e1671a3e76d3764e1ffd47a87083b4dd68ab38db3e70ac01524",
    "dare_ties/small_chunks/bf16": "f17b0899a5e89e1671a3e76d3764e1ffd47a87083b4dd68ab38db3e70ac01524",
    "ram/native/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram/torch/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram/file/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram/small_chunks/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram_changed/native/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram_changed/torch/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram_changed/file/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram_changed/small_chunks/f32": "8f13a60b3572e180f1127a78f43e6fac7e66f033ec9ed4f552be559ba7a765d8",
    "ram_eps/native/f32": "93cc08fcc235d8df7ae4915f2eb7bad2e603ecd3b869ae62235678077d83569f",
    "ram_eps/torch/f32": "93cc08fcc235d8df7ae4915f2eb7bad2e603ecd3b869ae62235678077d83569f",
    "ram_eps/file/f32": "93cc08fcc235d8df7ae4915f2eb7bad2e603ecd3b869ae62235678077d83569f",
    "ram_eps/small_chunks/f32": "93cc08fcc235d8df7ae4915f2eb7bad2e603ecd3b869ae62235678077d83569f",
    "ram_lambdas/native/f32": "de0125a0e881eadfe92ca49277dae14b2a550306d9f47f96d3e6183da7fb6fb4",
    "ram_lambdas/torch/f32": "de0125a0e881eadfe92ca49277dae14b2a550306d9f47f96d3e6183da7fb6fb4",
    "ram_lambdas/file/f32": "de0125a0e881eadfe92ca49277dae14b2a550306d9f47f96d3e6183da7fb6fb4",
    "ram_lambdas/small_chunks/f32": "de0125a0e881eadfe92ca49277dae14b2a550306d9f47f96d3e6183da7fb6fb4",
    "ram_exclude/native/f32": "a8bb92168a79b767d4bd2eb102aaa90c67cf1043fbf8a5268814b20066c331ee",
    "ram_exclude/torch/f32": "a8bb92168a79b767d4bd2eb102aaa90c67cf1043fbf8a5268814b20066c331ee",
    "ram_exclude/file/f32": "a8bb92168a79b767d4bd2eb102aaa90c67cf1043fbf8a5268814b20066c331ee",
    "ram_exclude/small_chunks/f32": "a8bb92168a79b767d4bd2eb102aaa90c67cf1043fbf8a5268814b20066c331ee",
    "ram_plus/native/f32": "9c726feff07ebfe802958f3bc789a577c696886c7a5dd14579af40969fcdec66",
    "ram_plus/torch/f32": "9c726feff07ebfe802958f3bc789a577c696886c7a5dd14579af40969fcdec66",
    "ram_plus/file/f32": "9c726feff07ebfe802958f3bc789a577c696886c7a5dd14579af40969fcdec66",
    "ram_plus/small_chunks/f32": "9c726feff07ebfe802958f3bc789a577c696886c7a5dd14579af40969fcdec66",
    "ram_plus_inf/native/f32": "776abb33191f4b236e2749eb59a3420b5509ced54171daef85f096602934c0e2",
    "ram_plus_inf/torch/f32": "776abb33191f4b236e2749eb59a3420b5509ced54171daef85f096602934c0e2",
    "ram_plus_inf/file/f32": "776abb33191f4b236e2749eb59a3420b5509ced54171daef85f096602934c0e2",
    "ram_plus_inf/small_chunks/f32": "776abb33191f4b236e2749eb59a3420b5509ced54171daef85f096602934c0e2",
    "ram_plus_tensor/native/f32": "7d5b4002d40b3bff54d576161ba2c105e61492c6824f1cd5bfb75b555f4e5c78",
    "ram_plus_tensor/torch/f32": "7d5b4002d40b3bff54d576161ba2c105e61492c6824f1cd5bfb75b555f4e5c78",
    "ram_plus_tensor/file/f32": "7d5b4002d40b3bff54d576161ba2c105e61492c6824f1cd5bfb75b555f4e5c78",
    "ram_plus_tensor/small_chunks/f32": "7d5b4002d40b3bff54d576161ba2c105e61492c6824f1cd5bfb75b555f4e5c78",
    "ram_plus_soft/native/f32": "5d02b5c1ce95912adf912c8caf65d4852007f141db5c535e1aebc4083c939508",
    "ram_plus_soft/torch/f32": "5d02b5c1ce95912adf912c8caf65d4852007f141db5c535e1aebc4083c939508",
    "ram_plus_soft/file/f32": "5d02b5c1ce95912adf912c8caf65d4852007f141db5c535e1aebc4083c939508",
    "ram_plus_soft/small_chunks/f32": "5d02b5c1ce95912adf912c8caf65d4852007f141db5c535e1aebc4083c939508",
    "ram_importance/native/f32": "158d9d9bddc56d349461de152a0932f88d822913f25066dea18e6a15a30eea80",
    "ram_importance/torch/f32": "158d9d9bddc56d349461de152a0932f88d822913f25066dea18e6a15a30eea80",
    "ram_importance/file/f32": "158d9d9bddc56d349461de152a0932f88d822913f25066dea18e6a15a30eea80",
    "ram_importance/small_chunks/f32": "158d9d9bddc56d349461de152a0932f88d822913f25066dea18e6a15a30eea80",
    "ram_plus_importance/native/f32": "e29d27aae63454c97d654d3f574bb1d630130f3d2965fae5bad6935cf99fba24",
    "ram_plus_importance/torch/f32": "e29d27aae63454c97d654d3f574bb1d630130f3d2965fae5bad6935cf99fba24",
    "ram_plus_importance/file/f32": "e29d27aae63454c97d654d3f574bb1d630130f3d2965fae5bad6935cf99fba24",
    "ram_plus_importance/small_chunks/f32": "e29d27aae63454c97d654d3f574bb1d630130f3d2965fae5bad6935cf99fba24",
    "linear/native/f32": "6da7bf91a7653404a14b437c0e47753a8a04ee7fc73baba3b96e2f929a0b28e1",
    "linear/torch/f32": "6da7bf91a7653404a14b437c0e47753a8a04ee7fc73baba3b96e2f929a0b28e1",
    "linear/file/f32": "6da7bf91a7653404a14b437c0e47753a8a04ee7fc73baba3b96e2f929a0b28e1",
    "linear/small_chunks/f32": "6da7bf91a7653404a14b437c0e47753a8a04ee7fc73baba3b96e2f929a0b28e1",
    "task_arithmetic/native/f32": "6b9fcadf09146ba7df1a2882214cf85b99279c74d5d59042048943f3de9d29a2",
    "task_arithmetic/torch/f32": "6b9fcadf09146ba7df1a2882214cf85b99279c74d5d59042048943f3de9d29a2",
    "task_arithmetic/file/f32": "6b9fcadf09146ba7df1a2882214cf85b99279c74d5d59042048943f3de9d29a2",
    "task_arithmetic/small_chunks/f32": "6b9fcadf09146ba7df1a2882214cf85b99279c74d5d59042048943f3de9d29a2",
    "ties/native/f32": "439acc23e0f029ecc5d7561bbb46d4edbe0665a8695330a78f55b047730adc0e",
    "ties/torch/f32": "439acc23e0f029ecc5d7561bbb46d4edbe0665a8695330a78f55b047730adc0e",
    "ties/file/f32": "439acc23e0f029ecc5d7561bbb46d4edbe0665a8695330a78f55b047730adc0e",
    "ties/small_chunks/f32": "439acc23e0f029ecc5d7561bbb46d4edbe0665a8695330a78f55b047730adc0e",
    "dare_linear/native/f32": "0b61e5211f6b50e2b41c92c813982d0b98fc9ed9d4439ebcf1dfbfd45e47258d",
    "dare_linear/torch/f32": "0b61e5211f6b50e2b41c92c813982d0b98fc9ed9d4439ebcf1dfbfd45e47258d",
    "dare_linear/file/f32": "0b61e5211f6b50e2b41c92c813982d0b98fc9ed9d4439ebcf1dfbfd45e47258d",
    "dare_linear/small_chunks/f32": "0b61e5211f6b50e2b41c92c813982d0b98fc9ed9d4439ebcf1dfbfd45e47258d",
    "dare_ties/native/f32": "571331c5a4859db64c6c523810ca688b49a49adde0c2e0dcb7eaad196e141dbd",
    "dare_ties/torch/f32": "571331c5a4859db64c6c523810ca688b49a49adde0c2e0dcb7eaad196e141dbd",
    "dare_ties/file/f32": "571331c5a4859db64c6c523810ca688b49a49adde0c2e0dcb7eaad196e141dbd",
    "dare_ties/small_chunks/f32": "571331c5a4859db64c6c523810ca688b49a49adde0c2e0dcb7eaad196e141dbd",
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
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dname]
    assert _probe(dtype, path) == DIGESTS[f"probe/{path}/{dname}"]


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, digest in compute(Path(tmp)).items():
            print(f'    "{name}": "{digest}",')
