"""ram_live: merge RL-trained agents with RAM (Reinforced Agent Merging), in process, tensor by tensor.

>>> from ram_live import ram_merge, merge, probe
>>> generalist = ram_merge([coder, tool_agent, memory_agent], base=base_model)   # doctest: +SKIP

The public names are imported on first use (PEP 562), so ``import ram_live`` and ``ram-live --help`` do not
import torch; ``from ram_live import merge`` works as before.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (
    ConfigError,
    InputMismatchError,
    InvalidStateError,
    MethodExistsError,
    MissingBaseError,
    NoAgentsError,
    NonFiniteError,
    OutOfSpaceError,
    OutputExistsError,
    RamLiveError,
    SearchError,
    UnknownMethodError,
    UnsupportedInputError,
)

_EXPORTS: dict[str, str] = {  # public name -> the submodule it comes from, imported on first use
    "merge": ".api",
    "merge_task_vectors": ".api",
    "ram_merge": ".api",
    "MergeInfo": ".types",
    "Activity": ".types",
    "DareLinearConfig": ".methods",
    "DareTiesConfig": ".methods",
    "LinearConfig": ".methods",
    "RamConfig": ".methods.ram.config",
    **{n: ".methods.ram.rules" for n in ("Unit", "RhoClip", "RhoSoft", "Given")},
    "TaskArithmeticConfig": ".methods",
    "TiesConfig": ".methods",
    "available_methods": ".methods",
    "get_method": ".methods",
    "register_method": ".methods",
    "MergekitPlan": ".mergekit_yaml",
    "from_mergekit_yaml": ".mergekit_yaml",
    "RECOMMENDED_SPARSIFY": ".peft",
    "AdapterMergeReport": ".peft",
    "DenseDeltaWarning": ".peft",
    "RelativeThreshold": ".peft",
    "TopK": ".peft",
    "UnsupportedAdapterError": ".peft",
    "lora_deltas": ".peft",
    "ram_merge_adapter_files": ".peft",
    "ram_merge_adapters": ".peft",
    "refactor": ".peft",
    "adam_importance": ".importance",
    "empirical_fisher": ".importance",
    "ProbeReport": ".probing",
    "probe": ".probing",
    "MergeResult": ".training.schedule",
    "RAMSchedule": ".training.schedule",
    "ExtrapolationWarning": ".selection",
    "ArbitraryChoiceWarning": ".selection",
    "SearchResult": ".selection",
    "search": ".selection",
    "BaseMismatchError": ".store",
    "CorruptSnapshotError": ".store",
    "Snapshot": ".store",
    "SnapshotNotFoundError": ".store",
    "SnapshotStore": ".store",
    "SnapshotWriter": ".store",
    "StoreError": ".store",
}

__version__ = "0.1.0"

__all__ = [
    "merge",
    "ram_merge",
    "merge_task_vectors",
    "probe",
    "ram_merge_adapters",
    "ram_merge_adapter_files",
    "adam_importance",
    "empirical_fisher",
    "from_mergekit_yaml",
    "MergekitPlan",
    "lora_deltas",
    "refactor",
    "TopK",
    "RelativeThreshold",
    "RECOMMENDED_SPARSIFY",
    "AdapterMergeReport",
    "UnsupportedAdapterError",
    "DenseDeltaWarning",
    "search",
    "SearchResult",
    "SearchError",
    "ExtrapolationWarning",
    "ArbitraryChoiceWarning",
    "SnapshotStore",
    "Snapshot",
    "SnapshotWriter",
    "RAMSchedule",
    "MergeResult",
    "StoreError",
    "BaseMismatchError",
    "SnapshotNotFoundError",
    "CorruptSnapshotError",
    "ProbeReport",
    "MergeInfo",
    "register_method",
    "get_method",
    "available_methods",
    "Activity",
    "LinearConfig",
    "TaskArithmeticConfig",
    "TiesConfig",
    "DareLinearConfig",
    "DareTiesConfig",
    "RamConfig",
    "Unit",
    "RhoClip",
    "RhoSoft",
    "Given",
    "RamLiveError",
    "InputMismatchError",
    "NonFiniteError",
    "NoAgentsError",
    "ConfigError",
    "UnknownMethodError",
    "MethodExistsError",
    "MissingBaseError",
    "UnsupportedInputError",
    "OutOfSpaceError",
    "OutputExistsError",
    "InvalidStateError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
