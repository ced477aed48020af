"""Values as JSON (:func:`jsonable`): what the merged folders' ``ram_merge.json`` and the CLI's JSON output write."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
from typing import Any

__all__ = ["jsonable"]


def jsonable(value: Any) -> Any:
    """``value`` with dataclasses as dicts (a :class:`~ram_live.RamConfig` as ``{"method": ..., keyword: value}``),
    enums as values, tensors as lists, paths as strings and non-finite
    floats as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (``json.dumps(..., allow_nan=False)`` then works)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if _has_record(value):
        return jsonable(value.record())  # a config's own flat record (RAM's: its flat spelling, every keyword)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # a tensor (or numpy value)
        return jsonable(value.tolist())
    return str(value)


def _has_record(value: Any) -> bool:
    """A dataclass instance with a ``record()`` method taking nothing (:class:`~ram_live.RamConfig`)."""
    record = getattr(value, "record", None)
    if not (dataclasses.is_dataclass(value) and not isinstance(value, type) and callable(record)):
        return False
    return not inspect.signature(record).parameters
