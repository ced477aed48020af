"""What the verl integration's modules share: dtype names, its error, and where its inputs come from (the base
model's folder, the ``ram.evaluate`` function, the base's side files copied next to merged weights)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ram_live.errors import ConfigError, RamLiveError
from ram_live.io.hub import cached_snapshot, split_id

__all__ = ["DTYPE_OF", "SIDE_SKIP", "VERL_DTYPES", "VerlIntegrationError", "copy_side_files", "load_evaluate",
           "resolve_base"]

DTYPE_OF = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
VERL_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp16": torch.float16, "float16": torch.float16}
SIDE_SKIP = (".safetensors", ".safetensors.index.json", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


class VerlIntegrationError(RamLiveError, ValueError):
    """A verl checkpoint or setting the integration cannot use (names the file or key at fault)."""


def _fetch(repo: str, revision: str | None) -> Path | None:
    """The model files of hub id ``repo`` downloaded into the Hugging Face cache (None when that fails)."""
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.safetensors", "*.safetensors.index.json", "*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except Exception:
        return None


def resolve_base(path: str) -> Path:
    """A local Hugging Face folder for ``path``: the folder itself; a hub id (``org/name[@revision]``) in the local
    cache (:func:`ram_live.io.hub.cached_snapshot`), else fetched, as verl fetches ``model.path``; ``hdfs://...``
    copied by verl."""
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        return p
    if "://" in path:  # hdfs://... : verl's own copy (the same cache its workers use)
        try:
            from verl.utils.fs import copy_to_local

            local = Path(copy_to_local(path))
            if local.is_dir():
                return local
        except Exception:
            pass
    elif not p.exists() and (parts := split_id(path)) is not None:  # a hub id, as verl's model.path may be
        try:
            folder = cached_snapshot(path, what="ram.base")  # the local cache (ram_live.io.hub), as everywhere
        except ConfigError:  # not cached: fetched, as verl's own workers fetch model.path (not with HF_HUB_OFFLINE=1)
            folder = _fetch(*parts) if "/" in parts[0] else None
        if folder is not None:
            return folder
    raise ConfigError(f"ram.base: {path!r} is not a local Hugging Face model folder (nor a cached hub model); set "
                      "+ram.base=<local folder of the base model>")


def load_evaluate(path: str) -> Callable[..., Mapping[str, Any]]:
    """``fn`` of ``"pkg.module.fn"`` or ``"pkg.module:fn"``."""
    from ram_live.loading import load_callable

    return load_callable(path, "ram.evaluate")


def copy_side_files(base_dir: str | os.PathLike[str], dest: Path, *, keep_existing: bool = False) -> None:
    """Copy the base folder's files other than weights (config, tokenizer, ...) into ``dest``; with
    ``keep_existing`` a file already in ``dest`` stays."""
    for f in Path(base_dir).iterdir():
        if f.is_file() and not f.name.endswith(SIDE_SKIP) and not (keep_existing and (dest / f.name).exists()):
            shutil.copy2(f, dest / f.name)
