"""Adapter configs: which adapters can be merged exactly, and the config of the new adapter."""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from .errors import UnsupportedAdapterError
from .factors import AdapterSet
from .refactoring import Refactored

#: LoRA variants whose ΔW is not s·BA (fields of LoraConfig that switch a variant on)
_VARIANT_FIELDS = (
    "use_dora",
    "lora_bias",
    "alora_invocation_tokens",
    "arrow_config",
    "use_bdlora",
    "velora_config",
    "monteclora_config",
    "kasa_config",
    "use_qalora",
)
#: initialisations that rewrite the base weight (W_res = W − s·B₀A₀), so s·BA is not the delta to the base
_RESIDUAL_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")


def check_config(cfg: Mapping[str, Any], adapter: str) -> None:
    """Refuse, by its config, an adapter whose ΔW is not s · B A on an unchanged base."""
    peft_type = str(cfg.get("peft_type", "LORA")).split(".")[-1].upper()
    if peft_type != "LORA":
        raise UnsupportedAdapterError(
            f"adapter {adapter!r} is a {peft_type} adapter; only LoRA adapters can be merged", adapter=adapter
        )
    for name in _VARIANT_FIELDS:
        if cfg.get(name):
            what = {
                "use_dora": "DoRA (its ΔW depends on the base weight's norm, not s·BA)",
                "lora_bias": "lora_bias=True (a bias delta a re-factored adapter cannot carry)",
            }.get(name, f"the LoRA variant {name}")
            raise UnsupportedAdapterError(
                f"adapter {adapter!r} uses {what}; ram_live merges plain LoRA adapters only", adapter=adapter
            )
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_RESIDUAL_INITS):
        raise UnsupportedAdapterError(
            f"adapter {adapter!r} was initialised with init_lora_weights={init!r}, which changes the base weights "
            "(its ΔW is not s·BA on the original base); convert it to a plain LoRA first (save_pretrained with "
            "path_initial_model_for_weight_conversion)",
            adapter=adapter,
        )
    for name in ("modules_to_save", "target_parameters", "trainable_token_indices"):
        if cfg.get(name):
            raise UnsupportedAdapterError(
                f"adapter {adapter!r} has {name}={cfg.get(name)!r}: full-module copies / parameter adapters are not "
                "LoRA factors and cannot be merged into a LoRA adapter",
                adapter=adapter,
            )


def new_config_fields(refactored: Mapping[str, Refactored]) -> dict[str, Any]:
    """r, lora_alpha, rank_pattern, alpha_pattern, target_modules of the new adapter: scaling is exactly 1 in
    every module (lora_alpha = r per module), no rsLoRA; the pattern keys are escaped full module names, which
    PEFT's ``get_pattern_key`` matches exactly."""
    ranks = {m: f.rank for m, f in refactored.items()}
    values = list(ranks.values())
    r = max(sorted(set(values)), key=values.count) if values else 1
    pattern = {re.escape(m): k for m, k in ranks.items() if k != r}
    return {
        "r": r,
        "lora_alpha": r,
        "rank_pattern": pattern,
        "alpha_pattern": dict(pattern),
        "target_modules": sorted(refactored),
        "use_rslora": False,
    }


def merged_fan_in_fan_out(adapters: AdapterSet, modules: Iterable[str]) -> bool:
    """The new adapter's ``fan_in_fan_out``: that of the linear layers among ``modules``; one LoRA config holds one."""
    fan_in_fan_out = {adapters.module(m).transpose for m in modules if adapters.module(m).kind == "linear"}
    if len(fan_in_fan_out) > 1:
        raise UnsupportedAdapterError(
            "the adapters target both fan_in_fan_out and regular linear layers; one LoRA config cannot hold both"
        )
    return bool(fan_in_fan_out and fan_in_fan_out.pop())
