"""LoRA / PEFT adapters merged with RAM (or any method of the registry) in ΔW space.

A LoRA adapter's task vector for a target module is ΔW = s · B A (s = lora_alpha / r, or lora_alpha / √r with
rsLoRA, per module through ``rank_pattern`` / ``alpha_pattern``). Merging the A and B factors separately is
wrong (the product of averages is not the average of products), so this module:

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

``import ram_live`` never imports ``peft`` or ``transformers``: they are imported here, inside functions.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import torch
from torch import Tensor, nn

from . import functional as F
from .engine import DEFAULT_CHUNK_NUMEL, MergeInfo, run_merge
from .errors import ConfigError, InputMismatchError, RamLiveError, UnsupportedInputError
from .methods import get_method, make_config
from .sources import TensorSpec, as_source

__all__ = [
    "ram_merge_adapters",
    "ram_merge_adapter_files",
    "lora_deltas",
    "refactor",
    "Refactored",
    "TopK",
    "RelativeThreshold",
    "RECOMMENDED_SPARSIFY",
    "AdapterMergeReport",
    "ModuleReport",
    "UnsupportedAdapterError",
    "MissingDependencyError",
    "DenseDeltaWarning",
]

RAM_FAMILY = ("ram", "ram_plus", "ram_plus_soft")


# ----------------------------------------------------------------------------------------------- errors


class UnsupportedAdapterError(RamLiveError, TypeError):
    """An adapter this module cannot merge exactly (DoRA and other LoRA variants, ``lora_bias``, conv or other
    layer types, ``modules_to_save``, PiSSA/OLoRA/CorDA/LoftQ initialisation, non-LoRA PEFT types)."""

    def __init__(self, message: str, *, adapter: str | None = None, module: str | None = None) -> None:
        super().__init__(message)
        self.adapter = adapter
        self.module = module


class MissingDependencyError(RamLiveError, ImportError):
    """An optional dependency is not installed."""


class DenseDeltaWarning(UserWarning):
    """RAM on dense ΔW with the paper's |Δ| > eps rule: nearly every entry is shared, RAM is a plain mean."""


def _import_peft() -> Any:
    try:
        import peft  # noqa: F401
        from peft.tuners.lora import layer as lora_layer  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError(
            "merging a live PeftModel needs the `peft` package: pip install 'ram-live[peft]'"
        ) from exc
    return peft


# ----------------------------------------------------------------------------------------------- activity rules


@dataclass(frozen=True)
class TopK:
    """Keep, per adapter and per module, the ``density`` fraction of ΔW entries of largest magnitude (k =
    int(density · numel), entries tied with the k-th magnitude kept); the rest count as "not updated"."""

    density: float = 0.2

    def __post_init__(self) -> None:
        if not (isinstance(self.density, (int, float)) and 0.0 < self.density <= 1.0):
            raise ConfigError(f"TopK.density must be in (0, 1], got {self.density!r}")

    def cut(self, delta: Tensor) -> float | None:
        """Entries with |Δ| below this are dropped (``None``: keep all)."""
        return F.magnitude_threshold(delta, self.density)

    def __str__(self) -> str:
        return f"topk(density={self.density:g})"


@dataclass(frozen=True)
class RelativeThreshold:
    """Keep, per adapter and per module, the ΔW entries with |Δ| > ``threshold`` · RMS(ΔW of that module);
    for Gaussian-like deltas threshold 1.0 keeps ≈ 32 %, 2.0 keeps ≈ 4.6 %."""

    threshold: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and self.threshold >= 0.0):
            raise ConfigError(f"RelativeThreshold.threshold must be >= 0, got {self.threshold!r}")

    def cut(self, delta: Tensor) -> float | None:
        """Entries with |Δ| below this are dropped (``None``: keep all). The rule is strict (|Δ| > t): the cut
        is the next float above t, so that |Δ| == t is dropped too."""
        t = float(self.threshold * delta.float().pow(2).mean().sqrt())
        return math.nextafter(t, math.inf) if t > 0 else None

    def __str__(self) -> str:
        return f"relative(threshold={self.threshold:g}×rms)"


SparsifyRule = TopK | RelativeThreshold

#: The rule ``sparsify="auto"`` uses for the RAM family; chosen by ``examples/lora_activity_experiment.py``
#: (see the README section "LoRA / PEFT adapters").
RECOMMENDED_SPARSIFY: SparsifyRule = TopK(0.5)


def _sparsify_rule(sparsify: Any, method: str) -> SparsifyRule | None:
    if sparsify == "auto":
        return RECOMMENDED_SPARSIFY if method in RAM_FAMILY else None
    if sparsify is None or sparsify in ("none", "dense"):
        return None
    if isinstance(sparsify, (TopK, RelativeThreshold)):
        return sparsify
    if sparsify == "topk":
        return TopK()
    if sparsify == "relative":
        return RelativeThreshold()
    if isinstance(sparsify, tuple) and len(sparsify) == 2 and sparsify[0] in ("topk", "relative"):
        return TopK(sparsify[1]) if sparsify[0] == "topk" else RelativeThreshold(sparsify[1])
    raise ConfigError(
        f"sparsify must be 'auto', None, 'topk', 'relative', ('topk', density), ('relative', threshold), TopK(...) "
        f"or RelativeThreshold(...); got {sparsify!r}"
    )


# ----------------------------------------------------------------------------------------------- factors


@dataclass
class _Factor:
    """One adapter's LoRA factors for one module: ΔW = scaling · B @ A ([out, in], "B·A layout").

    ``transpose``: the module's weight is stored as ΔWᵀ (``fan_in_fan_out`` linears, embeddings).
    """

    A: Tensor
    B: Tensor
    scaling: float
    kind: Literal["linear", "embedding"]
    transpose: bool

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """B·A's shape [out, in]."""
        return int(self.B.shape[0]), int(self.A.shape[1])

    @property
    def weight_shape(self) -> tuple[int, int]:
        return (self.shape[1], self.shape[0]) if self.transpose else self.shape

    def delta(self, device: torch.device | None = None, layout: Literal["weight", "lora"] = "weight") -> Tensor:
        """ΔW in float32, contiguous, in the weight's layout (default) or B·A's."""
        dev = device or self.B.device
        b = self.B.detach().to(device=dev, dtype=torch.float32)
        a = self.A.detach().to(device=dev, dtype=torch.float32)
        out = (a.T @ b.T) if (self.transpose and layout == "weight") else (b @ a)
        return out.mul_(self.scaling)


