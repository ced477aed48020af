"""What the framework callbacks share: the one-agent warning and saving a generalist to a folder."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from ..schedule import MergeResult, RAMSchedule

__all__ = ["SingleAgentWarning", "save_generalist", "warn_single_agent"]


class SingleAgentWarning(UserWarning):
    """A merge had one agent only: the "generalist" is that agent's snapshot (are the other agents' runs writing
    to the same store?)."""


def warn_single_agent(owner: str, result: MergeResult, stacklevel: int = 3) -> None:
    if len(result.agents) == 1:
        warnings.warn(f"{owner}: the store holds snapshots of one agent only ({next(iter(result.agents))!r}); the "
                      "merge is that agent's snapshot", SingleAgentWarning, stacklevel=stacklevel)


def _pretrained(module: Any) -> Any:
    """The module itself if it has ``save_pretrained``, else its only child that has one, else None."""
    if hasattr(module, "save_pretrained"):
        return module
    found = [m for m in getattr(module, "children", lambda: [])() if hasattr(m, "save_pretrained")]
    return found[0] if len(found) == 1 else None


def save_generalist(schedule: RAMSchedule, module: Any, result: MergeResult, folder: Path,
                    processor: Any = None) -> Path:
    """Save the generalist as ``folder/step-<N>``: a ``save_pretrained`` folder (the module, or its one child
    with ``save_pretrained``, with the generalist swapped in; ``processor`` saved alongside), else
    ``folder/step-<N>.safetensors`` of the merged tensors. Written under a temporary name, then renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    target = _pretrained(module)
    final = folder / (f"step-{result.step}" if target is not None else f"step-{result.step}.safetensors")
    tmp = folder / f".tmp-{final.name}-{os.getpid()}"
    if tmp.is_dir():
        shutil.rmtree(tmp)
    if target is not None:
        with schedule.swapped(module, result):
            target.save_pretrained(tmp, safe_serialization=True)
        if processor is not None and hasattr(processor, "save_pretrained"):
            processor.save_pretrained(tmp)
        if final.exists():  # a resumed run merging the same step again
            shutil.rmtree(final)
    else:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in result.tensors.items()}, str(tmp),
                  metadata={"format": "pt", "step": str(result.step)})
    os.replace(tmp, final)
    return final
