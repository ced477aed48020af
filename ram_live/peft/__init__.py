"""LoRA / PEFT adapters merged with RAM (or any method of the registry) in ΔW space.

A LoRA adapter's task vector for a target module is ΔW = s · B A (s = lora_alpha / r, or lora_alpha / √r with
rsLoRA, per module through ``rank_pattern`` / ``alpha_pattern``). Merging the A and B factors separately is
wrong (the product of averages is not the average of products), so this package:

1. reads each adapter's factors (from a live ``PeftModel`` or from an adapter folder on disk) and computes
   ΔW_t one module at a time, in float32, with the exact scaling of that adapter and module; a module an
   adapter does not target counts as ΔW = 0 for it;
2. optionally sparsifies each ΔW_t (LoRA deltas are dense: with the paper's |Δ| > eps rule every entry is
   "shared" and RAM is a plain mean; see :class:`TopK` and :class:`RelativeThreshold`);
3. merges the ΔW_t with the engine (two passes for RAM+ with global ρ, module by module, chunk by chunk);
4. folds the merged ΔW* into the base weights (``into_base=True``), or re-factors it into a new adapter of a
   chosen rank by truncated SVD (exact, or randomized with oversampling and power iterations), reporting the
   relative Frobenius error of every module.

>>> ram_merge_adapters(peft_model, ["code", "tool", "memory"], "generalist")        # doctest: +SKIP
>>> plain = ram_merge_adapters(peft_model, ["code", "tool"], into_base=True)         # doctest: +SKIP
>>> ram_merge_adapter_files({"code": "runs/code", "tool": "runs/tool"}, out="merged")  # doctest: +SKIP

``import ram_live`` never imports ``peft`` or ``transformers``: they are imported inside the
functions that need them.
"""

from __future__ import annotations

from .deltas import lora_deltas
from .errors import DenseDeltaWarning, MissingDependencyError, UnsupportedAdapterError
from .merge_files import ram_merge_adapter_files
from .merge_live import ram_merge_adapters
from .refactoring import Refactored, refactor
from .report import AdapterMergeReport, ModuleReport
from .sparsify import RAM_FAMILY as RAM_FAMILY
from .sparsify import RECOMMENDED_SPARSIFY, RelativeThreshold, TopK
from .sparsify import SparsifyRule as SparsifyRule
from .svd_options import SvdOptions

__all__ = [
    "ram_merge_adapters",
    "ram_merge_adapter_files",
    "lora_deltas",
    "refactor",
    "Refactored",
    "SvdOptions",
    "TopK",
    "RelativeThreshold",
    "RECOMMENDED_SPARSIFY",
    "AdapterMergeReport",
    "ModuleReport",
    "UnsupportedAdapterError",
    "MissingDependencyError",
    "DenseDeltaWarning",
]