def _weight_key(module: str) -> str:
    return f"{module}.weight"


def _module_of(key: str) -> str:
    return key[: -len(".weight")]


@dataclass
class _AdapterSet:
    """Every adapter's factors, by module, plus the order of the modules and what each adapter's config was."""

    names: tuple[str, ...]
    factors: dict[str, dict[str, _Factor]]  # adapter -> module -> factor
    order: list[str]
    configs: dict[str, Any]
    saved_weights: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # adapter -> base key -> tensor

    def module(self, name: str) -> _Factor:
        return next(self.factors[a][name] for a in self.names if name in self.factors[a])

    def max_rank(self) -> int:
        return max(f.rank for per in self.factors.values() for f in per.values())

    def targeting(self, module: str) -> tuple[str, ...]:
        return tuple(a for a in self.names if module in self.factors[a])


def _check_consistent(adapters: _AdapterSet) -> None:
    for module in adapters.order:
        ref_name = next(a for a in adapters.names if module in adapters.factors[a])
        ref = adapters.factors[ref_name][module]
        for a in adapters.names:
            f = adapters.factors[a].get(module)
            if f is None:
                continue
            if f.shape != ref.shape or f.kind != ref.kind or f.transpose != ref.transpose:
                raise InputMismatchError(
                    f"module {module!r}: adapter {a!r} has a {f.kind} ΔW of shape {list(f.shape)} "
                    f"(transposed={f.transpose}), adapter {ref_name!r} a {ref.kind} of shape {list(ref.shape)} "
                    f"(transposed={ref.transpose}); were they trained on the same base model?",
                    key=module, agent=a,
                )
            if f.B.shape[1] != f.rank:
                raise InputMismatchError(
                    f"module {module!r} of adapter {a!r}: lora_B has {f.B.shape[1]} columns, lora_A {f.rank} rows",
                    key=module, agent=a,
                )


# --- live PeftModel


#: LoRA variants whose ΔW is not s·BA (fields of LoraConfig that switch a variant on)
_VARIANT_FIELDS = ("use_dora", "lora_bias", "alora_invocation_tokens", "arrow_config", "use_bdlora",
                   "velora_config", "monteclora_config", "kasa_config", "use_qalora")
#: initialisations that rewrite the base weight (W_res = W − s·B₀A₀), so s·BA is not the delta to the base
_RESIDUAL_INITS = ("pissa", "corda", "olora", "loftq", "lora_ga")


def _check_config(cfg: Mapping[str, Any], adapter: str) -> None:
    """Refuse, by its config, an adapter whose ΔW is not s · B A on an unchanged base."""
    peft_type = str(cfg.get("peft_type", "LORA")).split(".")[-1].upper()
    if peft_type != "LORA":
        raise UnsupportedAdapterError(
            f"adapter {adapter!r} is a {peft_type} adapter; only LoRA adapters can be merged", adapter=adapter
        )
    for name in _VARIANT_FIELDS:
        if cfg.get(name):
            what = {"use_dora": "DoRA (its ΔW depends on the base weight's norm, not s·BA)",
                    "lora_bias": "lora_bias=True (a bias delta a re-factored adapter cannot carry)"}.get(
                name, f"the LoRA variant {name}")
            raise UnsupportedAdapterError(
                f"adapter {adapter!r} uses {what}; ram_live merges plain LoRA adapters only", adapter=adapter
            )
    init = cfg.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower().startswith(_RESIDUAL_INITS):
        raise UnsupportedAdapterError(
            f"adapter {adapter!r} was initialised with init_lora_weights={init!r}, which changes the base weights "
            "(its ΔW is not s·BA on the original base); convert it to a plain LoRA first (save_pretrained with "
            "path_initial_model_for_weight_conversion)", adapter=adapter,
        )
    for name in ("modules_to_save", "target_parameters", "trainable_token_indices"):
        if cfg.get(name):
            raise UnsupportedAdapterError(
                f"adapter {adapter!r} has {name}={cfg.get(name)!r}: full-module copies / parameter adapters are not "
                "LoRA factors and cannot be merged into a LoRA adapter", adapter=adapter,
            )


def _tuner(peft_model: Any) -> tuple[Any, nn.Module]:
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


def _read_live(peft_model: Any, adapters: Sequence[str] | None) -> _AdapterSet:
    from peft.tuners.lora import layer as lora_layer

    tuner, root = _tuner(peft_model)
    configs = peft_model.peft_config
    names = tuple(configs) if adapters is None else tuple(adapters)
    if not names:
        raise ConfigError("no adapters to merge")
    if len(set(names)) != len(names):
        raise ConfigError(f"adapter names are not unique: {list(names)}")
    for a in names:
        if a not in configs:
            raise ConfigError(f"no adapter named {a!r} in the model; it has: {', '.join(map(repr, configs))}")
        _check_config(configs[a].to_dict(), a)
    factors: dict[str, dict[str, _Factor]] = {a: {} for a in names}
    order: list[str] = []
    for module_name, module in root.named_modules():
        if not isinstance(module, lora_layer.LoraLayer):
            continue
        present = [a for a in names if a in module.lora_A or a in module.lora_embedding_A]
        if not present:
            continue
        kind = (
            "linear" if type(module) is lora_layer.Linear
            else "embedding" if type(module) is lora_layer.Embedding else None
        )
        for a in present:
            where = f"module {module_name!r} of adapter {a!r}"
            if kind is None:
                raise UnsupportedAdapterError(
                    f"{where} is a {type(module).__module__}.{type(module).__name__} LoRA layer; ram_live merges "
                    "LoRA on nn.Linear (and Conv1D with fan_in_fan_out) and nn.Embedding layers only",
                    adapter=a, module=module_name,
                )
            variant = getattr(module, "lora_variant", {}).get(a)
            if variant is not None or getattr(module, "use_dora", {}).get(a):
                raise UnsupportedAdapterError(
                    f"{where} uses the LoRA variant {type(variant).__name__ if variant else 'DoRA'}; its ΔW is "
                    "not s·BA, so it cannot be merged exactly", adapter=a, module=module_name,
                )
            if getattr(module, "lora_bias", {}).get(a):
                raise UnsupportedAdapterError(
                    f"{where} has lora_bias=True (a bias delta a LoRA adapter cannot carry)",
                    adapter=a, module=module_name,
                )
            if kind == "linear":
                f = _Factor(module.lora_A[a].weight, module.lora_B[a].weight, float(module.scaling[a]), "linear",
                            bool(getattr(module, "fan_in_fan_out", False)))
            else:
                f = _Factor(module.lora_embedding_A[a], module.lora_embedding_B[a], float(module.scaling[a]),
                            "embedding", True)
            factors[a][module_name] = f
        order.append(module_name)
    for a in names:
        if not factors[a]:
            raise UnsupportedAdapterError(f"adapter {a!r} has no LoRA layer in the model", adapter=a)
    return _AdapterSet(names, factors, order, {a: configs[a] for a in names})


