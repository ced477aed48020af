"""Keep a run's trained base and specialists in its ``--out`` folder, and take them back (``--reuse-trained``).

Training is deterministic for a seed and settings (the demo's tables repeat bit for bit), so a later run with
the same seed and settings may skip it and merge, score and search the very same agents: that is how the issue-24
studies re-measured every merge and search row after a library change without retraining. What is kept:
``base.safetensors``, the snapshot store (``store/``), and ``trained.pt`` (per-agent training logs and the final
importances the curvature rows use) with ``trained.json``, the settings they were trained with. A folder whose
settings differ is not reused (the run trains again and overwrites it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ram_live.store import SnapshotStore

from .lang import build_model, vocab_for

__all__ = ["key", "load", "save"]


def key(args: Any, s: Any, tasks: tuple[str, ...], sft_target: float) -> dict[str, Any]:
    """What training depends on: the seed, the tasks, the SFT target and every setting (recipes included)."""
    settings = {k: (vars(v) if dataclasses.is_dataclass(v) else v) for k, v in dataclasses.asdict(s).items()}
    return json.loads(json.dumps({"seed": args.seed, "tasks": list(tasks), "sft_target": sft_target,
                                  "settings": settings}, default=str))


def save(out: Path, args: Any, s: Any, tasks: tuple[str, ...], sft_target: float, base: nn.Module,
         rl: dict[str, Any], kept: dict[str, Any], sft_info: dict[str, Any]) -> None:
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(out / "base.safetensors"))
    torch.save({"rl": rl, "kept": kept, "sft": sft_info}, out / "trained.pt")
    (out / "trained.json").write_text(json.dumps(key(args, s, tasks, sft_target), indent=1))


def load(out: Path, args: Any, s: Any, tasks: tuple[str, ...], sft_target: float
         ) -> tuple[nn.Module, SnapshotStore, dict[str, Any], dict[str, Any], dict[str, Any]] | None:
    """``(base, store, rl, kept, sft_info)`` as the run that trained them left them, or None when ``out`` holds no
    training of this seed and these settings."""
    names = ("trained.json", "trained.pt", "base.safetensors", "store")
    if not all((out / n).exists() for n in names):
        return None
    if json.loads((out / "trained.json").read_text()) != key(args, s, tasks, sft_target):
        print(f"{out}: trained with other settings; training again")
        return None
    base = build_model(args.seed, vocab_for(tasks), s.hidden, s.intermediate).to(torch.bfloat16).eval()
    base.load_state_dict(load_file(str(out / "base.safetensors")))
    extra = torch.load(out / "trained.pt", weights_only=True)
    return base, SnapshotStore(out / "store", durable=False), extra["rl"], extra["kept"], extra["sft"]
