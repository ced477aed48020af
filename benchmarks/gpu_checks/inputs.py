"""Live bf16 modules built on the device: a base of Qwen2.5-1.5B's shapes and names (338 tensors, tied embeddings;
:class:`QwenShaped`), or one 4096 x 4096 tensor (:func:`build_tensor`), and K agents that are the base plus sparse
deltas of different densities, all drawn from seeded generators on that device (nothing moves over PCIe while the
inputs are built)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "DENSITIES",
    "TENSOR_SHAPE",
    "Sizes",
    "QwenShaped",
    "build",
    "build_tensor",
    "importances",
    "nbytes",
    "sizes_for",
    "subset",
]

#: Agent t's share of changed entries: the RAM paper's three agents (as in ``bench_merge.DENSITIES``).
DENSITIES = (0.03, 0.46, 0.54)
SEED = 1234
#: The single-tensor rows' tensor: a 4096 x 4096 bf16 matrix (the kernels' own speed, one launch).
TENSOR_SHAPE = (4096, 4096)


@dataclass(frozen=True)
class Sizes:
    """A Qwen2.5-shaped model: ``layers`` decoder layers of ``hidden`` (attention with ``heads`` query and ``kv``
    key/value heads of 128 or ``hidden // heads`` entries, biases on q, k, v), an MLP of ``inter``, two norms per
    layer, embeddings of ``vocab`` tied to the head, and a final norm."""

    hidden: int
    inter: int
    layers: int
    heads: int
    kv: int
    vocab: int

    @property
    def kv_width(self) -> int:
        return self.kv * (self.hidden // self.heads)

    @property
    def per_layer(self) -> int:
        h, kv = self.hidden, self.kv_width
        return 2 * h * h + h + 2 * (kv * h + kv) + 3 * h * self.inter + 2 * h

    @property
    def params(self) -> int:
        return self.vocab * self.hidden + self.layers * self.per_layer + self.hidden


#: Qwen2.5-1.5B's shapes (its config.json): 338 tensors, 141 of them under 64 K entries.
QWEN_1_5B = Sizes(hidden=1536, inter=8960, layers=28, heads=12, kv=2, vocab=151936)


def sizes_for(params: int | None, small: bool) -> Sizes:
    """Qwen2.5-1.5B's shapes, with as many layers as make ``params`` where given; ``small``: a tiny model of the
    same structure (hidden 128, two layers, or as many as make ``params``)."""
    if small:
        tiny = Sizes(hidden=128, inter=320, layers=2, heads=4, kv=2, vocab=256)
        layers = 2 if not params else max(1, round((params - tiny.params + 2 * tiny.per_layer) / tiny.per_layer))
        return Sizes(128, 320, layers, 4, 2, 256)
    if not params:
        return QWEN_1_5B
    layers = max(1, round((params - QWEN_1_5B.vocab * QWEN_1_5B.hidden) / QWEN_1_5B.per_layer))
    return Sizes(QWEN_1_5B.hidden, QWEN_1_5B.inter, layers, QWEN_1_5B.heads, QWEN_1_5B.kv, QWEN_1_5B.vocab)


def _linear(rows: int, cols: int, bias: bool) -> nn.Module:
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.empty(rows, cols))
    if bias:
        layer.bias = nn.Parameter(torch.empty(rows))
    return layer


class QwenShaped(nn.Module):
    """The parameters of a Qwen2.5 causal LM under its names (``model.layers.0.self_attn.q_proj.weight``, ...),
    without its code: what a merge of one reads and writes, tensor by tensor."""

    def __init__(self, sizes: Sizes) -> None:
        super().__init__()
        h, kv, inter = sizes.hidden, sizes.kv_width, sizes.inter
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.empty(sizes.vocab, h))
        self.model.layers = nn.ModuleList()
        for _ in range(sizes.layers):
            layer = nn.Module()
            layer.self_attn = nn.Module()
            for name, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
                setattr(layer.self_attn, name, _linear(rows, h, True))
            layer.self_attn.o_proj = _linear(h, h, False)
            layer.mlp = nn.Module()
            layer.mlp.gate_proj, layer.mlp.up_proj = _linear(inter, h, False), _linear(inter, h, False)
            layer.mlp.down_proj = _linear(h, inter, False)
            for name in ("input_layernorm", "post_attention_layernorm"):
                norm = nn.Module()
                norm.weight = nn.Parameter(torch.empty(h))
                setattr(layer, name, norm)
            self.model.layers.append(layer)
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.empty(h))
        self.lm_head = nn.Module()
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as in Qwen2.5-1.5B


#: The tensors the device results are compared with the CPU's on: a large matrix, a bias, a norm.
SUBSET = ("model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.k_proj.bias", "model.norm.weight")


def _empty(sizes: Sizes, device: torch.device) -> QwenShaped:
    with torch.device("meta"):
        module = QwenShaped(sizes)
    module = module.to_empty(device=device).to(torch.bfloat16).requires_grad_(False)
    module.lm_head.weight = module.model.embed_tokens.weight  # (to_empty may untie)
    return module


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@torch.no_grad()
def build(sizes: Sizes, device: torch.device, k: int = 3, seed: int = SEED) -> tuple[QwenShaped, list[QwenShaped]]:
    """The base and ``k`` agents on ``device``. A changed entry moves by at least max(|w|/64, 1e-4) (as in
    ``bench_merge.build_inputs``): it survives bf16 rounding and its delta exceeds RAM's eps, so every changed
    entry is active and every other entry has delta exactly 0. Masks are independent across agents."""
    if k > len(DENSITIES):
        raise ValueError(f"at most {len(DENSITIES)} agents")
    base = _empty(sizes, device)
    agents = [_empty(sizes, device) for _ in range(k)]
    _fill(base, agents, device, seed)
    return base, agents


def _fill(base: nn.Module, agents: list[nn.Module], device: torch.device, seed: int) -> None:
    """Draw the base's parameters and each agent's sparse moves (see :func:`build`)."""
    for index, (name, p) in enumerate(base.named_parameters()):
        g = _generator(device, seed * 1_000_003 + index)
        w = torch.randn(p.shape, generator=g, device=device)
        w.mul_(0.05).add_(1.0) if name.endswith("norm.weight") else w.mul_(0.02)
        p.copy_(w)
        w = p.float()
        step = w.abs().div_(32.0).clamp_(min=2e-4)
        for t, agent in enumerate(agents):
            u = torch.rand(p.shape, generator=g, device=device)
            z = torch.randn(p.shape, generator=g, device=device)
            z = torch.where(z >= 0, z + 0.5, z - 0.5)
            moved = torch.addcmul(w, z, step).to(torch.bfloat16)
            agent.get_parameter(name).copy_(torch.where(u < DENSITIES[t], moved, p))
            del u, z, moved
        del w, step


@torch.no_grad()
def importances(base: nn.Module, k: int, seed: int = SEED + 1) -> dict[str, dict[str, torch.Tensor]]:
    """Per agent (``agent_0`` ...), bf16 importances > 0 spread over four decades, on the base's device."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for t in range(k):
        per: dict[str, torch.Tensor] = {}
        for index, (name, p) in enumerate(base.named_parameters()):
            g = _generator(p.device, seed * 1_000_003 + 97 * t + index)
            per[name] = (
                torch.rand(p.shape, generator=g, device=p.device)
                .mul_(4 * math.log(10))
                .exp_()
                .mul_(1e-6)
                .to(torch.bfloat16)
            )
        out[f"agent_{t}"] = per
    return out


def subset(
    module: nn.Module | dict[str, torch.Tensor], keys: list[str], device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """The named tensors of a module or state dict, copied to ``device`` (a state dict)."""
    sd = module.state_dict() if isinstance(module, nn.Module) else module
    return {k: sd[k].detach().to(device, copy=True) for k in keys}


def nbytes(obj: nn.Module | dict[str, torch.Tensor]) -> int:
    """Bytes of a module's parameters or a state dict's tensors."""
    tensors = obj.parameters() if isinstance(obj, nn.Module) else obj.values()
    return sum(t.numel() * t.element_size() for t in tensors)


@torch.no_grad()
def build_tensor(device: torch.device, k: int = 3, shape: tuple[int, ...] = TENSOR_SHAPE, seed: int = SEED):
    """One tensor as state dicts ``({"w": base}, [{"w": agent} ...])``, drawn as :func:`build` draws a layer."""

    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.empty(shape))

    def empty() -> nn.Module:
        with torch.device("meta"):
            module = One()
        return module.to_empty(device=device).to(torch.bfloat16).requires_grad_(False)

    base, agents = empty(), [empty() for _ in range(k)]
    _fill(base, agents, device, seed)
    return {"w": base.w.detach()}, [{"w": a.w.detach()} for a in agents]
