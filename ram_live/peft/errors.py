"""The errors and the warning of adapter merging."""

from __future__ import annotations

from ..errors import RamLiveError


class UnsupportedAdapterError(RamLiveError, TypeError):
    """An adapter ``ram_live.peft`` cannot merge exactly (DoRA and other LoRA variants, ``lora_bias``, conv or other
    layer types, ``modules_to_save``, PiSSA/OLoRA/CorDA/LoftQ initialisation, non-LoRA PEFT types)."""

    def __init__(self, message: str, *, adapter: str | None = None, module: str | None = None) -> None:
        super().__init__(message)
        self.adapter = adapter
        self.module = module


class MissingDependencyError(RamLiveError, ImportError):
    """An optional dependency is not installed."""


class DenseDeltaWarning(UserWarning):
    """RAM on dense ΔW with the paper's |Δ| > eps rule: nearly every entry is shared, RAM is a plain mean."""
