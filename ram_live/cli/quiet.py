"""``--quiet`` for the libraries a command may load models with: Hugging Face transformers' and huggingface_hub's
progress bars ("Loading weights", "Loading checkpoint shards", downloads) and transformers' log messages below
errors, off for the command and restored after it. transformers is never imported for this (it takes seconds):
imported before the command, it is switched through its API; imported during it (by ``--reward``'s model, or by
the user's ``--eval`` code), it starts quiet (it reads huggingface_hub's switch and ``TRANSFORMERS_VERBOSITY``
when imported) and gets the settings it would have had once the command ends."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["quiet_libraries"]

_VERBOSITY = "TRANSFORMERS_VERBOSITY"


@contextmanager
def quiet_libraries(quiet: bool) -> Iterator[None]:
    """Within the block: no transformers / huggingface_hub progress bar and no transformers log below errors,
    when ``quiet``; nothing changes otherwise."""
    if not quiet:
        yield
        return
    hub = _hub()
    hub_states = dict(hub.progress_bar_states) if hub is not None else None
    transformers = sys.modules.get("transformers.utils.logging")
    before = (transformers.is_progress_bar_enabled(), transformers.get_verbosity()) if transformers else None
    verbosity = os.environ.get(_VERBOSITY)
    os.environ[_VERBOSITY] = "error"
    if hub is not None:
        hub.progress_bar_states.clear()
        hub.progress_bar_states["_global"] = False  # hub.disable_progress_bars(), without its warnings
    if transformers is not None:
        transformers.disable_progress_bar()
        transformers.set_verbosity_error()
    try:
        yield
    finally:
        if verbosity is None:
            os.environ.pop(_VERBOSITY, None)
        else:
            os.environ[_VERBOSITY] = verbosity
        if hub is not None and hub_states is not None:
            hub.progress_bar_states.clear()
            hub.progress_bar_states.update(hub_states)
        if before is None:  # imported during the command, or never: the settings an import now would give
            transformers = sys.modules.get("transformers.utils.logging")
            if transformers is not None:
                before = (hub is None or not hub.are_progress_bars_disabled(), _default_level(transformers))
        if transformers is not None and before is not None:
            (transformers.enable_progress_bar if before[0] else transformers.disable_progress_bar)()
            transformers.set_verbosity(before[1])


def _hub() -> Any:
    """huggingface_hub's progress-bar switch (``huggingface_hub.utils.tqdm``; cheap to import), or None."""
    try:  # (the module: ``huggingface_hub.utils.tqdm`` as an attribute is the tqdm class)
        hub_tqdm = importlib.import_module("huggingface_hub.utils.tqdm")
    except ImportError:
        return None
    needed = ("progress_bar_states", "are_progress_bars_disabled")
    return hub_tqdm if all(hasattr(hub_tqdm, name) for name in needed) else None


def _default_level(transformers: Any) -> int:
    default = getattr(transformers, "_get_default_logging_level", None)
    return default() if callable(default) else logging.WARNING
