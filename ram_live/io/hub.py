"""Models named by Hugging Face id, found in the local Hugging Face cache only: nothing is ever downloaded.

Wherever a model folder is taken (``merge``/``ram_merge``/``probe``/``search`` inputs, ``ram-live``'s paths,
mergekit YAML, the evaluation's ``model=``/``tokenizer=``), a string that is not an existing path but looks like an
id — ``org/name`` or ``name``, optionally ``@revision`` (a branch, tag or commit hash; default ``main``) — is the
snapshot folder the cache holds for it (``huggingface_hub.snapshot_download(..., local_files_only=True)``, in
``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when resolving). An id the cache
does not hold is a :class:`~ram_live.errors.ConfigError` naming it. Without ``huggingface_hub`` installed, strings
stay paths (and a missing one gives the usual "no such file" error).

Nothing outside the model's cache folder (``models--org--name``) is ever read for an id: a revision must be a
branch or tag name (letters, digits, ``._+-``, parts joined by ``/``; no part starting with ``.``, no ``..``, no
leading ``/``) or a commit hash; a ``refs/<revision>`` file must hold a commit hash; the snapshot folder and every
file in it must resolve (symlinks followed) inside the model's cache folder or its ``blobs``. Anything else is a
:class:`~ram_live.errors.ConfigError` naming the id and the revision.

>>> resolve_model("Qwen/Qwen2.5-0.5B@main")           # doctest: +SKIP
'/home/me/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B/snapshots/<commit>'
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["cached_snapshot", "hub_cache", "resolve_model", "revision_problem", "split_id"]

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_ID = re.compile(rf"{_PART}(/{_PART})?")
_REF_PART = re.compile(r"[A-Za-z0-9._+-]+")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_MAX_REVISION = 255


def split_id(text: str) -> tuple[str, str | None] | None:
    """``(repo id, revision or None)`` of ``org/name[@revision]`` or ``name[@revision]``; None when ``text`` does
    not look like an id (a path: more than one ``/`` before any ``@``, a backslash, a leading ``.``/``/``/``~``,
    ``..``, ``--``, a ``.safetensors`` file name, nothing after ``@``). The revision is not checked here
    (:func:`cached_snapshot` refuses one that is not a ref name or commit hash).

    Args:
        text: what the user gave.

    >>> split_id("Qwen/Qwen2.5-0.5B@v1.0"), split_id("./runs/coder")
    (('Qwen/Qwen2.5-0.5B', 'v1.0'), None)
    """
    repo, sep, revision = text.partition("@")
    if (sep and not revision) or not _ID.fullmatch(repo) or ".." in repo or "--" in repo:
        return None
    if repo.endswith((".safetensors", ".json", ".yml", ".yaml")):
        return None
    return repo, revision or None


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` is not a branch or tag name or a commit hash (None when it is one).

    Args:
        revision: the text after ``@``.

    Returns:
        A short reason, or None.

    >>> revision_problem("v1.0"), revision_problem("/etc")
    (None, 'a leading or trailing /, or //')
    """
    if len(revision) > _MAX_REVISION:
        return f"longer than {_MAX_REVISION} characters"
    parts = revision.split("/")
    if any(not part for part in parts):
        return "a leading or trailing /, or //"
    if ".." in revision:
        return "'..' in it"
    if any(part.startswith(".") or part.endswith((".", ".lock")) for part in parts):
        return "a part that starts with '.' or ends with '.' or '.lock'"
    if not all(_REF_PART.fullmatch(part) for part in parts):
        return "a character other than letters, digits, '.', '_', '+', '-' and '/'"
    return None


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
        ConfigError: ``text`` is an id that the local cache does not hold (at that revision, or not complete); its
            revision is not a branch or tag name or a commit hash; the cache's ``refs/<revision>`` holds something
            other than a commit hash; the snapshot folder, or a file in it, lies outside the model's cache folder.
    """
    parts = split_id(text)
    if parts is None:
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    repo, revision = parts
    at = f" at revision {revision!r}" if revision else ""
    problem = revision_problem(revision) if revision is not None else None
    if problem is not None:
        raise ConfigError(
            f"{what}: {text!r}: the revision {revision!r} of {repo!r} is not a branch, tag or commit hash ({problem})"
        )
    cache = hub_cache()
    model_dir = cache / ("models--" + repo.replace("/", "--"))
    _check_ref(model_dir, revision or "main", f"{what}: {text!r}{at}")
    try:  # the completeness check of newer huggingface_hub on config.json only: a model fetched in part
        # (--include "*.safetensors" "*.json") resolves; a weight file that is missing is then the reader's error
        folder = snapshot_download(
            repo, revision=revision, cache_dir=str(cache), local_files_only=True, allow_patterns=["config.json"]
        )
    except (OSError, ValueError) as exc:  # LocalEntryNotFoundError, IncompleteSnapshotError, HFValidationError
        raise ConfigError(
            f"{what}: {text!r} is not a local folder or file, nor a model{at} in the local Hugging Face cache "
            f"{cache} ({type(exc).__name__}); ram_live downloads nothing: fetch it first (hf download "
            f"{repo}{' --revision ' + revision if revision else ''}), or pass a local folder (a folder works "
            "anywhere an id does)"
        ) from None
    _check_inside(model_dir, Path(folder), f"{what}: {text!r}{at}")
    return Path(folder)


def _check_ref(model_dir: Path, revision: str, label: str) -> None:
    """A ``refs/<revision>`` file of the cache holds a commit hash (never a path to follow)."""
    ref = model_dir / "refs" / revision
    if not ref.is_file():
        return
    root, real = os.path.realpath(model_dir), os.path.realpath(ref)
    if os.path.commonpath([root, real]) != root:
        raise ConfigError(
            f"{label}: the cache's ref file {ref} resolves to {real}, outside its cache folder {model_dir}; the "
            "cache is damaged or was tampered with: fetch the model again"
        )
    try:
        with open(ref, "rb") as f:
            content = f.read(_MAX_REVISION + 1)
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read the cache's ref file {ref}: {exc.strerror}") from None
    text = content.decode("utf-8", "replace")
    if not _COMMIT.fullmatch(text):
        raise ConfigError(
            f"{label}: the cache's ref file {ref} holds {text[:64]!r}, not a commit hash (40 hex digits); "
            "the cache is damaged or was tampered with: fetch the model again"
        )


def _check_inside(model_dir: Path, folder: Path, label: str) -> None:
    """The snapshot ``folder`` and everything in it resolve (symlinks followed) inside ``model_dir`` or its
    ``blobs`` (which may be a link to another disk)."""
    roots = [os.path.realpath(model_dir), os.path.realpath(model_dir / "blobs")]

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return any(os.path.commonpath([root, real]) == root for root in roots)

    real = os.path.realpath(folder)
    if os.path.commonpath([roots[0], real]) != roots[0]:
        raise ConfigError(
            f"{label}: its snapshot folder {folder} resolves to {real}, outside its cache "
            f"folder {model_dir}; the cache is damaged or was tampered with: fetch the model again"
        )
    for here, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(here, name)
            if not inside(path):
                raise ConfigError(
                    f"{label}: {path} in its snapshot resolves to {os.path.realpath(path)}, outside its cache "
                    f"folder {model_dir}; the cache is damaged or was tampered with: fetch the model again"
                )


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