# --- adapter folders on disk

_PREFIX = "base_model.model."
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


def _read_folder(
    path: Path, adapter: str, device: str | torch.device = "cpu"
) -> tuple[dict[str, _Factor], list[str], dict, dict[str, Tensor]]:
    """(factors by module, module order, config, full base-layer weights PEFT saved alongside)."""
    from safetensors import safe_open

    config_file = path / "adapter_config.json"
    weights_file = path / "adapter_model.safetensors"
    if not config_file.is_file():
        raise UnsupportedInputError(f"adapter {adapter!r}: {config_file} not found (is {path} a PEFT adapter folder?)")
    if not weights_file.is_file():
        extra = " (adapter_model.bin is not read: re-save with safe_serialization=True)" if (
            path / "adapter_model.bin").exists() else ""
        raise UnsupportedInputError(f"adapter {adapter!r}: {weights_file} not found{extra}")
    cfg = json.loads(config_file.read_text())
    _check_config(cfg, adapter)
    parts: dict[str, dict[str, Tensor]] = {}
    kinds: dict[str, str] = {}
    order: list[str] = []
    saved: dict[str, Tensor] = {}
    with safe_open(str(weights_file), framework="pt", device=str(device)) as fh:
        for key in fh.keys():
            name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
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
                    "a DoRA magnitude vector" if "lora_magnitude_vector" in key
                    else "a lora_bias (lora_B.bias)" if key.endswith("lora_B.bias")
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
                    "ram_live merges LoRA on linear and embedding layers only", adapter=adapter, module=module,
                )
            parts[module][which] = tensor
    factors: dict[str, _Factor] = {}
    for module in order:
        p = parts[module]
        if set(p) != {"A", "B"}:
            raise InputMismatchError(f"adapter {adapter!r}: module {module!r} lacks lora_{'B' if 'A' in p else 'A'}",
                                     key=module, agent=adapter)
        r = int(p["A"].shape[0])
        r_cfg = int(_pattern_value(cfg.get("rank_pattern") or {}, module, cfg.get("r", r)))
        if r_cfg != r:
            raise InputMismatchError(
                f"adapter {adapter!r}: module {module!r} has rank {r} in its weights but {r_cfg} in its config",
                key=module, agent=adapter,
            )
        alpha = float(_pattern_value(cfg.get("alpha_pattern") or {}, module, cfg.get("lora_alpha", 8)))
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        kind = kinds[module]
        transpose = True if kind == "embedding" else bool(cfg.get("fan_in_fan_out", False))
        factors[module] = _Factor(p["A"], p["B"], scaling, kind, transpose)  # type: ignore[arg-type]
    if not factors:
        raise UnsupportedAdapterError(f"adapter {adapter!r}: {weights_file} holds no LoRA factor", adapter=adapter)
    return factors, order, cfg, saved


def _read_folders(adapters: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike],
                  device: str | torch.device = "cpu") -> tuple[_AdapterSet, dict[str, Path]]:
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
        f, o, cfg, full = _read_folder(path, name, device)
        factors[name] = f
        configs[name] = cfg
        saved[name] = full
        order += [m for m in o if m not in order]
    return _AdapterSet(tuple(n for n, _ in named), factors, order, configs, saved), dict(named)


def lora_deltas(
    source: Any, adapter: str | None = None, *, layout: Literal["weight", "lora"] = "weight"
) -> dict[str, Tensor]:
    """Every target module's ΔW = s · B A of one adapter, in float32: ``{module name: ΔW}``.

    ``source``: a live ``PeftModel`` (then ``adapter`` names the adapter, default its active one) or a PEFT
    adapter folder. ``layout="weight"`` gives ΔW in the layout of the module's weight (what PEFT's
    ``get_delta_weight`` returns and ``merge_and_unload`` adds: transposed for ``fan_in_fan_out`` and embedding
    layers); ``"lora"`` gives B·A's layout [out, in]. Module names are those PEFT uses (relative to the wrapped
    model, e.g. ``model.layers.0.self_attn.q_proj``).
    """
    if isinstance(source, (str, os.PathLike)):
        factors, _, _, _ = _read_folder(Path(source), adapter or Path(source).name)
    else:
        name = adapter if adapter is not None else _active_adapter(source)
        factors = _read_live(source, [name]).factors[name]
    with torch.no_grad():
        return {module: f.delta(layout=layout) for module, f in factors.items()}


def _active_adapter(peft_model: Any) -> str:
    active = getattr(peft_model, "active_adapter", None)
    if isinstance(active, (list, tuple)):
        active = active[0]
    if not isinstance(active, str):
        raise ConfigError("pass the adapter name: the model has no single active adapter")
    return active


# ----------------------------------------------------------------------------------------------- engine glue


