"""Where tensors come from: live modules, state dicts, safetensors files and Hugging Face folders.

A source answers, by name, a tensor's shape and dtype without reading it, and reads one tensor at a time.
Module and state-dict sources hand out views of the live tensors (no copy); file sources memory-map.

>>> src = as_source(model, "coder")                             # doctest: +SKIP
>>> src.keys()[:2], src.spec("lm_head.weight")                  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..errors import InputMismatchError, UnsupportedInputError
from .dtensor import counts_here, is_dtensor, local_tensor
from .st_header import read_regular, strict_json
from .safetensors_io import MappedSafetensors
from .structure import state_tensors
from ..types import DEVICE_OF, DTYPE_OF, SHAPE_OF, TensorSpec

__all__ = [
    "TensorSpec",
    "TensorSource",
    "ModuleSource",
    "StateDictSource",
    "SafetensorsSource",
    "ZerosSource",
    "as_source",
    "check_dtype",
    "shard_name",
    "MERGED_DTYPES",
    "COPIED_DTYPES",
]

#: The floating dtypes merged (in float32, float64 for float64 inputs); other floating dtypes (FP8) are refused.
MERGED_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
#: The dtypes taken from the base as they are (every agent must hold the same values).
COPIED_DTYPES = frozenset(
    {
        torch.bool,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.complex64,
        torch.complex128,
    }
)
_MAX_INDEX = 100_000_000


def check_dtype(source: str, key: str, dtype: torch.dtype) -> None:
    """Refuse a tensor whose dtype ram_live neither merges nor copies (FP8, FP4, quantised, bit and
    complex32 tensors): an :class:`UnsupportedInputError` naming both. Files, state dicts and modules are
    checked alike."""
    if dtype in MERGED_DTYPES or dtype in COPIED_DTYPES:
        return
    if dtype.is_floating_point:
        raise UnsupportedInputError(
            f"{source}: tensor {key!r} is {dtype}, which ram_live does not merge (FP8 weights come with scales "
            "held in other tensors, and task vectors are lost to FP8 rounding): dequantise the checkpoints to "
            "bfloat16 or float32 first"
        )
    raise UnsupportedInputError(
        f"{source}: tensor {key!r} is {dtype}, which ram_live does not merge or copy (dequantise or convert it first)"
    )


def shard_name(index: Path, key: str, name: object) -> str:
    """``name`` if it is a plain file name (no folder part, not ``.``/``..``, no NUL): a shard an index names
    must be an entry of the index's own folder. The entry may be a symlink (Hugging Face caches link to blobs
    elsewhere): what the folder holds is its owner's choice, where the index points is not the index's."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or os.path.basename(name) != name
    ):
        raise UnsupportedInputError(
            f"{index}: tensor {key!r} is mapped to {name!r}, not a file name in the index's folder"
        )
    return name


@runtime_checkable
class TensorSource(Protocol):
    """What the engine needs from an input."""

    name: str

    def keys(self) -> list[str]:
        """Every tensor name, in a stable order."""

    def spec(self, key: str) -> TensorSpec:
        """Shape, dtype, device of ``key`` without reading it."""

    def get(self, key: str) -> Tensor:
        """The tensor ``key`` (a view where possible; never to be written)."""

    def aliases(self) -> dict[str, str]:
        """Tied names: alias → the canonical name it shares storage with."""


