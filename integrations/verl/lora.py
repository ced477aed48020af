"""The ΔW = s · B A of a LoRA actor checkpoint: its factors gathered from every rank's shards, then read with
:func:`ram_live.peft.lora_deltas` from a PEFT adapter folder written for the purpose (a temporary one); and, at
merge time, LoRA snapshots as the agents "base + sparsified ΔW" that :mod:`ram_live.peft` merges into a base
(:func:`sparsified_agents`, the ``ram.sparsify`` rule)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping

import torch
from torch import Tensor

from .checkpoint import LORA_RE, ActorCheckpoint, hf_key
from .common import VerlIntegrationError
from .config import RAMVerlOptions

__all__ = ["checkpoint_lora_deltas", "is_lora_snapshot", "lora_targets", "sparsified_agents"]


def _gather_factors(ckpt: ActorCheckpoint) -> dict[str, Tensor]:
    """Every rank's shards of the lora_A/lora_B tensors, assembled whole in float32, by PEFT name."""
    factors: dict[str, Tensor] = {}
    for rank in range(ckpt.world_size):
        shards = ckpt.shards(rank)
        for key, t in shards.boxes.items():
            m = LORA_RE.match(key)
            if m is None or not t.owner:
                continue
            module = hf_key(m.group("module"))
            name = f"base_model.model.{module}.{m.group('kind')}" + (".weight" if m.group("weight") else "")
            full = factors.get(name)
            if full is None:
                full = factors[name] = torch.zeros(t.global_shape, dtype=torch.float32)
            full[tuple(slice(o, o + n) for o, n in zip(t.offsets, t.tensor.shape))] = t.tensor.float()
        del shards
    return factors


def checkpoint_lora_deltas(ckpt: ActorCheckpoint, opts: RAMVerlOptions) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``({module: ΔW}, {"lora_rank": r, "lora_alpha": α})`` of a LoRA checkpoint. Rank and α: the options'
    when set, else ``lora_train_meta.json``'s (:class:`VerlIntegrationError` when neither gives them)."""
    from safetensors.torch import save_file

    from ram_live.peft import lora_deltas

    factors = _gather_factors(ckpt)
    meta = dict(ckpt.lora_meta or {})
    r = int(meta.get("r") or opts.lora_rank or 0)
    alpha = meta.get("lora_alpha", opts.lora_alpha)
    if opts.lora_rank is not None:
        r = opts.lora_rank
    if opts.lora_alpha is not None:
        alpha = opts.lora_alpha
    if not r or alpha is None:
        raise VerlIntegrationError(
            f"{ckpt.path}: a LoRA checkpoint without lora_train_meta.json; set ram.lora_rank and ram.lora_alpha "
            "(or actor_rollout_ref.model.lora_rank/lora_alpha)"
        )
    targets = sorted({n[len("base_model.model.") :].rsplit(".lora_", 1)[0].split(".")[-1] for n in factors})
    with tempfile.TemporaryDirectory(prefix="ram_live_verl_lora_") as tmp:
        save_file({k: v.contiguous() for k, v in factors.items()}, os.path.join(tmp, "adapter_model.safetensors"))
        with open(os.path.join(tmp, "adapter_config.json"), "w") as fh:
            json.dump(
                {
                    "peft_type": "LORA",
                    "r": r,
                    "lora_alpha": alpha,
                    "target_modules": targets,
                    "use_rslora": False,
                    "fan_in_fan_out": False,
                    "bias": "none",
                },
                fh,
            )
        deltas = lora_deltas(tmp, "verl")
    return deltas, {"lora_rank": r, "lora_alpha": alpha}


def is_lora_snapshot(snap: Any) -> bool:
    """Whether a store snapshot was taken from a LoRA checkpoint (its manifest's ``extra.verl.lora``)."""
    return bool(((snap.manifest.get("extra") or {}).get("verl") or {}).get("lora"))


def lora_targets(snap: Any) -> list[str]:
    """The weights a LoRA snapshot changed (its target modules'): the tensors with a piece of changed entries;
    every other tensor of such a snapshot is the base's."""
    return [k for k, t in snap.manifest["tensors"].items() if any(p.get("count") for p in t["pieces"])]


class _SnapshotDelta:
    """One target weight's ΔW as its snapshot holds it: τ = snapshot − base in float32 (what ram_live.peft's
    ``Factor.delta`` gives for an adapter)."""

    def __init__(self, snap: Any, base: Any, key: str) -> None:
        self.snap, self.base, self.key = snap, base, key

    def delta(self, device: torch.device | None = None) -> Tensor:
        agent = self.snap.get(self.key)
        dev = device or agent.device
        return agent.to(device=dev, dtype=torch.float32) - self.base.get(self.key).to(dev, torch.float32)


def sparsified_agents(snaps: Mapping[str, Any], rule: Any, activity: Any) -> tuple[dict[str, Any], Any]:
    """``({agent: source}, base)``: each LoRA snapshot as :mod:`ram_live.peft`'s agent "base + ΔW_t" with its
    ΔW_t = τ_t sparsified by ``rule`` (a :class:`~ram_live.peft.TopK` / :class:`~ram_live.peft.RelativeThreshold`)
    per target weight, read lazily in float64; the other tensors are the base's. Merged with ``eps=0`` this is
    :func:`ram_live.peft.ram_merge_adapter_files` ``(..., into_base=True, sparsify=rule)`` on adapters of those ΔW.

    Args:
        snaps: the store's snapshots by agent, all LoRA snapshots of one base.
        rule: the sparsifying rule.
        activity: the :class:`~ram_live.methods.Activity` the per-adapter density counts use.
    """
    from ram_live.peft.deltas import AdapterDeltas, BasePlusDeltaSource

    base = next(iter(snaps.values())).base_source()
    agents = {}
    for name, snap in snaps.items():
        factors = {k.removesuffix(".weight"): _SnapshotDelta(snap, base, k) for k in lora_targets(snap)}
        agents[name] = BasePlusDeltaSource(base, AdapterDeltas(name, factors, rule, activity))  # type: ignore[arg-type]
    return agents, base