class _Deltas:
    """One adapter's ΔW by weight key (``<module>.weight``, weight layout, float32), sparsified by ``rule``,
    computed on request; counts, per key, the entries with |Δ| > ``eps`` (the paper's rule) and those kept."""

    def __init__(self, name: str, factors: Mapping[str, _Factor], rule: SparsifyRule | None, eps: float) -> None:
        self.name = name
        self.factors = {_weight_key(m): f for m, f in factors.items()}
        self.rule = rule
        self.eps = eps
        self._cuts: dict[str, float | None] = {}
        self.raw_active: dict[str, int] = {}
        self.kept_active: dict[str, int] = {}
        self.numel: dict[str, int] = {}

    def get(self, key: str, device: torch.device) -> Tensor | None:
        f = self.factors.get(key)
        if f is None:
            return None
        delta = f.delta(device)
        first = key not in self.raw_active
        if first:
            self.numel[key] = delta.numel()
            self.raw_active[key] = int(torch.count_nonzero(delta.abs() > self.eps))
        if self.rule is not None:
            if key not in self._cuts:
                self._cuts[key] = self.rule.cut(delta)
            cut = self._cuts[key]
            if cut is not None:
                delta.masked_fill_(delta.abs() < cut, 0.0)
        if first:
            self.kept_active[key] = int(torch.count_nonzero(delta)) if self.rule is not None else self.raw_active[key]
        return delta

    def density(self) -> tuple[float, float]:
        """(fraction of entries with |Δ| > eps, fraction kept by the rule) over the modules it targets."""
        total = sum(self.numel.values())
        if not total:
            return 0.0, 0.0
        return sum(self.raw_active.values()) / total, sum(self.kept_active.values()) / total


class _DeltaSource:
    """A TensorSource of one adapter's ΔW per weight key (zeros where it has no factor)."""

    def __init__(self, deltas: _Deltas, specs: Mapping[str, TensorSpec]) -> None:
        self.name = deltas.name
        self.deltas = deltas
        self._specs = specs

    def keys(self) -> list[str]:
        return list(self._specs)

    def spec(self, key: str) -> TensorSpec:
        return self._specs[key]

    def aliases(self) -> dict[str, str]:
        return {}

    def get(self, key: str) -> Tensor:
        spec = self._specs[key]
        delta = self.deltas.get(key, spec.device)
        return delta if delta is not None else torch.zeros(spec.shape, dtype=torch.float32, device=spec.device)


class _ZeroBase(_DeltaSource):
    def __init__(self, specs: Mapping[str, TensorSpec]) -> None:
        super().__init__(_Deltas("zero base", {}, None, 0.0), specs)


class _BasePlusDeltaSource:
    """The model "base + ΔW_t" of one adapter, without materialising it: targeted weights are read as
    float64 ``W + ΔW_t`` (so that the engine's τ_t = (W + ΔW_t) − W is ΔW_t to ~1e-16·|W|, and entries the
    rule dropped are exactly 0), every other tensor is the base's own."""

    def __init__(self, base: Any, deltas: _Deltas) -> None:
        self.name = deltas.name
        self.base = base
        self.deltas = deltas

    def keys(self) -> list[str]:
        return self.base.keys()

    def spec(self, key: str) -> TensorSpec:
        s = self.base.spec(key)
        if key in self.deltas.factors:
            return TensorSpec(s.shape, torch.float64, s.device, s.is_buffer)
        return s

    def aliases(self) -> dict[str, str]:
        return self.base.aliases()

    def get(self, key: str) -> Tensor:
        w = self.base.get(key)
        if key not in self.deltas.factors:
            return w
        delta = self.deltas.get(key, w.device)
        return w.to(torch.float64).add_(delta)


class _CallbackSink:
    """Hands each merged ΔW* to ``on_module(weight key, ΔW*)`` as soon as the engine has written it."""

    def __init__(self, on_module: Callable[[str, Tensor], None]) -> None:
        self.on_module = on_module
        self._pending: dict[str, Tensor] = {}

    def begin(self, *args: Any, **kwargs: Any) -> None:
        pass

    def destination(self, key: str, spec: TensorSpec) -> Tensor:
        t = torch.empty(spec.shape, dtype=torch.float32, device=spec.device)
        self._pending[key] = t
        return t

    def commit(self, key: str) -> None:
        self.on_module(key, self._pending.pop(key))

    def copy_from_base(self, key: str, tensor: Tensor) -> None:  # pragma: no cover - every key is merged
        raise AssertionError(f"unexpected copy of {key!r}")

    def alias(self, alias: str, canonical: str) -> None:  # pragma: no cover
        pass

    def finish(self) -> None:
        return None

    def abort(self) -> None:
        self._pending.clear()


@dataclass
class _Prepared:
    method: str
    rule: SparsifyRule | None
    options: dict[str, Any]
    deltas: list[_Deltas]


def _prepare(adapters: _AdapterSet, method: str, options: Mapping[str, Any], sparsify: Any) -> _Prepared:
    """Check options and inputs (nothing is computed) and set up each adapter's ΔW reader."""
    rule = _sparsify_rule(sparsify, method)
    get_method(method)
    opts = dict(options)
    if rule is not None and method in RAM_FAMILY:
        opts.setdefault("eps", 0.0)  # the rule decides what is active; every kept entry counts
    make_config(method, None, **opts)
    _check_consistent(adapters)
    measure_eps = float(options.get("eps", 1e-5))
    deltas = [_Deltas(a, adapters.factors[a], rule, measure_eps) for a in adapters.names]
    return _Prepared(method, rule, opts, deltas)


def _finish_report(prep: _Prepared, info: MergeInfo, report: "AdapterMergeReport", warn_dense: bool) -> None:
    report.method = prep.method
    report.config = info.config
    report.sparsify = str(prep.rule) if prep.rule is not None else None
    report.lambdas = info.lambdas
    report.rho = info.rho
    report.merge_seconds = info.seconds
    for d in prep.deltas:
        report.density[d.name], report.active[d.name] = d.density()
    if warn_dense and prep.rule is None and prep.method in RAM_FAMILY:
        dense = {a: x for a, x in report.density.items() if x > 0.5}
        if dense:
            shown = ", ".join(f"{a!r} {100 * x:.1f} %" for a, x in dense.items())
            eps = prep.deltas[0].eps
            warnings.warn(
                f"RAM on dense LoRA deltas: {shown} of the ΔW entries exceed eps={eps:g}, so nearly every entry is "
                "shared and RAM reduces to a plain mean of the adapters. Pass a sparsifying activity rule, e.g. "
                f"sparsify={RECOMMENDED_SPARSIFY!r} (the recommended one, which sparsify='auto' uses).",
                DenseDeltaWarning, stacklevel=3,
            )