class _InMemorySource:
    """A source over tensors already in memory (state dicts and modules). ``get`` returns the stored tensor itself
    (``stores_tensors``): holding what it returned costs no memory (a device merge may group many tensors)."""

    stores_tensors = True

    def __init__(self, name: str, tensors: Mapping[str, Tensor], buffers: frozenset[str] = frozenset()) -> None:
        self.name = name
        values = list(tensors.values())  # checked a property at a time: a model's hundreds of tensors, no loop each
        bad = set(map(DTYPE_OF, values)) - MERGED_DTYPES - COPIED_DTYPES
        if bad or any(device.type == "meta" for device in set(map(DEVICE_OF, values))):
            key, t = next((k, t) for k, t in tensors.items() if t.dtype in bad or t.device.type == "meta")
            if t.device.type == "meta":
                raise UnsupportedInputError(
                    f"{name}: tensor {key!r} is on the meta device (it holds no values): "
                    "load or materialise the weights before merging"
                )
            check_dtype(name, key, t.dtype)  # the first tensor at fault, in the source's order
        # DTensor (e.g. FSDP2) parameters: the engine works on this rank's local shard
        self.sharded = any(map(is_dtensor, values))
        if self.sharded:
            self._uncounted = frozenset(k for k, t in tensors.items() if not counts_here(t))
            self._tensors = {k: local_tensor(t) for k, t in tensors.items()}
        else:
            self._uncounted, self._tensors = frozenset(), dict(tensors)
        self._buffers = buffers
        self._aliases = _find_aliases(self._tensors)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def spec(self, key: str) -> TensorSpec:
        t = self._tensors[key]  # read each time: a module's .half() or .to() swaps its parameters' data in place
        return TensorSpec(tuple(t.shape), t.dtype, t.device, key in self._buffers, key not in self._uncounted)

    def get(self, key: str) -> Tensor:
        return self._tensors[key].detach()

    def aliases(self) -> dict[str, str]:
        return self._aliases


def _find_aliases(tensors: Mapping[str, Tensor]) -> dict[str, str]:
    """Names that are the same tensor as an earlier name (tied weights)."""
    seen: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    values = list(tensors.values())
    # one address, shape, strides and dtype: one tensor (empty ones have no address; meta ones were refused before)
    idents = zip(map(Tensor.data_ptr, values), map(SHAPE_OF, values), map(Tensor.stride, values), map(DTYPE_OF, values))
    for key, numel, ident in zip(tensors, map(Tensor.numel, values), idents):
        if not numel:
            continue
        if ident in seen:
            aliases[key] = seen[ident]
        else:
            seen[ident] = key
    return aliases


class StateDictSource(_InMemorySource):
    """A ``{name: Tensor}`` mapping."""

    def __init__(self, state_dict: Mapping[str, Tensor], name: str = "state_dict") -> None:
        for key, value in state_dict.items():
            if not isinstance(value, Tensor):
                raise UnsupportedInputError(f"{name}: value of {key!r} is a {type(value).__name__}, not a Tensor")
        super().__init__(name, state_dict)


class ModuleSource(_InMemorySource):
    """A live ``nn.Module``: its ``state_dict`` names; buffers are marked (they are taken from the base)."""

    def __init__(self, module: nn.Module, name: str = "module") -> None:
        self.module = module
        # extra state that is not a tensor is left out: a new module gets the base's with the deep copy
        super().__init__(name, *state_tensors(module))


