"""What a merged folder holds besides its weights: the base's config, generation config and tokenizer files, so
that ``AutoModelForCausalLM.from_pretrained(folder)`` loads it, and ``ram_merge.json``, which says what was merged.

Where the base's files come from:

* a folder, or a cached ``org/name[@revision]`` id: its top-level non-weight files
  (:func:`~ram_live.io.side_files.side_files`: regular files inside the folder, a link out of it refused);
* a live transformers model: ``model.config`` and ``model.generation_config`` as ``save_pretrained`` writes them
  (``architectures`` and ``dtype`` set), and the other files of the folder its ``name_or_path`` names, when that is
  a local folder or a cached id (the tokenizer it was loaded with);
* a snapshot store: the files the store kept of its base when it was made from a live model or a folder
  (``_base/model/``, written by :func:`save_store_files`).

``ram_merge.json`` (format ``ram_live.merge``, version 1) holds the library's version, the method and its options,
the stored dtype, and for the base and each agent what it was: a safetensors file or folder (its path, the id it
was given as, each weight file's ``bytes`` and ``crc32``: the CRC-32 that ``zlib.crc32`` gives of the whole file),
a store snapshot (store, agent, step, its data files with the CRC-32s the store keeps) or the store's base
(fingerprint and files), an in-memory module or state dict (``tensors_crc32``: :func:`tensors_crc32`), or another
source (its kind only). ``importance`` (``"given"`` or ``"stored"``), λ and ρ are added where the merge has them;
``merge(agents, base, method=doc["method"], **doc["options"])`` repeats the merge.

>>> sorted(module_files(model))                                                          # doctest: +SKIP
['config.json', 'generation_config.json']
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .hub import resolve_model
from .outputs import rename_noreplace, temp_folder
from .side_files import read_side_file, side_files

__all__ = [
    "STORE_FILES",
    "BaseFiles",
    "base_files",
    "file_crc32",
    "module_files",
    "provenance",
    "save_store_files",
    "store_files_of",
    "tensors_crc32",
]

#: The folder, inside a store's ``_base``, that keeps the base's config, generation config and tokenizer files.
STORE_FILES = "model"
_WINDOW = 1 << 30  # bytes of a file mapped at a time for its CRC
_KINDS = {"ZerosSource": "zeros", "BasePlusDeltaSource": "base + LoRA adapter"}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _with_dtype(config: dict[str, Any], dtype: torch.dtype | None) -> dict[str, Any]:
    """``config`` saying that the weights are stored in ``dtype`` (transformers 5 reads ``dtype``, 4 ``torch_dtype``:
    the keys it has, else ``dtype``)."""
    if dtype is not None:
        keys = [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]
        for key in keys:
            config[key] = _dtype_name(dtype)
    return config


def _json_bytes(data: Any, sort_keys: bool = True) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=sort_keys, allow_nan=False) + "\n").encode()


def _origin(module: nn.Module) -> Path | None:
    """The local folder a transformers model was loaded from (``name_or_path``: a folder or a cached id), if any."""
    config = getattr(module, "config", None)
    origin = getattr(module, "name_or_path", None) or getattr(config, "_name_or_path", None)
    if not isinstance(origin, str) or not origin:
        return None
    try:
        folder = Path(resolve_model(origin, what="base"))
    except ConfigError:  # an id the cache does not hold: the model's own files are still written
        return None
    return folder if folder.is_dir() else None


def module_files(module: nn.Module, dtype: torch.dtype | None = None) -> dict[str, bytes]:
    """``config.json`` and ``generation_config.json`` of a transformers model, as its ``save_pretrained`` writes
    them (``architectures`` = its class, ``dtype`` = what the weights are stored in); empty for a module without a
    transformers config. The model is not changed.

    Args:
        module: the base model.
        dtype: the stored dtype (default: the module's first floating parameter's).

    Returns:
        File name → content.

    Raises:
        ConfigError: the model's config (or generation config) cannot be written as JSON.
    """
    config = getattr(module, "config", None)
    if not callable(getattr(config, "to_json_string", None)):
        return {}
    if dtype is None:
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
    try:
        data = json.loads(config.to_json_string(use_diff=True))
        data["architectures"] = [type(module).__name__.removeprefix("FSDP")]
        files = {"config.json": _json_bytes(_with_dtype(data, dtype))}
        generation = getattr(module, "generation_config", None)
        can_generate = getattr(module, "can_generate", None)
        if callable(getattr(generation, "to_json_string", None)) and (not callable(can_generate) or can_generate()):
            files["generation_config.json"] = generation.to_json_string(use_diff=True).encode()
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"base: cannot write the config of the {type(module).__name__} as JSON: {exc}") from None
    return files


def store_files_of(obj: Any) -> Callable[[], dict[str, bytes]]:
    """What a snapshot store keeps of the base ``obj`` (read when called): a live transformers model's
    :func:`module_files` over the side files of the folder it was loaded from, or a base folder's side files."""

    def files() -> dict[str, bytes]:
        if isinstance(obj, nn.Module):
            folder = _origin(obj)
            own = module_files(obj)
            if not own:
                return {}
        elif isinstance(obj, (str, os.PathLike)):
            folder, own = Path(resolve_model(obj, what="base")), {}
        else:
            return {}
        return {**{name: read_side_file(real) for name, real in side_files(folder, skip=own).items()}, **own}

    return files


