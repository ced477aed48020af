"""Adapter configs: which adapters can be merged exactly, and the config of the new adapter."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import ConfigError, UnsupportedInputError
from ..io.st_header import read_regular, strict_json
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
#: an adapter_config.json larger than this is not read (PEFT's are a few kilobytes, rank patterns included)
_MAX_CONFIG = 100_000_000


def read_config(file: Path, adapter: str) -> dict[str, Any]:
    """``adapter_config.json`` of ``adapter``, read as strict UTF-8 JSON and checked: an object whose fields
    ram_live reads (``r``, ``lora_alpha``, ``rank_pattern``, ``alpha_pattern``, ``use_rslora``,
    ``fan_in_fan_out``, ``peft_type``) have the types PEFT gives them, then :func:`check_config`.

    Args:
        file: the ``adapter_config.json`` to read.
        adapter: the adapter's name, for the errors.

    Returns:
        The config, as the JSON object it holds.

    Raises:
        UnsupportedInputError: the file is not a regular file, not UTF-8, not JSON or not a JSON object.
        ConfigError: a field of the wrong type or value, or a pattern that is not a regular expression; the
            message names the file and the key.
        UnsupportedAdapterError: as :func:`check_config`.
    """
    where = f"adapter {adapter!r}: {file}"
    try:
        text = read_regular(file, _MAX_CONFIG).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsupportedInputError(f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except UnsupportedInputError as exc:
        raise UnsupportedInputError(f"adapter {adapter!r}: {exc}") from None
    cfg = strict_json(text, where)
    if not isinstance(cfg, dict):
        raise UnsupportedInputError(f"{where} holds a JSON {_json_type(cfg)}, not an object of LoRA settings")
    _check_fields(cfg, where)
    check_config(cfg, adapter)
    return cfg


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "boolean", dict: "object", list: "array", str: "string", int: "integer", float: "number"}
    return names.get(type(value), type(value).__name__)


def _bad(where: str, key: str, value: Any, wanted: str) -> ConfigError:
    return ConfigError(f"{where}: key {key!r} is {value!r:.80} (a JSON {_json_type(value)}); {wanted}")


def _positive_int(where: str, key: str, value: Any, what: str) -> None:
    if type(value) is not int or value <= 0:
        raise _bad(where, key, value, f"PEFT's {what} is a positive integer")


def _positive_number(where: str, key: str, value: Any, what: str) -> None:
    """A scale PEFT multiplies by (``lora_alpha``, ``alpha_pattern``'s values): an int or a float, finite and > 0
    (PEFT declares an int and runs a float alike: configs written with 16.0 or 8.5 exist)."""
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise _bad(where, key, value, f"PEFT's {what} is a positive number")


def _patterns(where: str, key: str, value: Any, what: str) -> None:
    """``rank_pattern`` / ``alpha_pattern``: null or an object of regular expressions to positive integers (alphas:
    positive numbers), each
    a valid expression in the form PEFT matches it with (``(.*\\.)?(<key>)$``)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad(where, key, value, f"PEFT's {key} is an object mapping module-name patterns to {what}s")
    for pattern, item in value.items():
        try:
            re.compile(rf"(.*\.)?({pattern})$")
        except (re.error, RecursionError, OverflowError) as exc:
            raise ConfigError(
                f"{where}: key {key!r} has the pattern {pattern!r:.80}, which is not a regular expression ({exc})"
            ) from None
        check = _positive_number if key == "alpha_pattern" else _positive_int
        check(where, f"{key}[{pattern!r:.80}]", item, what)


def _check_fields(cfg: Mapping[str, Any], where: str) -> None:
    """The types and values of the fields ram_live reads, as PEFT's ``LoraConfig`` declares them."""
    if "r" in cfg:
        _positive_int(where, "r", cfg["r"], "r (the rank)")
    if "lora_alpha" in cfg:
        _positive_number(where, "lora_alpha", cfg["lora_alpha"], "lora_alpha")
    _patterns(where, "rank_pattern", cfg.get("rank_pattern"), "rank")
    _patterns(where, "alpha_pattern", cfg.get("alpha_pattern"), "alpha")
    for key in ("use_rslora", "fan_in_fan_out"):
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise _bad(where, key, cfg[key], f"PEFT's {key} is true or false")
    if cfg.get("peft_type") is not None and not isinstance(cfg["peft_type"], str):
        raise _bad(where, "peft_type", cfg["peft_type"], 'PEFT\'s peft_type is a string such as "LORA"')


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
