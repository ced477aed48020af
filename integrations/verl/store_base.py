"""The store's base for a verl run: the base model's folder read, cast to the snapshots' dtype and written into the
store in parts (or, without ``ram.base``, the store's own base checked), and the merged weights' dtype it implies."""

from __future__ import annotations

from pathlib import Path

import torch

from ram_live.errors import ConfigError, RamLiveError
from ram_live.io.sources import SafetensorsSource
from ram_live.store import LocalTensor, SnapshotStore

from .common import DTYPE_OF, VerlIntegrationError
from .pieces import BaseWriter

__all__ = ["base_folder_source", "base_out_dtype", "store_base_fingerprint", "write_store_base"]


def base_folder_source(base_dir: Path | None) -> SafetensorsSource:
    """The base model's folder (``ram.base``) as a safetensors source.

    Args:
        base_dir: the resolved ``ram.base`` folder (None: not set).

    Returns:
        Its weights, named ``"base"``.

    Raises:
        ConfigError: ``base_dir`` is None, or no readable safetensors folder.
    """
    if base_dir is None:
        raise ConfigError("ram.base is not set and the store has no base yet: pass the base model's folder")
    try:
        return SafetensorsSource(base_dir, "base")
    except RamLiveError as exc:
        raise ConfigError(f"ram.base={str(base_dir)!r}: {exc}") from None


def store_base_fingerprint(store: SnapshotStore, dtype: torch.dtype, weights: str) -> str:
    """The fingerprint of the store's own base (no ``ram.base``), once its floating-point dtype is ``dtype``.

    Args:
        store: the store, holding a base.
        dtype: the snapshots' dtype.
        weights: ``ram.weights`` (named in the error).

    Returns:
        The base's fingerprint.

    Raises:
        VerlIntegrationError: the store's base holds floating-point tensors of another dtype than ``dtype``.
    """
    base = store.base_source()
    dtypes = {base.spec(k).dtype for k in base.keys() if base.spec(k).dtype.is_floating_point}
    if dtypes != {dtype}:
        raise VerlIntegrationError(
            f"{store.root}: the store's base is {sorted(map(str, dtypes))}, the "
            f"snapshots would be {dtype} (ram.weights={weights!r})"
        )
    return base.fingerprint


def write_store_base(store: SnapshotStore, src: SafetensorsSource, dtype: torch.dtype, max_part_bytes: int) -> str:
    """Set the store's base (or check it is the same): ``src``'s tensors, the floating-point ones cast to ``dtype``,
    written in parts of about ``max_part_bytes``.

    Args:
        store: the store.
        src: the base model's weights (:func:`base_folder_source`).
        dtype: the snapshots' dtype.
        max_part_bytes: ``ram.max_part_bytes``.

    Returns:
        The fingerprint of the store's base.

    Raises:
        BaseMismatchError: the store's base is not ``src`` cast to ``dtype``.

    Example:
        >>> write_store_base(store, base_folder_source(Path("Qwen2.5-0.5B")), torch.float32, 2**30)  # doctest: +SKIP
    """
    specs = {}
    for k in src.keys():
        s = src.spec(k)
        specs[k] = (tuple(s.shape), dtype if s.dtype.is_floating_point else s.dtype)
    writer = BaseWriter(store, specs)
    group: dict[str, LocalTensor] = {}
    size = 0
    for k in src.keys():
        t = src.get(k)
        t = t.to(specs[k][1]) if t.dtype != specs[k][1] else t
        group[k] = LocalTensor(t, tuple(t.shape), (0,) * t.dim(), True)
        size += t.numel() * t.element_size()
        if size >= max_part_bytes:
            writer.add(group)
            group, size = {}, 0
    if group or not writer.parts:
        writer.add(group)
    return writer.finish()


def base_out_dtype(merged_dtype: str, base_dir: Path | None) -> torch.dtype | None:
    """The merged weights' dtype: ``ram.merged_dtype``'s; with ``"auto"`` the base folder's first floating-point
    dtype, or None (the inputs') without ``ram.base``.

    Raises:
        ConfigError: ``"auto"`` and ``ram.base`` is no readable safetensors folder.
    """
    if merged_dtype != "auto":
        return DTYPE_OF[merged_dtype]
    if base_dir is not None:
        src = base_folder_source(base_dir)
        for k in src.keys():
            if src.spec(k).dtype.is_floating_point:
                return src.spec(k).dtype
    return None