def _merge_in_delta_space(adapters: _AdapterSet, prep: _Prepared, on_module: Callable[[str, Tensor], None], *,
                          device: torch.device | None, chunk_numel: int) -> MergeInfo:
    """Merge the ΔW_t (zero base) with the engine, module by module; ``on_module`` gets each ΔW*."""
    specs = {}
    for m in adapters.order:
        f = adapters.module(m)
        specs[_weight_key(m)] = TensorSpec(f.weight_shape, torch.float32, device or f.B.device)
    sources = [_DeltaSource(d, specs) for d in prep.deltas]
    cfg = make_config(prep.method, None, **prep.options)
    return run_merge(_ZeroBase(specs), sources, get_method(prep.method), cfg, _CallbackSink(on_module),
                     device=device, chunk_numel=chunk_numel)


def _merge_into_base(base: Any, prep: _Prepared, *, inplace: bool, out: Any, device: Any, dtype: Any,
                     max_shard_bytes: int, chunk_numel: int) -> tuple[Any, MergeInfo]:
    """θ* = θ₀ + merged ΔW through :func:`ram_live.merge`, with agents "base + ΔW_t" read lazily."""
    from .api import merge

    base_source = as_source(base, "base")
    agents = {d.name: _BasePlusDeltaSource(base_source, d) for d in prep.deltas}
    kwargs: dict[str, Any] = {}
    if out is not None:
        kwargs["max_shard_bytes"] = max_shard_bytes
    return merge(agents, base=base, method=prep.method, inplace=inplace, out=out, device=device, dtype=dtype,
                 chunk_numel=chunk_numel, return_info=True, **kwargs, **prep.options)


# ----------------------------------------------------------------------------------------------- re-factorisation


@dataclass
class Refactored:
    """ΔW ≈ B @ A with ``rank`` columns/rows; ``error`` = ‖ΔW − BA‖_F / ‖ΔW‖_F (0 for ΔW = 0)."""

    A: Tensor
    B: Tensor
    rank: int
    error: float
    svd: str
    seconds: float


def _energy_rank(s: Tensor, total: float, energy: float, cap: int) -> int:
    if total <= 0:
        return 1
    captured = torch.cumsum(s.double().pow(2), 0) / total
    reached = torch.nonzero(captured >= energy - 1e-12)
    k = int(reached[0, 0]) + 1 if reached.numel() else int(s.numel())
    return max(1, min(k, cap))


def refactor(
    delta: Tensor,
    rank: int | None = None,
    *,
    energy: float | None = None,
    svd: Literal["auto", "exact", "randomized"] = "auto",
    oversample: int | None = None,
    niter: int = 4,
    seed: int = 0,
) -> Refactored:
    """Truncated SVD of ``delta`` ([out, in], B·A layout) into ``B`` [out, k] and ``A`` [k, in], split as
    B = U√S, A = √S Vᵀ.

    ``rank``: k (capped at min(out, in)); ``energy``: the smallest k whose singular values capture that fraction
    of ‖ΔW‖²_F, at most ``rank`` (or min(out, in)). ``svd="exact"``: ``torch.linalg.svd(full_matrices=False)``;
    ``"randomized"``: ``torch.svd_lowrank`` with q = k + ``oversample`` (default max(k, 16)) columns and
    ``niter`` power iterations, drawn from a generator seeded with ``seed`` (the global RNG is left as it was);
    ``"auto"``: randomized when q ≤ min(out, in) / 4, else exact. The error is measured, not estimated.
    """
    t0 = time.perf_counter()
    if svd not in ("auto", "exact", "randomized"):
        raise ConfigError(f"svd must be 'auto', 'exact' or 'randomized', got {svd!r}")
    if energy is not None and not (0.0 < energy <= 1.0):
        raise ConfigError(f"energy must be in (0, 1], got {energy!r}")
    if rank is not None and (not isinstance(rank, int) or rank < 1):
        raise ConfigError(f"rank must be a positive int, got {rank!r}")
    m = delta.float()
    rows, cols = m.shape
    full = min(rows, cols)
    cap = min(rank, full) if rank is not None else full
    if rank is None and energy is None:
        raise ConfigError("pass rank= or energy=")
    extra = oversample if oversample is not None else max(cap, 16)
    q = min(full, cap + extra)
    kind = svd
    if kind == "auto":
        kind = "randomized" if 4 * q <= full else "exact"
    total = float(m.double().pow(2).sum())
    if kind == "exact":
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
    else:
        devices = [m.device] if m.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if m.device.type == "cuda":
                with torch.cuda.device(m.device):
                    torch.cuda.manual_seed(seed)
            torch.random.default_generator.manual_seed(seed)
            u, s, v = torch.svd_lowrank(m, q=q, niter=niter)
        vh = v.T
    k = _energy_rank(s, total, energy, cap) if energy is not None else min(cap, int(s.numel()))
    root = s[:k].clamp(min=0).sqrt()
    b = u[:, :k] * root
    a = root[:, None] * vh[:k]
    if total > 0:
        error = float(torch.linalg.matrix_norm(m - b @ a).double() / math.sqrt(total))
    else:
        error = 0.0
    return Refactored(a.contiguous(), b.contiguous(), k, error, kind, time.perf_counter() - t0)


# ----------------------------------------------------------------------------------------------- report


@dataclass
class ModuleReport:
    """One module of the merged adapter: its shape, its rank, and the re-factorisation's relative error."""

    shape: tuple[int, int]
    kind: str
    adapters: tuple[str, ...]
    rank: int | None = None
    error: float | None = None
    svd: str | None = None
    seconds: float = 0.0
    norm: float = 0.0


