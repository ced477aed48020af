"""What the verl integration's modules share: dtype names, its error, and where its inputs come from (the base
model's folder, the ``ram.evaluate`` function, the base's side files copied next to merged weights)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from ram_live.errors import ConfigError, RamLiveError
from ram_live.io.hub import cached_snapshot
from ram_live.io.side_files import read_side_file, side_files

__all__ = [
    "DTYPE_OF",
    "VERL_DTYPES",
    "VerlIntegrationError",
    "copy_side_files",
    "load_evaluate",
    "resolve_base",
]

DTYPE_OF = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
VERL_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


class VerlIntegrationError(RamLiveError, ValueError):
    """A verl checkpoint or setting the integration cannot use (names the file or key at fault)."""


def resolve_base(path: str) -> Path:
    """A local Hugging Face folder for ``path``, never downloading from the hub at run time (the rule of
    :mod:`ram_live.io.hub`, as for every other model path): the folder itself; a hub id (``org/name[@revision]``)
    as the local cache's snapshot (:func:`ram_live.io.hub.cached_snapshot`); ``hdfs://...`` copied by verl.

    Args:
        path: ``ram.base`` (by default verl's ``actor_rollout_ref.model.path``).

    Raises:
        ConfigError: naming ``ram.base`` and the id or path: an id the local cache does not hold (fetch it first,
            e.g. ``hf download <id>``; a local folder works too), or a path that is no folder; a side file that
            links outside the folder (:func:`ram_live.io.side_files.side_files`), before training starts.
    """
    folder = _folder(path)
    side_files(folder)
    return folder


def _folder(path: str) -> Path:
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
    elif not p.exists():  # a hub id, as verl's model.path may be: the local cache only (a ConfigError naming it)
        folder = cached_snapshot(path, what="ram.base")
        if folder is not None:
            return folder
    raise ConfigError(
        f"ram.base: {path!r} is not a local Hugging Face model folder (nor a cached hub model); set "
        "+ram.base=<local folder of the base model>"
    )


def load_evaluate(path: str) -> Callable[..., Mapping[str, Any]]:
    """``fn`` of ``"pkg.module.fn"`` or ``"pkg.module:fn"``."""
    from ram_live.loading import load_callable

    return load_callable(path, "ram.evaluate")


def copy_side_files(base_dir: str | os.PathLike[str], dest: Path, *, keep_existing: bool = False) -> None:
    """Copy the base folder's side files (config, tokenizer, ...: :func:`ram_live.io.side_files.side_files`, regular
    files inside the folder) into ``dest``; with ``keep_existing`` a file already in ``dest`` stays."""
    skip = {f.name for f in dest.iterdir()} if keep_existing else set()
    for name, real in side_files(Path(base_dir), skip=skip).items():
        (dest / name).write_bytes(read_side_file(real))