class SafetensorsSource:
    """A ``.safetensors`` file, or a folder with ``model.safetensors`` or a sharded ``*.safetensors.index.json``.

    Files are memory-mapped: ``get`` returns a view of the file's pages (no copy), ``release`` drops them from
    resident memory once the engine is done with a tensor, so merging a folder needs memory for the tensors being
    merged, not for the model.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its path (a search's worker process maps the files itself)."""
        return (SafetensorsSource, (self.path, self.name, str(self.device)))

    def __init__(self, path: str | os.PathLike[str], name: str | None = None, device: str | torch.device = "cpu"):
        self.path = Path(path)
        self.name = name or self.path.name
        self.device = torch.device(device)
        self._files: dict[Path, MappedSafetensors] = {}
        self._where: dict[str, MappedSafetensors] = {}
        for key, file in self._layout(self.path).items():
            if file not in self._files:
                if not file.exists():
                    raise UnsupportedInputError(f"{self.path}: the index names {file.name}, which is missing")
                self._open(file)
            mapped = self._files[file]
            if key not in mapped.entries:
                raise UnsupportedInputError(f"{self.path}: the index puts {key!r} in {file.name}, which lacks it")
            check_dtype(f"{self.name} ({file})", key, mapped.entries[key][0])
            self._where[key] = mapped
        self.fingerprint = tuple(sorted((str(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in self._files))

    def _open(self, file: Path) -> MappedSafetensors:
        if file not in self._files:
            self._files[file] = MappedSafetensors(file)
        return self._files[file]

    def _layout(self, path: Path) -> dict[str, Path]:
        if not path.is_dir():
            if not path.exists():
                raise UnsupportedInputError(f"{path}: no such file or folder")
            return dict.fromkeys(self._open(path).keys(), path)  # refused there unless a regular file
        index = sorted(path.glob("*.safetensors.index.json"))
        if index:
            document = strict_json(read_regular(index[0], _MAX_INDEX), f"{index[0]}: safetensors index")
            weight_map = document.get("weight_map") if isinstance(document, dict) else None
            if not isinstance(weight_map, dict):
                raise UnsupportedInputError(
                    f"{index[0]}: not a safetensors index (its weight_map is not a mapping "
                    "of tensor names to file names)"
                )
            return {k: path / shard_name(index[0], k, v) for k, v in weight_map.items()}
        shards = sorted(path.glob("*.safetensors"))
        if not shards:
            raise UnsupportedInputError(f"{path}: no *.safetensors file or *.safetensors.index.json in folder")
        layout: dict[str, Path] = {}
        for shard in shards:
            layout.update(dict.fromkeys(self._open(shard).keys(), shard))
        return layout

    def keys(self) -> list[str]:
        return list(self._where)

    def spec(self, key: str) -> TensorSpec:
        dtype, shape, _, _ = self._where[key].entries[key]
        return TensorSpec(shape, dtype, self.device)

    def get(self, key: str) -> Tensor:
        t = self._where[key].tensor(key)
        return t if self.device.type == "cpu" else t.to(self.device)

    def release(self, key: str, start: int = 0, stop: int | None = None) -> None:
        """Drop the mapped pages of ``key`` (or of its flat entries ``[start, stop)``) from resident memory."""
        self._where[key].release(key, start, stop)

    releases_ranges = True

    def aliases(self) -> dict[str, str]:
        return {}


class ZerosSource:
    """A base of zeros shaped like ``like`` (for merging task vectors given directly)."""

    def __init__(self, like: TensorSource, name: str = "zeros") -> None:
        self.name = name
        self._like = like

    def keys(self) -> list[str]:
        return self._like.keys()

    def spec(self, key: str) -> TensorSpec:
        s = self._like.spec(key)
        return TensorSpec(s.shape, s.dtype, s.device, False)

    def get(self, key: str) -> Tensor:
        s = self.spec(key)
        return torch.zeros(s.shape, dtype=s.dtype, device=s.device)

    def aliases(self) -> dict[str, str]:
        return {}


class RenamedSource:
    """``source`` under the name the caller gave it (``ram_merge({"a": snap, "b": snap2})`` names the agents by
    the keys, also where two snapshots carry the same agent name); everything else is the source's own."""

    def __init__(self, source: TensorSource, name: str) -> None:
        self._source = source
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._source, attr)


def as_source(obj: Any, name: str) -> TensorSource:
    """Wrap a module, state dict, path, or source as a :class:`TensorSource` named ``name``."""
    if isinstance(obj, nn.Module):
        return ModuleSource(obj, name)
    if isinstance(obj, (str, os.PathLike)):
        from .hub import resolve_model

        return SafetensorsSource(resolve_model(obj, what=name), name)  # a cached Hugging Face id: its folder
    if isinstance(obj, Mapping):
        return StateDictSource(obj, name)
    if isinstance(obj, TensorSource):
        return obj if getattr(obj, "name", None) == name else RenamedSource(obj, name)
    raise UnsupportedInputError(
        f"{name}: cannot merge a {type(obj).__name__}; pass an nn.Module, a state dict, a .safetensors file or a "
        "Hugging Face model folder"
    )


def iter_named(models: Any) -> Iterator[tuple[str, Any]]:
    """(name, model) pairs from a sequence or a mapping name → model."""
    if isinstance(models, Mapping) and (not models or not all(isinstance(v, Tensor) for v in models.values())):
        for name, model in models.items():
            yield str(name), model
        return
    if isinstance(models, (nn.Module, str, os.PathLike, Mapping)):
        raise UnsupportedInputError("models must be a sequence or a mapping name → model, not a single model")
    for i, model in enumerate(models):
        yield f"agent_{i}", model


def check_agent_names(names: list[str]) -> None:
    if len(set(names)) != len(names):
        raise InputMismatchError(f"agent names are not unique: {names}")
