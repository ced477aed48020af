"""A search's record on disk: the JSON that :func:`~ram_live.training.search.record_of` makes, written atomically
under the store or next to a saved generalist, and read back as the chosen merge options.

>>> options = load_choice("runs/ram/_search/coder/step_200.json")                   # doctest: +SKIP
>>> merged = ram_live.merge(models, base=base, **options)                           # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from ..errors import ConfigError

__all__ = ["jsonable", "load_choice", "save_next_to", "save_record"]


def save_record(path: str | Path, record: Mapping[str, Any], result: Any = None, *, durable: bool = True) -> Path:
    """Write ``record`` (and ``result.to_dict()`` as ``"history"``) as JSON, atomically."""
    from ..store.files import write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = dict(record)
    if result is not None:
        body["history"] = jsonable(result.to_dict())
    write_json(path, body, durable)
    return path


def save_next_to(generalist: str | Path, record: Mapping[str, Any], *, durable: bool = True) -> Path:
    """Write ``record`` next to a saved generalist: ``<folder>/ram_search.json`` inside a model folder, else
    ``<name>.search.json`` beside a file (``step-200.safetensors`` → ``step-200.search.json``)."""
    generalist = Path(generalist)
    path = generalist / "ram_search.json" if generalist.is_dir() else generalist.with_suffix(".search.json")
    return save_record(path, record, durable=durable)


def load_choice(path: str | Path) -> dict[str, Any]:
    """The chosen options of a saved record: ``merge(models, base=base, **load_choice(path))`` re-makes the merge.

    Example:
        >>> options = load_choice("runs/ram/_search/coder/step_200.json")               # doctest: +SKIP
    """
    try:
        body = json.loads(Path(path).read_text())
        best = body["best"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a search record ({exc})") from None
    return _numbers(best)


def jsonable(x: Any) -> Any:
    """``x`` as JSON values: non-finite floats as the strings 'inf' / '-inf' / 'nan' (:func:`load_choice` reads
    them back), tensors as lists, mappings with str keys, other objects as their ``str``."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, Tensor):
        return jsonable(x.tolist())
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


def _numbers(x: Any) -> Any:
    """:func:`jsonable`'s non-finite strings back to floats."""
    if x in ("inf", "-inf", "nan"):
        return float(x)
    if isinstance(x, dict):
        return {k: _numbers(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_numbers(v) for v in x]
    return x
