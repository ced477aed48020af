"""Reading PEFT adapter folders (``adapter_model.safetensors`` + ``adapter_config.json``) without ``peft``."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError, InputMismatchError, UnsupportedInputError
from .configs import check_config
from .errors import UnsupportedAdapterError
from .factors import AdapterSet, Factor

PEFT_PREFIX = "base_model.model."
_SUFFIXES = {
    ".lora_A.weight": ("linear", "A"),
    ".lora_B.weight": ("linear", "B"),
    ".lora_embedding_A": ("embedding", "A"),
    ".lora_embedding_B": ("embedding", "B"),
}


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's ``get_pattern_key`` semantics: the first pattern ``p`` with ``re.match(rf"(.*\\.)?({p})$", module)``."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def read_folder(
    path: Path, adapter: str, device: str | torch.device = "cpu"
) -> tuple[dict[str, Factor], list[str], dict, dict[str, Tensor]]:
    """(factors by module, module order, config, full base-layer weights PEFT saved alongside)."""
    from safetensors import safe_open

    config_file = path / "adapter_config.json"
    weights_file = path / "adapter_model.safetensors"
    if not config_file.is_file():
        raise UnsupportedInputError(f"adapter {adapter!r}: {config_file} not found (is {path} a PEFT adapter folder?)")
    if not weights_file.is_file():
        extra = (
            " (adapter_model.bin is not read: re-save with safe_serialization=True)"
            if (path / "adapter_model.bin").exists()
            else ""
        )
        raise UnsupportedInputError(f"adapter {adapter!r}: {weights_file} not found{extra}")
    cfg = json.loads(config_file.read_text())
    check_config(cfg, adapter)
    parts: dict[str, dict[str, Tensor]] = {}
    kinds: dict[str, str] = {}
    order: list[str] = []
    saved: dict[str, Tensor] = {}
    with safe_open(str(weights_file), framework="pt", device=str(device)) as fh:
        for key in fh.keys():
            name = key[len(PEFT_PREFIX) :] if key.startswith(PEFT_PREFIX) else key
            if name.endswith(".base_layer.weight"):
                # PEFT's save_embedding_layers: a full copy of a targeted embedding's base weight, not a delta;
                # checked against the base when one is given (into_base), otherwise not part of the merge
                saved[name[: -len(".base_layer.weight")] + ".weight"] = fh.get_tensor(key)
                continue
            for suffix, (kind, which) in _SUFFIXES.items():
                if name.endswith(suffix):
                    module = name[: -len(suffix)]
                    break
            else:
                hint = (
                    "a DoRA magnitude vector"
                    if "lora_magnitude_vector" in key
                    else "a lora_bias (lora_B.bias)"
                    if key.endswith("lora_B.bias")
                    else "not a LoRA factor of a linear or embedding layer"
                )
                raise UnsupportedAdapterError(
                    f"adapter {adapter!r}: tensor {key!r} in {weights_file} is {hint}", adapter=adapter, module=key
                )
            if module not in parts:
                parts[module] = {}
                order.append(module)
            kinds[module] = kind
            tensor = fh.get_tensor(key)
            if tensor.dim() != 2:
                raise UnsupportedAdapterError(
                    f"adapter {adapter!r}: module {module!r} has {tensor.dim()}-d LoRA factors (a conv layer?); "
                    "ram_live merges LoRA on linear and embedding layers only",
                    adapter=adapter,
                    module=module,
                )
            parts[module][which] = tensor
    factors: dict[str, Factor] = {}
    for module in order:
        p = parts[module]
        if set(p) != {"A", "B"}:
            raise InputMismatchError(
                f"adapter {adapter!r}: module {module!r} lacks lora_{'B' if 'A' in p else 'A'}",
                key=module,
                agent=adapter,
            )
        r = int(p["A"].shape[0])
        r_cfg = int(_pattern_value(cfg.get("rank_pattern") or {}, module, cfg.get("r", r)))
        if r_cfg != r:
            raise InputMismatchError(
                f"adapter {adapter!r}: module {module!r} has rank {r} in its weights but {r_cfg} in its config",
                key=module,
                agent=adapter,
            )
        alpha = float(_pattern_value(cfg.get("alpha_pattern") or {}, module, cfg.get("lora_alpha", 8)))
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        kind = kinds[module]
        transpose = True if kind == "embedding" else bool(cfg.get("fan_in_fan_out", False))
        factors[module] = Factor(p["A"], p["B"], scaling, kind, transpose)  # type: ignore[arg-type]
    if not factors:
        raise UnsupportedAdapterError(f"adapter {adapter!r}: {weights_file} holds no LoRA factor", adapter=adapter)
    return factors, order, cfg, saved


def read_folders(
    adapters: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike], device: str | torch.device = "cpu"
) -> tuple[AdapterSet, dict[str, Path]]:
    if isinstance(adapters, Mapping):
        named = [(str(k), Path(v)) for k, v in adapters.items()]
    elif isinstance(adapters, (str, os.PathLike)):
        raise ConfigError("adapters must be a list of adapter folders or a mapping name → folder, not one path")
    else:
        paths = [Path(p) for p in adapters]
        named = [(p.name or f"adapter_{i}", p) for i, p in enumerate(paths)]
        if len({n for n, _ in named}) != len(named):
            named = [(f"adapter_{i}", p) for i, (_, p) in enumerate(named)]
    if not named:
        raise ConfigError("no adapters to merge")
    if len({n for n, _ in named}) != len(named):
        raise ConfigError(f"adapter names are not unique: {[n for n, _ in named]}")
    factors, configs, order, saved = {}, {}, [], {}
    for name, path in named:
        f, o, cfg, full = read_folder(path, name, device)
        factors[name] = f
        configs[name] = cfg
        saved[name] = full
        order += [m for m in o if m not in order]
    return AdapterSet(tuple(n for n, _ in named), factors, order, configs, saved), dict(named)