def save_store_files(base_dir: Path, files: Mapping[str, bytes]) -> None:
    """Keep ``files`` (:func:`store_files_of`) in the store's ``base_dir/model``: written to a temporary folder and
    renamed; nothing when there are none or the folder exists."""
    target = base_dir / STORE_FILES
    if not files or os.path.lexists(target):
        return
    tmp = temp_folder(base_dir, STORE_FILES)
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        rename_noreplace(tmp, target)
    except FileExistsError:
        pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class BaseFiles:
    """What a merged folder takes from its base: the folder whose side files are copied (``copy_from``), the files
    written over them (``files``: a live model's config, a config whose ``dtype`` was changed) and how the base is
    described in ``ram_merge.json`` (``about``)."""

    def __init__(self, copy_from: Path | None, files: dict[str, bytes], about: dict[str, Any]) -> None:
        self.copy_from = copy_from
        self.files = files
        self.about = about


def base_files(base: Any, base_src: Any, dtype: torch.dtype | None) -> BaseFiles:
    """The base's files for a merged folder (see the module's docstring), read before the merge starts.

    Args:
        base: the ``base=`` given (None where the agents carry it).
        base_src: the base as the merge reads it.
        dtype: the ``dtype=`` asked for the stored weights, or None.

    Returns:
        A :class:`BaseFiles`.

    Raises:
        ConfigError: a live model's config cannot be written as JSON; an id the cache does not hold; a side file
            that links outside the base folder; with ``dtype``, a ``config.json`` that holds NaN or Infinity or
            is nested too deeply.
    """
    if isinstance(base, nn.Module):
        own = module_files(base, dtype)
        origin = _origin(base) if own else None
        about = {"kind": "module", "class": type(base).__name__}
        if origin is not None:
            about["files_from"] = str(origin)
            side_files(origin, skip=own)  # a link out of the folder is refused before anything is written
        return BaseFiles(origin, own, about)
    folder = None
    if isinstance(base, (str, os.PathLike)):
        folder = Path(resolve_model(base, what="base"))
    elif base is None and hasattr(base_src, "fingerprint") and isinstance(getattr(base_src, "folder", None), Path):
        folder = base_src.folder / STORE_FILES  # the store's base: what the store kept of it
    folder = folder if folder is not None and folder.is_dir() else None
    found = side_files(folder)  # a ConfigError for a link out of the folder, before anything is written
    files: dict[str, bytes] = {}
    if dtype is not None and "config.json" in found:
        data = _read_config(found["config.json"], folder / "config.json")
        if isinstance(data, dict):
            files["config.json"] = _config_bytes(_with_dtype(data, dtype), folder / "config.json")
    return BaseFiles(folder, files, {})


def _read_config(real: Path, shown: Path) -> Any:
    """The base's ``config.json`` parsed (None where it is not JSON: it is then copied as it is)."""
    try:
        return json.loads(read_side_file(real))
    except (OSError, ValueError):
        return None
    except RecursionError:
        raise ConfigError(f"base config {shown} is nested too deeply to read as JSON") from None


def _config_bytes(data: dict[str, Any], shown: Path) -> bytes:
    """The base's config with its ``dtype`` set, as JSON (NaN and ±Infinity are not JSON: refused)."""
    try:
        return _json_bytes(data)
    except ValueError as exc:
        raise ConfigError(
            f"base config {shown} holds NaN or Infinity ({exc}); a merged folder's config is written as JSON, "
            "which has neither: replace them, or merge without dtype= to copy the config as it is"
        ) from None
    except RecursionError:
        raise ConfigError(f"base config {shown} is nested too deeply to write as JSON") from None


def file_crc32(path: Path) -> str:
    """The CRC-32 of the whole file ``path`` (what ``zlib.crc32`` of its bytes gives), as 8 hex digits.

    Args:
        path: a regular file.

    Returns:
        The CRC-32, 8 lowercase hex digits.
    """
    from ..store.checksum import crc32, crc32_combine, crc_hex

    crc = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, _WINDOW):
            length = min(_WINDOW, size - offset)
            try:  # a private mapping is writable, so the native CRC kernel takes it; nothing is written or copied
                mapping = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY, offset=offset)
            except OSError:  # no commit charge for it (strict overcommit): a read-only mapping, hashed by zlib
                mapping = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset)
            with mapping:
                view = memoryview(mapping)
                try:
                    crc = crc32_combine(crc, crc32([view]), length)
                finally:
                    view.release()
    return crc_hex(crc)


