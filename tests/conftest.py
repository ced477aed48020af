from __future__ import annotations

import os

import pytest
import torch

# Without a GPU, Triton's interpreter runs the device kernels on CPU tensors in the tests. It must be on before
# Triton is first imported in this process (lightning, torch.compile and others import it): a Triton imported
# without it leaves its own jitted library functions uncallable from interpreted kernels. With a GPU it stays off,
# so that `pytest -m cuda` runs the compiled kernels (and the interpreter's tests skip: `interpreter` below).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: Marks a test module that runs the Triton kernels under the interpreter.
interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off here (a GPU: see the cuda tests)"
)


def make_agents(base: dict[str, torch.Tensor], densities, scale=0.01, seed=0, dtype=None):
    """Agents = base + sparse random deltas with the given densities (independent masks)."""
    g = torch.Generator().manual_seed(seed)
    agents = []
    for density in densities:
        agent = {}
        for key, value in base.items():
            mask = torch.rand(value.shape, generator=g) < density
            delta = torch.randn(value.shape, generator=g) * scale * mask
            agent[key] = (value.float() + delta).to(dtype or value.dtype)
        agents.append(agent)
    return agents


def module_of(sd: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose parameters are copies of ``sd``'s tensors, nested by the keys' dotted names."""
    m = torch.nn.Module()
    for k, v in sd.items():
        parent = m
        *path, leaf = k.split(".")
        for p in path:
            if not hasattr(parent, p):
                parent.add_module(p, torch.nn.Module())
            parent = getattr(parent, p)
        parent.register_parameter(leaf, torch.nn.Parameter(v.clone()))
    return m


def snapshot(obj):
    """A deep, bit-exact copy of a state dict or module's state dict, to compare against later."""
    sd = obj.state_dict() if isinstance(obj, torch.nn.Module) else obj
    return {k: v.detach().clone() for k, v in sd.items()}


def assert_bit_identical(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(
            a[k].view(torch.uint8) if a[k].dtype.is_floating_point else a[k],
            b[k].view(torch.uint8) if b[k].dtype.is_floating_point else b[k],
        ), k


@pytest.fixture
def base_sd():
    g = torch.Generator().manual_seed(1)
    return {
        "embed.weight": torch.randn(32, 16, generator=g),
        "layers.0.w": torch.randn(16, 16, generator=g),
        "layers.0.b": torch.randn(16, generator=g),
        "layers.1.w": torch.randn(24, 16, generator=g),
        "head.weight": torch.randn(8, 24, generator=g),
    }


@pytest.fixture(scope="module")
def tok():
    """The evaluate tests' tiny tokenizer (``tests/evaluate_helpers.py``; imported here only when asked for)."""
    import evaluate_helpers

    return evaluate_helpers.tokenizer()


@pytest.fixture(scope="module")
def llama():
    """The evaluate tests' tiny Llama, seed 0 (``tests/evaluate_helpers.py``)."""
    import evaluate_helpers

    return evaluate_helpers.model(0)


@pytest.fixture
def no_native(monkeypatch):
    """Run the torch paths: the native CPU kernels switched off for the test."""
    import ram_live.methods.ram.native as native

    monkeypatch.setattr(native, "_KERNELS", None)


@pytest.fixture
def files(tmp_path, base_sd):
    """base.safetensors and three agents (coder, tools, memory) in ``tmp_path``, for the CLI tests:
    ``(folder, base state dict, agent state dicts, agent paths)``."""
    from safetensors.torch import save_file

    agents = make_agents(base_sd, [0.05, 0.5, 0.6])
    save_file(base_sd, tmp_path / "base.safetensors")
    paths = []
    for name, a in zip(["coder", "tools", "memory"], agents):
        save_file(a, tmp_path / f"{name}.safetensors")
        paths.append(str(tmp_path / f"{name}.safetensors"))
    return tmp_path, base_sd, agents, paths


@pytest.fixture
def on_device(monkeypatch):
    """The device path for CPU tensors: what a CUDA merge runs (the kernels under Triton's interpreter where the
    test module set ``TRITON_INTERPRET=1``)."""
    from ram_live.engine import checks

    monkeypatch.setattr(checks, "deferred_device", lambda dev: dev.type != "meta")
