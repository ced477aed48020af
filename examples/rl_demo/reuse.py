"""Keep a run's trained base and specialists in its ``--out`` folder, and take them back (``--reuse-trained``).

Training is deterministic for a seed and settings (the demo's tables repeat bit for bit), so a later run with
the same seed and settings may skip it and merge, score and search the very same agents: that is how the issue-24
studies re-measured every merge and search row after a library change without retraining. What is kept:
``base.safetensors``, the snapshot store (``store/``), and ``trained.pt`` (per-agent training logs and the final
importances the curvature rows use) with ``trained.json``, the settings they were trained with, written last
(:func:`forget` removes it before a training starts, so a folder whose training was cut off is never taken). A
folder whose settings differ is not reused (the run trains again and overwrites it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ram_live.store import SnapshotStore

from .lang import build_model, vocab_for

__all__ = ["forget", "key", "load", "save"]


def key(args: Any, s: Any, tasks: tuple[str, ...], sft_target: float) -> dict[str, Any]:
    """What training depends on: the seed, the torch threads (float reductions), the tasks, the SFT target and
    every setting (recipes included)."""
    return json.loads(
        json.dumps(
            {
                "seed": args.seed,
                "threads": args.threads,
                "tasks": list(tasks),
                "sft_target": sft_target,
                "settings": dataclasses.asdict(s),
            },
            default=str,
        )
    )


def forget(out: Path) -> None:
    """Before a training writes into ``out``: what is there stops counting as a finished training."""
    (out / "trained.json").unlink(missing_ok=True)


def save(
    out: Path,
    args: Any,
    s: Any,
    tasks: tuple[str, ...],
    sft_target: float,
    base: nn.Module,
    rl: dict[str, Any],
    kept: dict[str, Any],
    sft_info: dict[str, Any],
) -> None:
    save_file({k: v.contiguous() for k, v in base.state_dict().items()}, str(out / "base.safetensors"))
    torch.save({"rl": rl, "kept": kept, "sft": sft_info}, out / "trained.pt")
    tmp = out / "trained.json.tmp"
    tmp.write_text(json.dumps(key(args, s, tasks, sft_target), indent=1))
    os.replace(tmp, out / "trained.json")  # last, and whole: it marks the training as finished


def load(
    out: Path, args: Any, s: Any, tasks: tuple[str, ...], sft_target: float
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
