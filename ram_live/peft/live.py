"""Reading the LoRA factors of a live ``PeftModel`` (``peft`` is imported here, inside functions)."""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from ..errors import ConfigError
from .configs import check_config
from .errors import MissingDependencyError, UnsupportedAdapterError
from .factors import AdapterSet, Factor


def _import_peft() -> Any:
    try:
        import peft  # noqa: F401
        from peft.tuners.lora import layer as lora_layer  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError(
            'merging a live PeftModel needs the `peft` package: pip install -e ".[peft]" (in the ram-live clone)'
        ) from exc
    return peft


def tuner_of(peft_model: Any) -> tuple[Any, nn.Module]:
    """(the LoraModel, the wrapped transformers model whose module names PEFT uses)."""
    _import_peft()
    from peft import PeftModel
    from peft.tuners.lora import LoraModel

    tuner = peft_model.base_model if isinstance(peft_model, PeftModel) else peft_model
    if not isinstance(tuner, LoraModel):
        raise UnsupportedAdapterError(
            f"expected a PeftModel with LoRA adapters (or a LoraModel), got {type(peft_model).__name__}"
            + (f" wrapping a {type(tuner).__name__}" if tuner is not peft_model else "")
        )
    return tuner, tuner.model


def read_live(peft_model: Any, adapters: Sequence[str] | None) -> AdapterSet:
    from peft.tuners.lora import layer as lora_layer

    tuner, root = tuner_of(peft_model)
    configs = peft_model.peft_config
    names = tuple(configs) if adapters is None else tuple(adapters)
    if not names:
        raise ConfigError("no adapters to merge")
    if len(set(names)) != len(names):
        raise ConfigError(f"adapter names are not unique: {list(names)}")
    for a in names:
        if a not in configs:
            raise ConfigError(f"no adapter named {a!r} in the model; it has: {', '.join(map(repr, configs))}")
        check_config(configs[a].to_dict(), a)
    factors: dict[str, dict[str, Factor]] = {a: {} for a in names}
    order: list[str] = []
    for module_name, module in root.named_modules():
        if not isinstance(module, lora_layer.LoraLayer):
            continue
        present = [a for a in names if a in module.lora_A or a in module.lora_embedding_A]
        if not present:
            continue
        kind = (
            "linear"
            if type(module) is lora_layer.Linear
            else "embedding"
            if type(module) is lora_layer.Embedding
            else None
        )
        for a in present:
            where = f"module {module_name!r} of adapter {a!r}"
            if kind is None:
                raise UnsupportedAdapterError(
                    f"{where} is a {type(module).__module__}.{type(module).__name__} LoRA layer; ram_live merges "
                    "LoRA on nn.Linear (and Conv1D with fan_in_fan_out) and nn.Embedding layers only",
                    adapter=a,
                    module=module_name,
                )
            variant = getattr(module, "lora_variant", {}).get(a)
            if variant is not None or getattr(module, "use_dora", {}).get(a):
                raise UnsupportedAdapterError(
                    f"{where} uses the LoRA variant {type(variant).__name__ if variant else 'DoRA'}; its ΔW is "
                    "not s·BA, so it cannot be merged exactly",
                    adapter=a,
                    module=module_name,
                )
            if getattr(module, "lora_bias", {}).get(a):
                raise UnsupportedAdapterError(
                    f"{where} has lora_bias=True (a bias delta a LoRA adapter cannot carry)",
                    adapter=a,
                    module=module_name,
                )
            if kind == "linear":
                f = Factor(
                    module.lora_A[a].weight,
                    module.lora_B[a].weight,
                    float(module.scaling[a]),
                    "linear",
                    bool(getattr(module, "fan_in_fan_out", False)),
                )
            else:
                f = Factor(
                    module.lora_embedding_A[a], module.lora_embedding_B[a], float(module.scaling[a]), "embedding", True
                )
            factors[a][module_name] = f
        order.append(module_name)
    for a in names:
        if not factors[a]:
            raise UnsupportedAdapterError(f"adapter {a!r} has no LoRA layer in the model", adapter=a)
    return AdapterSet(names, factors, order, {a: configs[a] for a in names})


def active_adapter(peft_model: Any) -> str:
    active = getattr(peft_model, "active_adapter", None)
    if isinstance(active, (list, tuple)):
        active = active[0]
    if not isinstance(active, str):
        raise ConfigError("pass the adapter name: the model has no single active adapter")
    return active
