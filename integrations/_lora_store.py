"""A LoRA agent's snapshots against its store: the metadata kept with every snapshot (``extra["peft"]``: the
adapter's name, scalings, config and base-model fingerprint), the checks that every agent of one store trains an
adapter of the same target modules, ranks and dtypes on the same base model, and the agents' adapters read back
as an :class:`~ram_live.peft.factors.AdapterSet` for the ΔW-space merge of :class:`._peft_agent.LoraSchedule`.

>>> meta = snapshot_meta("default", fp, factors, model.peft_config["default"])       # doctest: +SKIP
>>> check_store(store, "coder", live, fp)                                           # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..errors import ConfigError, InputMismatchError
from ..peft.factors import AdapterSet, Factor
from ..store import BaseMismatchError, LocalModel

__all__ = ["EXTRA_KEY", "adapter_set", "base_state", "check_store", "meta_of", "snapshot_meta"]

#: the key of a LoRA snapshot's metadata in its manifest's ``extra``
EXTRA_KEY = "peft"
#: a LoRA layer's own tensors in a PeftModel's state dict (dropped from the base model's)
_LORA_TENSOR = re.compile(r"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.")


def _json_config(config: Any) -> dict[str, Any]:
    """An adapter's ``LoraConfig`` as JSON values (sets as sorted lists, enums as their values)."""

    def default(value: Any) -> Any:
        if isinstance(value, (set, frozenset)):
            return sorted(value)
        return getattr(value, "value", str(value))

    return {**json.loads(json.dumps(config.to_dict(), default=default)), "inference_mode": True}  # as PEFT saves it


def snapshot_meta(adapter: str, fingerprint: str, factors: Mapping[str, Factor], config: Any) -> dict[str, Any]:
    """What a LoRA snapshot keeps in ``extra["peft"]``: the adapter's name, its base model's ``fingerprint``, each
    module's scaling, kind and layout, and its ``LoraConfig`` as JSON (``adapter_config.json`` of a saved merge)."""
    return {
        "kind": "lora",
        "adapter": adapter,
        "base_fingerprint": fingerprint,
        "modules": {m: {"scaling": f.scaling, "kind": f.kind, "transpose": f.transpose} for m, f in factors.items()},
        "config": _json_config(config),
    }


def base_state(root: Any) -> dict[str, Tensor]:
    """The base model's tensors under its own names (LoRA tensors dropped, ``.base_layer`` removed)."""
    return {
        k.replace(".base_layer.", "."): v
        for k, v in root.state_dict(keep_vars=True).items()
        if not _LORA_TENSOR.search(k)
    }


def meta_of(store: Any, name: str, manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """Agent ``name``'s LoRA metadata from a snapshot's ``manifest`` (a :class:`ConfigError` if it is none)."""
    meta = (manifest.get("extra") or {}).get(EXTRA_KEY)
    if not isinstance(meta, Mapping) or meta.get("kind") != "lora":
        raise ConfigError(f"agent {name!r}'s snapshots in {store.root} are not LoRA adapter snapshots")
    return meta


def check_store(store: Any, agent: str, live: Mapping[str, Tensor], fingerprint: str | None) -> None:
    """``agent``'s live factors (by store key) against the store: target modules, ranks and dtypes against its
    base (:class:`InputMismatchError` naming the module), its base model (``fingerprint``) against the other
    agents' (:class:`BaseMismatchError`); a store of full-model snapshots is a :class:`ConfigError`."""
    who = f"agent {agent!r}"
    others = [a for a in store.agents() if a != agent]
    theirs = f"the store's adapters (agents {', '.join(map(repr, others))})" if others else "the store's adapters"
    if store.has_base():
        src = store.base_source()
        keys = set(src.keys())
        if not any(k.endswith(".lora_A") for k in keys):
            raise ConfigError(f"{who}: {store.root} holds full-model snapshots; give the LoRA runs their own store")
        for key in sorted(keys ^ set(live)):
            module = key.rsplit(".", 1)[0]
            does, do = ("targets", "do not") if key in live else ("does not target", "do")
            raise InputMismatchError(
                f"{who} {does} module {module!r}, which {theirs} {do}: every agent of a "
                "store must target the same modules",
                key=module,
                agent=agent,
            )
        for key in sorted(live):
            spec, t, module = src.spec(key), live[key], key.rsplit(".", 1)[0]
            mine, there = tuple(t.shape), tuple(spec.shape)
            if mine == there and spec.dtype == t.dtype:
                continue
            r, io = (0, 1) if key.endswith("_A") else (1, 0)  # A: [r, in], B: [out, r]
            r_mine, r_there = mine[r], there[r]
            if len(mine) == len(there) == 2 and r_mine != r_there and mine[io] == there[io]:
                what = f"has rank {r_mine}, {theirs} rank {r_there} (one rank per module in a store)"
            elif mine != there:
                what = f"has factors of shape {list(mine)}, {theirs} {list(there)} (another base model?)"
            else:
                what = f"has {t.dtype} factors, {theirs} {spec.dtype}"
            raise InputMismatchError(f"{who}: module {module!r} {what}", key=module, agent=agent)
    for name in others:
        meta = meta_of(store, name, store.latest(name).manifest)
        if meta["base_fingerprint"] != fingerprint:
            raise BaseMismatchError(
                f"{who}'s adapter is trained on another base model ({fingerprint})"
                f" than agent {name!r}'s ({meta['base_fingerprint']})"
            )


def adapter_set(
    store: Any,
    picks: Mapping[str, int],
    sources: Mapping[str, Any],
    own: Mapping[str, Any],
    fingerprint: str | None,
    modules: list[str],
) -> AdapterSet:
    """Every picked agent's factors (the store's, or this run's live ones, whose metadata is ``own``) with the
    scalings they were trained with; a base model other than ``fingerprint`` is a :class:`BaseMismatchError`
    naming the agent."""
    factors: dict[str, dict[str, Factor]] = {}
    configs: dict[str, Any] = {}
    for name, src in sources.items():
        meta = own if isinstance(src, LocalModel) else meta_of(store, name, src.manifest)
        if meta["base_fingerprint"] != fingerprint:
            raise BaseMismatchError(
                f"agent {name!r}'s adapter (step {picks[name]}) is trained on another base "
                f"model ({meta['base_fingerprint']}) than this run's ({fingerprint})"
            )
        factors[name] = {
            m: Factor(
                src.get(f"{m}.lora_A"),
                src.get(f"{m}.lora_B"),
                float(info["scaling"]),
                info["kind"],
                bool(info["transpose"]),
            )
            for m, info in sorted(meta["modules"].items())
        }
        configs[name] = meta["config"]
    return AdapterSet(tuple(sources), factors, modules, configs)
