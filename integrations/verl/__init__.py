"""RAM for verl: task-vector snapshots from verl's own checkpoints, and merged generalists, by configuration alone.

verl ≥ 0.9 (v1 trainer)::

    python -m verl.trainer.main_ppo ... trainer.save_freq=20 \\
        trainer.checkpoint_callback_class=ram_live.integrations.verl.RAMCheckpointCallback \\
        +ram.store=/shared/ram_store +ram.agent=coder +ram.merge_every=2

Every checkpoint save becomes a snapshot of the actor in the shared store (read from the FSDP shard files one
rank at a time, never gathered); every ``merge_every`` saves the latest snapshot of every agent is merged with
RAM into a Hugging Face folder, and ``ram/*`` metrics go to verl's logger. Trainers without
``checkpoint_callback_class``: :class:`RAMTrainerMixin`. Checkpoints of any verl version, offline:
``ram-live verl-snapshot`` (:func:`main`).

Importing this package imports neither verl nor torch: every name is imported on first use (PEP 562), so
``ram-live verl-snapshot --help`` answers at once; ``RAMCheckpointCallback`` subclasses verl's class on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # public name -> the submodule it comes from
    "ActorCheckpoint": ".checkpoint",
    "find_checkpoints": ".checkpoint",
    "RAMTrainerMixin": ".callback",
    "RAMVerlHooks": ".callback",
    "callback_class": ".callback",
    "main": ".cli",
    "RAMVerlOptions": ".config",
    "options_from_mapping": ".config",
    "options_from_verl": ".config",
    "RAMVerl": ".core",
    "VerlIntegrationError": ".common",
}

__all__ = [
    "ActorCheckpoint",
    "RAMCheckpointCallback",
    "RAMTrainerMixin",
    "RAMVerl",
    "RAMVerlHooks",
    "RAMVerlOptions",
    "VerlIntegrationError",
    "find_checkpoints",
    "main",
    "options_from_mapping",
    "options_from_verl",
]


def __getattr__(name: str) -> Any:
    if name == "RAMCheckpointCallback":
        value = importlib.import_module(".callback", __name__).callback_class()
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