@dataclass
class AdapterMergeReport:
    """What :func:`ram_merge_adapters` / :func:`ram_merge_adapter_files` did.

    ``density``: per adapter, the fraction of its ΔW entries with |Δ| > eps (over the modules it targets);
    ``active``: the fraction the activity rule kept; ``modules``: per module rank and relative Frobenius error
    of the re-factorisation (``None`` with ``into_base=True``); λ and ρ per adapter for RAM+.
    """

    adapters: tuple[str, ...]
    target: str
    method: str = ""
    config: Any = None
    sparsify: str | None = None
    density: dict[str, float] = field(default_factory=dict)
    active: dict[str, float] = field(default_factory=dict)
    lambdas: dict[str, float] | None = None
    rho: dict[str, float] | None = None
    modules: dict[str, ModuleReport] = field(default_factory=dict)
    merge_seconds: float = 0.0
    refactor_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def max_error(self) -> float:
        errors = [m.error for m in self.modules.values() if m.error is not None]
        return max(errors) if errors else 0.0

    @property
    def error(self) -> float:
        """The whole adapter's relative error: sqrt(Σ err_m² ‖ΔW*_m‖²) / sqrt(Σ ‖ΔW*_m‖²)."""
        num = sum((m.error or 0.0) ** 2 * m.norm**2 for m in self.modules.values())
        den = sum(m.norm**2 for m in self.modules.values())
        return math.sqrt(num / den) if den > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None | str:
            return None if x is None else ("inf" if math.isinf(x) else float(x))

        config = self.config.__dict__ if hasattr(self.config, "__dict__") else self.config
        return {
            "adapters": list(self.adapters),
            "target": self.target,
            "method": self.method,
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in (config or {}).items()},
            "sparsify": self.sparsify,
            "density": dict(self.density),
            "active": dict(self.active),
            "lambdas": dict(self.lambdas) if self.lambdas else None,
            "rho": {k: num(v) for k, v in self.rho.items()} if self.rho else None,
            "error": self.error,
            "max_error": self.max_error,
            "modules": {
                name: {"shape": list(m.shape), "kind": m.kind, "adapters": list(m.adapters), "rank": m.rank,
                       "error": m.error, "svd": m.svd, "seconds": m.seconds, "norm": m.norm}
                for name, m in self.modules.items()
            },
            "seconds": {"merge": self.merge_seconds, "refactor": self.refactor_seconds, "total": self.seconds},
        }

    def table(self) -> str:
        lines = [f"{self.method} of {len(self.adapters)} adapters -> {self.target}"
                 + (f"  (activity rule: {self.sparsify})" if self.sparsify else "  (activity rule: |Δ| > eps)")]
        lines.append(f"{'adapter':<20} {'density':>9} {'active':>9} {'rho':>8} {'lambda':>8}")
        for a in self.adapters:
            rho = self.rho.get(a) if self.rho else None
            lam = self.lambdas.get(a) if self.lambdas else None
            lines.append(f"{a:<20} {100 * self.density.get(a, 0):8.2f}% {100 * self.active.get(a, 0):8.2f}% "
                         f"{'-' if rho is None else f'{rho:.3f}':>8} {'-' if lam is None else f'{lam:.4f}':>8}")
        if any(m.rank is not None for m in self.modules.values()):
            lines.append(f"{'module':<48} {'shape':>12} {'rank':>5} {'rel. error':>11} {'svd':>10}")
            for name, m in self.modules.items():
                shape = "x".join(map(str, m.shape))
                lines.append(f"{name[-48:]:<48} {shape:>12} {m.rank:>5} {m.error:11.3e} {m.svd:>10}")
            lines.append(f"whole adapter: relative error {self.error:.3e} (max per module {self.max_error:.3e})")
        lines.append(f"time: merge {self.merge_seconds:.3f} s, re-factor {self.refactor_seconds:.3f} s, "
                     f"total {self.seconds:.3f} s")
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- outputs


@dataclass
class _Refactorer:
    """on_module callback: re-factor each merged ΔW* and keep its (small) factors, by module name."""

    adapters: _AdapterSet
    report: "AdapterMergeReport"
    rank: int | None
    energy: float | None
    svd: str
    oversample: int | None
    niter: int
    seed: int
    factors: dict[str, Refactored] = field(default_factory=dict)

    def __call__(self, key: str, delta: Tensor) -> None:
        module = _module_of(key)
        f = self.adapters.module(module)
        lora_layout = delta.T if f.transpose else delta
        out = refactor(lora_layout, self.rank, energy=self.energy, svd=self.svd,  # type: ignore[arg-type]
                       oversample=self.oversample, niter=self.niter, seed=F.stable_seed("refactor", self.seed, module))
        self.factors[module] = out
        self.report.modules[module] = ModuleReport(
            shape=f.shape, kind=f.kind, adapters=self.adapters.targeting(module), rank=out.rank, error=out.error,
            svd=out.svd, seconds=out.seconds, norm=float(torch.linalg.matrix_norm(delta)),
        )
        self.report.refactor_seconds += out.seconds


def _new_config_fields(refactored: Mapping[str, Refactored]) -> dict[str, Any]:
    """r, lora_alpha, rank_pattern, alpha_pattern, target_modules of the new adapter: scaling is exactly 1 in
    every module (lora_alpha = r per module), no rsLoRA; the pattern keys are escaped full module names, which
    PEFT's ``get_pattern_key`` matches exactly."""
    ranks = {m: f.rank for m, f in refactored.items()}
    values = list(ranks.values())
    r = max(sorted(set(values)), key=values.count) if values else 1
    pattern = {re.escape(m): k for m, k in ranks.items() if k != r}
    return {
        "r": r, "lora_alpha": r, "rank_pattern": pattern, "alpha_pattern": dict(pattern),
        "target_modules": sorted(refactored), "use_rslora": False,
    }


def _check_options(rank: Any, energy: Any, svd: Any, inplace: bool, into_base: bool) -> None:
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise ConfigError(f"rank must be a positive int or None (the largest input rank), got {rank!r}")
    if energy is not None and not (isinstance(energy, (int, float)) and 0.0 < energy <= 1.0):
        raise ConfigError(f"energy must be in (0, 1], got {energy!r}")
    if svd not in ("auto", "exact", "randomized"):
        raise ConfigError(f"svd must be 'auto', 'exact' or 'randomized', got {svd!r}")
    if inplace and not into_base:
        raise ConfigError("inplace=True applies to into_base=True only")


def _refactorer(adapters: _AdapterSet, report: "AdapterMergeReport", rank: int | None, energy: float | None,
                svd: str, oversample: int | None, niter: int, seed: int) -> _Refactorer:
    if rank is None and energy is None:
        rank = adapters.max_rank()
    return _Refactorer(adapters, report, rank, energy, svd, oversample, niter, seed)


