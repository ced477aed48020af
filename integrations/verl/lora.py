"""The ΔW = s · B A of a LoRA actor checkpoint: its factors gathered from every rank's shards, then read with
:func:`ram_live.peft.lora_deltas` from a PEFT adapter folder written for the purpose (a temporary one)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch
from torch import Tensor

from .checkpoint import LORA_RE, ActorCheckpoint, hf_key
from .common import VerlIntegrationError
from .config import RAMVerlOptions

__all__ = ["checkpoint_lora_deltas"]


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
            "(or actor_rollout_ref.model.lora_rank/lora_alpha)")
    targets = sorted({n[len("base_model.model."):].rsplit(".lora_", 1)[0].split(".")[-1] for n in factors})
    with tempfile.TemporaryDirectory(prefix="ram_live_verl_lora_") as tmp:
        save_file({k: v.contiguous() for k, v in factors.items()}, os.path.join(tmp, "adapter_model.safetensors"))
        with open(os.path.join(tmp, "adapter_config.json"), "w") as fh:
            json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets,
                       "use_rslora": False, "fan_in_fan_out": False, "bias": "none"}, fh)
        deltas = lora_deltas(tmp, "verl")
    return deltas, {"lora_rank": r, "lora_alpha": alpha}
