"""Reading PEFT adapter folders (``adapter_model.safetensors`` + ``adapter_config.json``) without ``peft``."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError, InputMismatchError, NonFiniteError, UnsupportedInputError
from ..io.safetensors_io import MappedSafetensors
from .configs import read_config
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
    """(factors by module, module order, config, full base-layer weights PEFT saved alongside): the config checked
    by :func:`~ram_live.peft.configs.read_config`, the weights read through the library's checked safetensors
    reader (a truncated or damaged file is an ``UnsupportedInputError`` naming the adapter and the file), each
    tensor copied to ``device``."""
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
    cfg = read_config(config_file, adapter)
    try:
        fh = MappedSafetensors(weights_file)
    except UnsupportedInputError as exc:
        raise UnsupportedInputError(f"adapter {adapter!r}: {exc}") from None
    parts: dict[str, dict[str, Tensor]] = {}
    kinds: dict[str, str] = {}
    order: list[str] = []
    saved: dict[str, Tensor] = {}
    for key in sorted(fh.keys()):
        name = key[len(PEFT_PREFIX) :] if key.startswith(PEFT_PREFIX) else key
        if name.endswith(".base_layer.weight"):
            # PEFT's save_embedding_layers: a full copy of a targeted embedding's base weight, not a delta;
            # checked against the base when one is given (into_base), otherwise not part of the merge
            saved[name[: -len(".base_layer.weight")] + ".weight"] = _tensor(fh, key, adapter, device)
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
        tensor = _tensor(fh, key, adapter, device)
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


def _tensor(fh: MappedSafetensors, key: str, adapter: str, device: str | torch.device) -> Tensor:
    """``key`` of the adapter's weights, copied out of the mapped file onto ``device``: a floating-point tensor of
    finite values (anything else is no LoRA factor or saved base weight)."""
    tensor = fh.tensor(key)
    if not tensor.is_floating_point():
        raise UnsupportedInputError(
            f"adapter {adapter!r}: tensor {key!r} in {fh.path} is {tensor.dtype}, not a floating-point LoRA factor"
        )
    tensor = tensor.to(device=device, copy=True)
    if not bool(torch.isfinite(tensor).all()):
        raise NonFiniteError(
            f"adapter {adapter!r}: tensor {key!r} in {fh.path} holds NaN or Inf", key=key, agent=adapter
        )
    return tensor


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
