"""ΔW = s · B A from the factors: one adapter's (:func:`lora_deltas`), or per weight key as the engine's
sources and sink."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

import torch
from torch import Tensor

from .. import functional as F
from ..methods import Activity
from ..io.sources import TensorSpec
from .factors import Factor, weight_key
from .folders import read_folder
from .live import active_adapter, read_live
from .sparsify import SparsifyRule


def lora_deltas(
    source: Any, adapter: str | None = None, *, layout: Literal["weight", "lora"] = "weight"
) -> dict[str, Tensor]:
    """Every target module's ΔW = s · B A of one adapter, in float32.

    Args:
        source: a live ``PeftModel`` or a PEFT adapter folder.
        adapter: the adapter's name (default: the model's active one; for a folder, only named in errors).
        layout: ``"weight"``: ΔW in the layout of the module's weight (what PEFT's ``get_delta_weight`` returns
            and ``merge_and_unload`` adds: transposed for ``fan_in_fan_out`` and embedding layers); ``"lora"``:
            B·A's layout [out, in].

    Returns:
        ``{module name: ΔW}``, named as PEFT names modules (relative to the wrapped model, e.g.
        ``model.layers.0.self_attn.q_proj``).

    Raises:
        ConfigError: no ``adapter`` and no single active adapter, or no adapter of that name.
        UnsupportedInputError: a folder without ``adapter_config.json`` or ``adapter_model.safetensors``.
        UnsupportedAdapterError: an adapter that is not plain LoRA (DoRA, ``lora_bias``, conv layers, ...).
        InputMismatchError: a folder's factors disagree with its config.

    >>> deltas = lora_deltas("runs/code"); deltas["model.layers.0.self_attn.q_proj"].shape   # doctest: +SKIP
    torch.Size([4096, 4096])
    """
    if isinstance(source, (str, os.PathLike)):
        factors, _, _, _ = read_folder(Path(source), adapter or Path(source).name)
    else:
        name = adapter if adapter is not None else active_adapter(source)
        factors = read_live(source, [name]).factors[name]
    with torch.no_grad():
        return {module: f.delta(layout=layout) for module, f in factors.items()}


class AdapterDeltas:
    """One adapter's ΔW by weight key (``<module>.weight``, weight layout, float32), sparsified by ``rule``,
    computed on request; counts, per key, the entries ``activity`` marks (the merge's own rule, on ΔW as the
    delta-space merge sees it: :func:`ram_live.functional.delta_active`) and those the sparsifying rule keeps."""

    def __init__(self, name: str, factors: Mapping[str, Factor], rule: SparsifyRule | None, activity: Activity) -> None:
        self.name = name
        self.factors = {weight_key(m): f for m, f in factors.items()}
        self.rule = rule
        self.activity = activity
        self.eps = activity.eps
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
            self.raw_active[key] = F.count_delta_active(delta, self.activity)
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
        """(fraction of entries active by the activity rule, fraction kept by the sparsifying rule) over the
        modules it targets."""
        total = sum(self.numel.values())
        if not total:
            return 0.0, 0.0
        return sum(self.raw_active.values()) / total, sum(self.kept_active.values()) / total


class DeltaSource:
    """A TensorSource of one adapter's ΔW per weight key (zeros where it has no factor)."""

    def __init__(self, deltas: AdapterDeltas, specs: Mapping[str, TensorSpec]) -> None:
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


class ZeroBase(DeltaSource):
    def __init__(self, specs: Mapping[str, TensorSpec]) -> None:
        super().__init__(AdapterDeltas("zero base", {}, None, Activity("abs", 0.0)), specs)


class BasePlusDeltaSource:
    """The model "base + ΔW_t" of one adapter, without materialising it: targeted weights are read as
    float64 ``W + ΔW_t`` (so that the engine's τ_t = (W + ΔW_t) − W is ΔW_t to ~1e-16·|W|, and entries the
    rule dropped are exactly 0), every other tensor is the base's own."""

    def __init__(self, base: Any, deltas: AdapterDeltas) -> None:
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


class CallbackSink:
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