def ram_merge_adapters(
    peft_model: Any,
    adapters: Sequence[str] | None = None,
    new_adapter: str = "merged",
    method: str = "ram_plus",
    *,
    rank: int | None = None,
    energy: float | None = None,
    svd: Literal["auto", "exact", "randomized"] = "auto",
    oversample: int | None = None,
    niter: int = 4,
    seed: int = 0,
    sparsify: Any = "auto",
    into_base: bool = False,
    inplace: bool = False,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    warn_dense: bool = True,
    return_info: bool = False,
    **options: Any,
) -> Any:
    """Merge LoRA ``adapters`` (default: all) of a live ``PeftModel`` in ΔW space with ``method`` (any method
    of the registry; ``options`` go to its config: ``r``/``alpha``/``rho_scope`` of RAM+, ``weights``,
    ``density``, ...).

    For each target module ΔW_t = s_t · B_t A_t with that adapter's exact scaling (the layer's own
    ``scaling``: rsLoRA, ``rank_pattern``, ``alpha_pattern``); a module an adapter does not target is ΔW = 0
    for it. ``sparsify``: the activity rule for dense ΔW — ``"auto"`` (:data:`RECOMMENDED_SPARSIFY` for the
    RAM family, none for other methods), ``None`` (the paper's |Δ| > eps; warns on dense deltas),
    :class:`TopK`, :class:`RelativeThreshold`, ``"topk"``, ``("topk", 0.1)``, ``("relative", 1.0)``.

    Default: ΔW* is re-factored (:func:`refactor`; ``rank`` defaults to the largest input rank, ``energy``
    picks a rank per module) into a new adapter ``new_adapter`` on ``peft_model`` (not activated: call
    ``peft_model.set_adapter``; saved by ``save_pretrained``), and ``peft_model`` is returned.
    ``into_base=True``: ΔW* is folded into the base weights of a copy of the model without any adapter,
    returned as a plain model on the model's device; with ``inplace=True`` into ``peft_model``'s own base,
    whose adapters are then removed (``unload``) — the returned model is that base.
    ``return_info=True`` returns ``(result, AdapterMergeReport)``.
    """
    t0 = time.perf_counter()
    _check_options(rank, energy, svd, inplace, into_base)
    adapter_set = _read_live(peft_model, adapters)
    prep = _prepare(adapter_set, method, options, sparsify)
    report = AdapterMergeReport(adapter_set.names, "base weights" if into_base else f"adapter {new_adapter!r}")
    _, root = _tuner(peft_model)
    with torch.no_grad():
        if into_base:
            result = _live_into_base(peft_model, root, adapter_set, prep, inplace, chunk_numel, report, warn_dense)
        else:
            if new_adapter in peft_model.peft_config:
                raise ConfigError(f"the model already has an adapter named {new_adapter!r}")
            refactorer = _refactorer(adapter_set, report, rank, energy, svd, oversample, niter, seed)
            info = _merge_in_delta_space(adapter_set, prep, refactorer, device=None, chunk_numel=chunk_numel)
            report.merge_seconds = info.seconds
            _add_live_adapter(peft_model, root, adapter_set, new_adapter, refactorer.factors)
            result = peft_model
            _finish_report(prep, info, report, warn_dense)
    report.seconds = time.perf_counter() - t0
    return (result, report) if return_info else result


def _add_live_adapter(peft_model: Any, root: nn.Module, adapters: _AdapterSet, new_adapter: str,
                      factors: Mapping[str, Refactored]) -> None:
    from peft import LoraConfig

    first = adapters.configs[adapters.names[0]]
    fan_in_fan_out = {adapters.module(m).transpose for m in factors if adapters.module(m).kind == "linear"}
    if len(fan_in_fan_out) > 1:
        raise UnsupportedAdapterError("the adapters target both fan_in_fan_out and regular linear layers; one "
                                      "LoRA config cannot hold both")
    config = LoraConfig(
        **_new_config_fields(factors),
        fan_in_fan_out=bool(fan_in_fan_out and fan_in_fan_out.pop()),
        lora_dropout=getattr(first, "lora_dropout", 0.0),
        bias="none",
        task_type=getattr(first, "task_type", None),
        base_model_name_or_path=getattr(first, "base_model_name_or_path", None),
        revision=getattr(first, "revision", None),
        inference_mode=getattr(first, "inference_mode", False),
    )
    peft_model.add_adapter(new_adapter, config)
    for module_name, out in factors.items():
        layer = root.get_submodule(module_name)
        scaling = float(layer.scaling[new_adapter])
        if adapters.module(module_name).kind == "embedding":
            a_param, b_param = layer.lora_embedding_A[new_adapter], layer.lora_embedding_B[new_adapter]
        else:
            a_param, b_param = layer.lora_A[new_adapter].weight, layer.lora_B[new_adapter].weight
        if tuple(a_param.shape) != tuple(out.A.shape) or tuple(b_param.shape) != tuple(out.B.shape):
            raise AssertionError(  # pragma: no cover - a change of PEFT's contract
                f"{module_name}: new adapter shapes {tuple(a_param.shape)}/{tuple(b_param.shape)} != "
                f"{tuple(out.A.shape)}/{tuple(out.B.shape)}"
            )
        a_param.data.copy_(out.A.to(a_param.device))
        b_param.data.copy_((out.B / scaling).to(b_param.device))


def _live_into_base(peft_model: Any, root: nn.Module, adapters: _AdapterSet, prep: _Prepared, inplace: bool,
                    chunk_numel: int, report: "AdapterMergeReport", warn_dense: bool) -> nn.Module:
    for module_name in adapters.order:
        layer = root.get_submodule(module_name)
        if getattr(layer, "merged_adapters", None):
            raise ConfigError(
                f"module {module_name!r} has adapters {layer.merged_adapters} merged into its base weight; "
                "unmerge them (peft_model.unmerge_adapter()) before into_base=True"
            )
    # The factors are read from the source model, so the copy may drop its adapters before the merge.
    plain = (peft_model if inplace else copy.deepcopy(peft_model)).unload()
    result, info = _merge_into_base(plain, prep, inplace=True, out=None, device=None, dtype=None,
                                    max_shard_bytes=0, chunk_numel=chunk_numel)
    report.merge_seconds = info.seconds
    _finish_report(prep, info, report, warn_dense)
    return result


