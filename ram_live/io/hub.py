"""Models named by Hugging Face id, found in the local Hugging Face cache only: nothing is ever downloaded.

Wherever a model folder is taken (``merge``/``ram_merge``/``probe``/``search`` inputs, ``ram-live``'s paths,
mergekit YAML, the evaluation's ``model=``/``tokenizer=``), a string that is not an existing path but looks like an
id — ``org/name`` or ``name``, optionally ``@revision`` (a branch, tag or commit hash; default ``main``) — is the
snapshot folder the cache holds for it (``huggingface_hub.snapshot_download(..., local_files_only=True)``, in
``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when resolving). An id the cache
does not hold is a :class:`~ram_live.errors.ConfigError` naming it. Without ``huggingface_hub`` installed, strings
stay paths (and a missing one gives the usual "no such file" error).

>>> resolve_model("Qwen/Qwen2.5-0.5B@main")           # doctest: +SKIP
'/home/me/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/<commit>'
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["cached_snapshot", "hub_cache", "resolve_model", "split_id"]

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_ID = re.compile(rf"{_PART}(/{_PART})?")


def split_id(text: str) -> tuple[str, str | None] | None:
    """``(repo id, revision or None)`` of ``org/name[@revision]`` or ``name[@revision]``; None when ``text`` does
    not look like an id (a path: more than one ``/``, a backslash, a leading ``.``/``/``/``~``, ``..``, ``--``, a
    ``.safetensors`` file name).

    Args:
        text: what the user gave.

    >>> split_id("Qwen/Qwen2.5-0.5B@v1.0"), split_id("./runs/coder")
    (('Qwen/Qwen2.5-0.5B', 'v1.0'), None)
    """
    repo, sep, revision = text.partition("@")
    if (sep and not revision) or not _ID.fullmatch(repo) or ".." in repo or "--" in repo:
        return None
    if repo.endswith((".safetensors", ".json", ".yml", ".yaml")) or ".." in revision:
        return None
    return None if any(c.isspace() or c == "\\" for c in revision) else (repo, revision or None)


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, from the environment now: ``HF_HUB_CACHE`` (or the older
    ``HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` / ``~/.cache/...``."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.path.expanduser(os.environ[name]))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(os.path.expanduser(home)) / "hub"


def cached_snapshot(text: str, *, what: str = "model") -> Path | None:
    """The local snapshot folder of the Hugging Face id ``text`` (``org/name[@revision]``), never downloading.

    Args:
        text: the id, optionally with ``@revision``.
        what: who asks, for the error message (an agent's name, ``"base"``, ``"--base"``, ...).

    Returns:
        The folder, or None when ``text`` is not an id or ``huggingface_hub`` is not installed.

    Raises:
        ConfigError: ``text`` is an id that the local cache does not hold (at that revision, or not complete).
    """
    parts = split_id(text)
    if parts is None:
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    repo, revision = parts
    cache = hub_cache()
    try:  # the completeness check of newer huggingface_hub on config.json only: a model fetched in part
        # (--include "*.safetensors" "*.json") resolves; a weight file that is missing is then the reader's error
        folder = snapshot_download(
            repo, revision=revision, cache_dir=str(cache), local_files_only=True, allow_patterns=["config.json"]
        )
    except (OSError, ValueError) as exc:  # LocalEntryNotFoundError, IncompleteSnapshotError, HFValidationError
        at = f" at revision {revision!r}" if revision else ""
        raise ConfigError(
            f"{what}: {text!r} is not a local folder or file, nor a model{at} in the local Hugging Face cache "
            f"{cache} ({type(exc).__name__}); ram_live downloads nothing: fetch it first (huggingface-cli download "
            f"{repo}{' --revision ' + revision if revision else ''}) or pass a folder"
        ) from None
    return Path(folder)


def resolve_model(ref: Any, *, what: str = "model") -> Any:
    """``ref`` as the caller should open it: an existing path, or anything that is not a path, as it is; a
    string (or path) naming a cached Hugging Face model (``org/name[@revision]``) as its snapshot folder (a
    ``str``); any other as it is (the caller's "no such file" error names it).

    Args:
        ref: a model, a path or an id.
        what: who asks, for the error message.

    Raises:
        ConfigError: an id that the local cache does not hold.
    """
    text = os.fspath(ref) if isinstance(ref, (str, os.PathLike)) else None
    if not isinstance(text, str) or os.path.exists(text):
        return ref
    folder = cached_snapshot(text, what=what)
    return ref if folder is None else str(folder)
