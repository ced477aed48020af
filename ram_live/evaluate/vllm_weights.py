"""A candidate's weights as vLLM takes them: ``(name, tensor)`` pairs in the Hugging Face checkpoint's names, checked
against the engine's model before any is written (a candidate that lacks a tensor would leave the previous
candidate's in the engine; one with a key or shape of another model would fail halfway through the swap).

A candidate is what an evaluation is handed: a module (a ``generate``-capable model, or one holding one), a state
dict, a Hugging Face folder or a cached model id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError, EvaluationError
from ..io.hub import resolve_model

__all__ = ["Layout", "candidate_weights"]


class Layout:
    """The engine model's checkpoint: each tensor's shape, from the folder's safetensors headers (no data read).

    Args:
        folder: the Hugging Face folder the engine was built from.

    Raises:
        ConfigError: no such folder, no ``config.json`` or no safetensors weights in it."""

    def __init__(self, folder: str | os.PathLike) -> None:
        from ..io.sources import SafetensorsSource

        self.folder = Path(folder)
        if not (self.folder / "config.json").is_file():
            raise ConfigError(f"VLLMGenerate: {self.folder} is not a Hugging Face model folder (no config.json)")
        try:
            source = SafetensorsSource(self.folder)
        except Exception as exc:  # UnsupportedInputError: no *.safetensors, a damaged index or header
            raise ConfigError(f"VLLMGenerate: cannot read the weights of {self.folder}: {exc}") from None
        self.shapes = {k: tuple(source.spec(k).shape) for k in source.keys()}
        #: keys a module of this model has and its checkpoint need not (the output layer of tied embeddings)
        self.tied = {"lm_head.weight"} if _tied_embeddings(self.folder) else set()


def _tied_embeddings(folder: Path) -> bool:
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))


def _named(merged: Any) -> tuple[str, Mapping[str, Any]]:
    """What the candidate is called in an error, and its tensors (a folder's memory-mapped, read as they go)."""
    if isinstance(merged, (str, os.PathLike)):
        from ..io.sources import SafetensorsSource

        if not os.fspath(merged):
            raise EvaluationError("VLLMGenerate: cannot evaluate '' (an empty path); pass a Hugging Face folder")
        folder = Path(resolve_model(merged, what="VLLMGenerate: the evaluated model"))
        try:
            source = SafetensorsSource(folder)
        except Exception as exc:
            raise EvaluationError(f"VLLMGenerate: cannot read the candidate folder {folder}: {exc}") from None
        return f"the candidate folder {folder}", _Lazy(source)
    if isinstance(merged, Mapping):
        return "the candidate state dict", merged
    if hasattr(merged, "state_dict") and not isinstance(merged, type):
        from .models import generator_of

        model = generator_of(merged)
        return f"the candidate {type(model).__name__}", model.state_dict()
    raise EvaluationError(
        f"VLLMGenerate: cannot evaluate a {type(merged).__name__}; a module, a state dict, a Hugging Face folder "
        "or a cached model id is expected"
    )


class _Lazy(Mapping):
    """A folder's tensors by name, each read when asked for."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __getitem__(self, key: str) -> Any:
        return self.source.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.source.keys())

    def __len__(self) -> int:
        return len(self.source.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self.source.spec(key).shape)


def candidate_weights(merged: Any, layout: Layout) -> Iterator[tuple[str, Any]]:
    """``merged``'s tensors as ``(name, tensor)`` pairs for vLLM's reload, after checking them against ``layout``.

    A key the checkpoint lacks is allowed only when its tensor is one of the candidate's other tensors, or it is
    the output layer of a model with ``tie_word_embeddings`` (tied weights, which a checkpoint does not hold and
    vLLM does not load); it is not sent.

    Args:
        merged: the candidate (a module, a state dict, a folder or a cached id).
        layout: the engine model's checkpoint.

    Returns:
        An iterator over the pairs (a folder's tensors are read as it goes).

    Raises:
        EvaluationError: naming the candidate: keys the engine's model lacks, keys of the model the candidate
            lacks, a tensor of another shape, a tensor on the meta device, or a candidate of another kind."""
    what, tensors = _named(merged)
    own = layout.shapes
    if isinstance(tensors, _Lazy):
        shapes = {k: tensors.shape(k) for k in tensors}
        tied: set[str] = set()
    else:
        shapes = {k: tuple(getattr(v, "shape", ())) for k, v in tensors.items()}
        pointers = {_pointer(tensors[k]) for k in tensors if k in own}
        tied = {k for k in tensors if k not in own and _pointer(tensors[k]) in pointers}
    unexpected = sorted(set(shapes) - set(own) - tied - layout.tied)
    if unexpected:
        raise EvaluationError(
            f"VLLMGenerate: {what} has keys the engine's model ({layout.folder}) lacks: {unexpected[:5]}"
            + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
            + "; every candidate must have the base's structure"
        )
    missing = sorted(set(own) - set(shapes))
    if missing:
        raise EvaluationError(
            f"VLLMGenerate: {what} lacks the engine model's keys {missing[:5]}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            + " (the engine would keep the previous candidate's tensors there)"
        )
    wrong = next((k for k in sorted(own) if shapes[k] != own[k]), None)
    if wrong is not None:
        raise EvaluationError(
            f"VLLMGenerate: {what} holds {wrong!r} of shape {list(shapes[wrong])}; the engine's model "
            f"({layout.folder}) has {list(own[wrong])}"
        )
    if not isinstance(tensors, _Lazy):
        meta = next((k for k in own if getattr(tensors[k], "is_meta", False)), None)
        if meta is not None:
            raise EvaluationError(f"VLLMGenerate: {what} holds {meta!r} on the meta device (a tensor without data)")
    return ((k, _detached(tensors[k])) for k in own)


def _pointer(t: Any) -> Any:
    return t.data_ptr() if hasattr(t, "data_ptr") and not getattr(t, "is_meta", False) else id(t)


def _detached(t: Any) -> Any:
    return t.detach() if hasattr(t, "detach") else t