# ----------------------------------------------------------------------------------------------- from disk


def ram_merge_adapter_files(
    adapters: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike],
    out: str | os.PathLike | None = None,
    method: str = "ram_plus",
    *,
    base: Any = None,
    into_base: bool = False,
    inplace: bool = False,
    rank: int | None = None,
    energy: float | None = None,
    svd: Literal["auto", "exact", "randomized"] = "auto",
    oversample: int | None = None,
    niter: int = 4,
    seed: int = 0,
    sparsify: Any = "auto",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 * 2**30,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    warn_dense: bool = True,
    return_info: bool = False,
    **options: Any,
) -> Any:
    """Merge PEFT LoRA adapter folders (``adapter_model.safetensors`` + ``adapter_config.json``) without a live
    model: the same ΔW-space merge as :func:`ram_merge_adapters` (same options).

    ``adapters``: a list of folders (adapters named after their folders) or a mapping name → folder.
    Default: ΔW* is re-factored into a new adapter folder ``out`` (loadable with ``PeftModel.from_pretrained``;
    the first adapter's config with the new r/alpha/patterns/targets; factors in the inputs' dtype or
    ``dtype``; written to a temporary name and renamed) and its path is returned. No base is needed.
    ``into_base=True``: ΔW* is folded into ``base`` — an ``nn.Module`` (a new one; the base itself with
    ``inplace=True``), a state dict, a ``.safetensors`` file or a Hugging Face folder — through
    :func:`ram_live.merge`, so the result is what ``merge`` returns for that base (with ``out=``, safetensors
    written atomically, sharded at ``max_shard_bytes``, in ``dtype``). The base's key of module ``m`` is
    ``m + ".weight"`` (PEFT's ``base_model.model.`` prefix stripped).
    """
    t0 = time.perf_counter()
    _check_options(rank, energy, svd, inplace, into_base)
    dev = torch.device(device) if device is not None else None
    adapter_set, _ = _read_folders(adapters, dev or "cpu")
    prep = _prepare(adapter_set, method, options, sparsify)
    report = AdapterMergeReport(adapter_set.names, "base weights" if into_base else f"adapter folder {out}")
    with torch.no_grad():
        if into_base:
            if base is None:
                raise ConfigError("into_base=True needs base= (the model the adapters were trained on)")
            _check_base(adapter_set, base)
            result, info = _merge_into_base(base, prep, inplace=inplace, out=out, device=dev, dtype=dtype,
                                            max_shard_bytes=max_shard_bytes, chunk_numel=chunk_numel)
        else:
            if out is None:
                raise ConfigError("pass out= (the folder to write the merged adapter to), or into_base=True")
            if base is not None:
                raise ConfigError("base= is used with into_base=True only (a merged adapter needs no base)")
            _check_out(Path(out))
            refactorer = _refactorer(adapter_set, report, rank, energy, svd, oversample, niter, seed)
            info = _merge_in_delta_space(adapter_set, prep, refactorer, device=dev, chunk_numel=chunk_numel)
            result = _write_adapter_folder(Path(out), adapter_set, refactorer.factors, dtype)
        _finish_report(prep, info, report, warn_dense)
    report.seconds = time.perf_counter() - t0
    return (result, report) if return_info else result


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"output folder {out} exists and is not empty")


def _check_base(adapters: _AdapterSet, base: Any) -> None:
    source = as_source(base, "base")
    keys = set(source.keys())
    for m in adapters.order:
        key = _weight_key(m)
        owner = adapters.targeting(m)[0]
        if key not in keys:
            raise InputMismatchError(
                f"adapter {owner!r} targets module {m!r} but the base has no tensor {key!r} (another architecture?)",
                key=key, agent=owner,
            )
        expected = adapters.module(m).weight_shape
        if tuple(source.spec(key).shape) != tuple(expected):
            raise InputMismatchError(
                f"module {m!r}: the base's {key!r} has shape {list(source.spec(key).shape)}, adapter {owner!r}'s "
                f"ΔW {list(expected)}", key=key, agent=owner,
            )
    for adapter, saved in adapters.saved_weights.items():
        for key, tensor in saved.items():
            if key not in keys or tuple(source.spec(key).shape) != tuple(tensor.shape) or not torch.equal(
                    source.get(key).to(device=tensor.device, dtype=tensor.dtype), tensor):
                raise UnsupportedAdapterError(
                    f"adapter {adapter!r} stores its own {key!r} (PEFT's save_embedding_layers), which differs from "
                    "the base's: a resized or retrained embedding is not a LoRA delta and cannot be merged",
                    adapter=adapter, module=key,
                )


def _write_adapter_folder(out: Path, adapters: _AdapterSet, factors: Mapping[str, Refactored],
                          dtype: torch.dtype | None) -> Path:
    from safetensors.torch import save_file

    _check_out(out)
    if dtype is None:
        dtypes = {f.A.dtype for per in adapters.factors.values() for f in per.values()}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    tensors: dict[str, Tensor] = {}
    for module, f in factors.items():
        if adapters.module(module).kind == "linear":
            a_key, b_key = "lora_A.weight", "lora_B.weight"
        else:
            a_key, b_key = "lora_embedding_A", "lora_embedding_B"
        tensors[f"{_PREFIX}{module}.{a_key}"] = f.A.to(device="cpu", dtype=dtype).contiguous()
        tensors[f"{_PREFIX}{module}.{b_key}"] = f.B.to(device="cpu", dtype=dtype).contiguous()
    config = dict(adapters.configs[adapters.names[0]])
    config.update(_new_config_fields(factors))
    fan_in_fan_out = {adapters.module(m).transpose for m in factors if adapters.module(m).kind == "linear"}
    if len(fan_in_fan_out) > 1:
        raise UnsupportedAdapterError("the adapters target both fan_in_fan_out and regular linear layers; one "
                                      "LoRA config cannot hold both")
    config["fan_in_fan_out"] = bool(fan_in_fan_out and fan_in_fan_out.pop())
    config.update(peft_type="LORA", use_dora=False, lora_bias=False, bias="none", init_lora_weights=True)
    for key in ("modules_to_save", "layers_to_transform", "layers_pattern", "exclude_modules", "target_parameters",
                "trainable_token_indices"):
        if key in config:
            config[key] = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
