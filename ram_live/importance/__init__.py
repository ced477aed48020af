"""Importance: per-parameter curvature weights for curvature-aware RAM (docs/curvature.md).

Where importances come from, one module each:

* the optimizer: Adam's second moments ``exp_avg_sq`` (:func:`adam_importance`, :mod:`.optimizer`), already in
  every Adam/AdamW optimizer;
* data: a diagonal empirical Fisher (:func:`empirical_fisher`, :mod:`.fisher`), for agents without optimizer
  state;
* the store: importances stored with a snapshot (``SnapshotWriter.snapshot(..., importance=...)``), kept as 8-bit
  log codes (the codec: :mod:`ram_live.store.importance_codes`) and read back as ``snapshot.importance``;
* a constant per agent (:class:`ConstantImportance`): one weight per agent in the shared mean.

What ``importance=`` of ``merge``/``ram_merge``/``search``/``RAMSchedule`` accepts (:mod:`.sources`, turned into
one ``TensorSource`` per agent by :func:`resolve_importance`) has two states: ``None`` (the default) is plain
RAM, never anything else; a value weighs the agents: ``{agent: importances}`` (a state dict, a ``.safetensors``
file/folder, a ``TensorSource`` such as ``snapshot.importance``, or a number), or :data:`STORED` (``"stored"``):
the importances stored with every agent's store snapshot (each agent must carry them, else a ConfigError naming
the agents without). ``MergeInfo.extra["importance"]`` says which: ``"given"`` or ``"stored"``.

How they weigh RAM's shared region: on an entry that several agents update, τ* becomes the importance-weighted
mean of the active agents' τ (Σ h_t τ_t / Σ h_t; the plain mean where every active agent's importance is 0, so
equal importances give plain RAM's bits); unique entries keep RAM's λ rule. That math is RAM's own, in RAM's
weighted shared mean (:mod:`ram_live.methods.ram`: its reference, accumulators and kernels); only ratios between
agents matter, entry by entry.

>>> imp = {"coder": adam_importance(coder_opt, coder), "tools": adam_importance(tools_opt, tools)}  # doctest: +SKIP
>>> merged = ram_merge({"coder": coder, "tools": tools}, base=base, importance=imp)               # doctest: +SKIP
>>> merged = ram_merge(store.latest_all(), importance="stored")                                  # doctest: +SKIP
"""

from __future__ import annotations

from .fisher import empirical_fisher
from .optimizer import adam_importance
from .sources import STORED, ConstantImportance, importance_sources, resolve_importance, stored_sources

__all__ = [
    "STORED",
    "ConstantImportance",
    "adam_importance",
    "empirical_fisher",
    "importance_sources",
    "resolve_importance",
    "stored_sources",
]