def tensors_crc32(source: Any) -> str | None:
    """The CRC-32 of a source's tensors: each stored tensor's bytes in C order, in the source's key order (tied
    names once), as 8 hex digits; None when a tensor has no data (meta).

    Args:
        source: a :class:`~ram_live.io.sources.TensorSource`.

    Returns:
        The CRC-32, or None.
    """
    from ..store.checksum import crc32, crc32_combine, crc_hex
    from .dtensor import local_tensor

    crc = 0
    aliases = source.aliases()
    for key in source.keys():
        if key in aliases:
            continue
        t = local_tensor(source.get(key)).detach()
        if t.is_meta:
            return None
        data = t.reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
        crc = crc32_combine(crc, crc32([memoryview(data)]), data.nbytes)
    return crc_hex(crc)


def _files(paths: list[Path], root: Path | None = None) -> list[dict[str, Any]]:
    return [
        {"name": str(p.relative_to(root)) if root else str(p), "bytes": p.stat().st_size, "crc32": file_crc32(p)}
        for p in paths
    ]


def _describe(source: Any, given: Any) -> dict[str, Any]:
    """One input of the merge as ``ram_merge.json`` records it."""
    out: dict[str, Any] = {"name": source.name}
    if isinstance(given, (str, os.PathLike)):
        out["given"] = os.fspath(given)  # an id as the user wrote it; its snapshot folder is "path"
    manifest = getattr(source, "manifest", None)
    if isinstance(manifest, Mapping) and hasattr(source, "step") and hasattr(source, "store"):
        return {
            **out,
            "kind": "snapshot",
            "store": str(source.store.root),
            "agent": source.agent,
            "step": source.step,
            "base_fingerprint": manifest.get("base_fingerprint"),
            "files": [dict(f) for f in manifest.get("files", [])],
        }
    if isinstance(manifest, Mapping) and hasattr(source, "fingerprint") and hasattr(source, "folder"):
        return {
            **out,
            "kind": "store base",
            "store": str(source.folder.parent),
            "fingerprint": source.fingerprint,
            "files": [dict(f) for f in manifest.get("files", [])],
        }
    path = getattr(source, "path", None)
    fingerprint = getattr(source, "fingerprint", None)
    if isinstance(path, Path) and isinstance(fingerprint, tuple):
        root = path if path.is_dir() else None
        files = [Path(f[0]) for f in fingerprint]
        return {**out, "kind": "safetensors", "path": str(path), "files": _files(files, root)}
    kind = type(source).__name__
    if kind in ("ModuleSource", "StateDictSource", "LocalModel"):
        kind = "state dict" if kind == "StateDictSource" else "module"
        return {**out, "kind": kind, "tensors_crc32": tensors_crc32(source)}
    return {**out, "kind": _KINDS.get(kind, kind)}


def provenance(
    agents: list[Any],
    base_src: Any,
    given: Mapping[str, Any],
    base_given: Any,
    about_base: Mapping[str, Any],
    info: Any,
    dtype: torch.dtype | None,
) -> bytes:
    """``ram_merge.json``'s content for a finished merge (the module's docstring says what it holds).

    Args:
        agents: the agents as merged (sources).
        base_src: the base as merged.
        given: agent name → what the user gave for it (ids and paths are recorded as given).
        base_given: what the user gave as ``base=``.
        about_base: :attr:`BaseFiles.about`.
        info: the merge's :class:`~ram_live.types.MergeInfo`.
        dtype: the ``dtype=`` asked for, or None.

    Returns:
        The JSON document, UTF-8.
    """
    from .. import __version__
    from .jsonable import jsonable

    options = jsonable(info.config)
    if isinstance(options, dict):
        options.pop("method", None)
    document = {
        "format": "ram_live.merge",
        "version": 1,
        "ram_live": __version__,
        "method": info.method,
        "options": options,
        "dtype": _dtype_name(dtype) if dtype is not None else None,
        "base": {**_describe(base_src, base_given), **about_base},
        "agents": [_describe(a, given.get(a.name)) for a in agents],
    }
    if info.extra.get("importance") is not None:  # curvature-aware RAM: "given" or "stored" importances
        document["importance"] = info.extra["importance"]
    for name in ("lambdas", "rho"):
        if getattr(info, name, None):
            document[name] = jsonable(getattr(info, name))
    return _json_bytes(document, sort_keys=False)
