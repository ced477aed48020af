"""What the framework callbacks share: the one-agent and unchanged-agent warnings and saving a generalist to a
folder of its own."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..io.dtensor import is_dtensor
from ..engine.unchanged import warn_unchanged
from ..training.failures import guarded
from ..training.preflight import agent_folder, preflight
from ..training.schedule import MergeResult, RAMSchedule
from .metrics import logged_as

__all__ = [
    "AdamImportance",
    "NoImportanceWarning",
    "SingleAgentWarning",
    "agent_folder",
    "logged_as",
    "place_new",
    "save_generalist",
    "warn_single_agent",
    "warn_unchanged_agents",
]


class NoImportanceWarning(UserWarning):
    """The optimizer keeps no Adam second moments (``exp_avg_sq``): snapshots are taken without importances and
    the callback's merges are plain RAM (warned once per callback)."""


class AdamImportance:
    """``f(model)``: Adam's ``exp_avg_sq`` of the live optimizer (``optimizer()`` finds it at each call) keyed by
    the model's parameter names, via :func:`ram_live.importance.adam_importance`; None, with one
    :class:`NoImportanceWarning`, when there is no optimizer, it keeps no ``exp_avg_sq`` (SGD, Adafactor), or it
    has no state yet. FSDP2/DTensor parameters: the moments are DTensors too; their local shards are stored with
    the local shards of the weights. ``schedule``: its ``importance`` follows the latest read, ``"stored"`` when
    the moments were stored with the snapshot, None (plain RAM) when not."""

    def __init__(self, owner: str, optimizer: Any, bias_correction: bool = False, schedule: Any = None) -> None:
        self.owner, self.optimizer, self.bias_correction = owner, optimizer, bias_correction
        self.schedule = schedule
        self.warned = False

    def __call__(self, model: Any) -> Any:
        from ram_live.errors import ConfigError
        from ram_live.importance import adam_importance

        opt = self.optimizer()
        while opt is not None and not hasattr(opt, "state") and hasattr(opt, "optimizer"):
            opt = opt.optimizer  # accelerate's AcceleratedOptimizer and similar wrappers
        try:
            if opt is None:
                raise ConfigError("no optimizer")
            if not any("betas" in g for g in opt.param_groups):
                raise ConfigError(f"{type(opt).__name__} keeps no 'exp_avg_sq' (no Adam second moments)")
            if any(is_dtensor(p) for p in model.parameters()):
                found = local_adam_importance(opt, model, self.bias_correction)
            else:
                found = adam_importance(opt, model, bias_correction=self.bias_correction)
        except ConfigError as exc:
            if self.schedule is not None:
                self.schedule.importance = None
            if not self.warned:
                self.warned = True
                warnings.warn(
                    NoImportanceWarning(
                        f"{self.owner}: snapshots without importances ({exc}); this callback's merges are plain RAM "
                        "(pass importance=None to silence this)"
                    ),
                    stacklevel=3,
                )
            return None
        if self.schedule is not None:
            self.schedule.importance = "stored"  # the merges weigh by the stored importances
        return found


def local_adam_importance(opt: Any, model: Any, bias_correction: bool) -> dict[str, Any]:
    """``exp_avg_sq`` of sharded (DTensor) parameters as this rank's local shards, keyed by parameter name
    (zeros of the local shard's shape where a parameter has no state): what the rank's snapshot piece stores."""
    import torch

    from ram_live.errors import ConfigError

    beta2 = {id(p): (g.get("betas") or (None, None))[1] for g in opt.param_groups for p in g["params"]}
    out = {}
    for name, p in model.named_parameters():
        local = p.to_local() if is_dtensor(p) else p
        state = opt.state.get(p) or {}
        if not state:
            out[name] = torch.zeros(local.shape, dtype=torch.float32, device=local.device)
            continue
        if "exp_avg_sq" not in state:
            raise ConfigError(f"{type(opt).__name__} keeps no 'exp_avg_sq' (its state holds {sorted(state)})")
        v = state["exp_avg_sq"]
        v = (v.to_local() if is_dtensor(v) else v).detach().float()
        if bias_correction:
            v = v / (1.0 - float(beta2[id(p)]) ** float(state["step"]))
        out[name] = v
    return out


def importance_option(importance: Any, bias_correction: bool) -> None:
    """Checks a callback's ``importance=`` (``"adam"`` or None) and ``importance_bias_correction=``."""
    from ram_live.errors import ConfigError

    if importance not in ("adam", None):
        raise ConfigError(f"importance must be 'adam' (Adam's exp_avg_sq at each snapshot) or None, got {importance!r}")
    if not isinstance(bias_correction, bool):
        raise ConfigError(f"importance_bias_correction must be a bool, got {bias_correction!r}")


class SingleAgentWarning(UserWarning):
    """A merge had one agent only: the "generalist" is that agent's snapshot (are the other agents' runs writing
    to the same store?)."""


def warn_single_agent(owner: str, result: MergeResult, stacklevel: int = 3) -> None:
    if len(result.agents) == 1:
        warnings.warn(
            f"{owner}: the store holds snapshots of one agent only ({next(iter(result.agents))!r}); the "
            "merge is that agent's snapshot",
            SingleAgentWarning,
            stacklevel=stacklevel,
        )


def warn_unchanged_agents(owner: str, result: MergeResult, warn: bool = True) -> list[str]:
    """The agents of ``result`` with density 0 (they changed no entry of the base), recorded in
    ``result.extra["unchanged"]`` and, with ``warn`` (rank zero), named in one
    :class:`~ram_live.errors.UnchangedAgentWarning`. The callbacks run their merges inside
    :func:`~ram_live.engine.unchanged.quiet_unchanged`: this is the merge's one warning, for every method."""
    unchanged = [name for name, density in result.density.items() if density == 0]
    if unchanged:
        result.extra["unchanged"] = unchanged
        if warn:
            warn_unchanged(unchanged, f"{owner}: ", force=True)
    return unchanged


def check_merged_dir(merged_dir: Path | None, store: str, owner: str) -> None:
    """Refuse, when a callback is built, a ``merged_dir`` that is a file, or the snapshot store's folder or a folder
    inside it (the generalists would be written among the store's snapshots).

    Raises:
        ConfigError: naming ``owner``, ``merged_dir`` and the store."""
    if merged_dir is None:
        return
    if merged_dir.exists() and not merged_dir.is_dir():
        raise ConfigError(f"{owner}: merged_dir={str(merged_dir)!r} exists and is not a folder")
    root, real = os.path.realpath(store), os.path.realpath(merged_dir)
    if os.path.commonpath([root, real]) == root:
        raise ConfigError(
            f"{owner}: merged_dir={str(merged_dir)!r} is the snapshot store {store!r} or a folder inside it; the "
            "generalists would be written among its snapshots: pick a folder outside the store"
        )


def place_new(tmp: Path, folder: Path, stem: str, suffix: str = "") -> Path:
    """Rename ``tmp`` (a finished folder or file in ``folder``) to ``folder/<stem><suffix>``, or, where that name is
    taken, to the first free ``<stem>-v<k><suffix>`` (k = 1, 2, ...: Lightning ``ModelCheckpoint``'s versions): an
    existing generalist is never replaced, even by a run writing the same name at the same moment.

    Args:
        tmp: what was written, under a temporary name in ``folder``.
        folder: where it goes.
        stem: its name without the suffix (``step-200``).
        suffix: ``".safetensors"`` for a file, ``""`` for a folder.

    Returns:
        The path it was given.
    """
    version = 0
    while True:
        final = folder / f"{stem}{f'-v{version}' if version else ''}{suffix}"
        version += 1
        if final.exists() or final.is_symlink():
            continue
        try:
            if tmp.is_dir():
                os.rename(tmp, final)  # onto a folder that is not empty it fails: nothing is replaced
            else:
                _move_file(tmp, final)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                continue  # taken in between by another run
            raise
        return final


def _move_file(tmp: Path, final: Path) -> None:
    """``tmp`` renamed to ``final``, which must not exist (``FileExistsError`` otherwise): a hard link, else (a
    file system without them) the name claimed with ``O_EXCL`` and the file moved onto the claim."""
    try:
        os.link(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
        os.close(os.open(final, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        os.replace(tmp, final)
    else:
        os.unlink(tmp)


def _pretrained(module: Any) -> Any:
    """The module itself if it has ``save_pretrained``, else its only child that has one, else None."""
    if hasattr(module, "save_pretrained"):
        return module
    found = [m for m in getattr(module, "children", lambda: [])() if hasattr(m, "save_pretrained")]
    return found[0] if len(found) == 1 else None


def save_generalist(
    schedule: RAMSchedule, module: Any, result: MergeResult, folder: Path, processor: Any = None
) -> Path:
    """Save the generalist as ``folder/step-<N>``: a ``save_pretrained`` folder (the module, or its one child
    with ``save_pretrained``, with the generalist swapped in; ``processor`` saved alongside), else
    ``folder/step-<N>.safetensors`` of the merged tensors. Written under a temporary name, then renamed to the
    first free name (``step-<N>-v1``, ... when taken: :func:`place_new`; nothing is ever replaced)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = _pretrained(module)
    stem, suffix = f"step-{result.step}", "" if target is not None else ".safetensors"
    tmp = folder / f".tmp-{stem}-{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}"
    try:
        if target is not None:
            with schedule.swapped(module, result):
                target.save_pretrained(tmp, safe_serialization=True)
            if processor is not None and hasattr(processor, "save_pretrained"):
                processor.save_pretrained(tmp)
        else:
            from safetensors.torch import save_file

            save_file(
                {k: v.detach().cpu().contiguous() for k, v in result.tensors.items()},
                str(tmp),
                metadata={"format": "pt", "step": str(result.step)},
            )
        return place_new(tmp, folder, stem, suffix)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def guarded_hook(
    schedule: RAMSchedule, owner: str, what: str, step: int, log: Callable[[dict[str, float]], None]
) -> Iterator[None]:
    """A callback hook's snapshot or merge under the schedule's ``on_error``
    (:func:`~ram_live.training.failures.guarded`); a failure turned into a warning logs ``ram/errors`` (the
    failures so far) through ``log``."""
    with guarded(schedule, owner, what, step) as outcome:
        yield
    if outcome.failed:
        log({"ram/errors": float(schedule.errors)})


def callback_preflight(
    schedule: RAMSchedule, model: Any, owner: str, evaluate: Any, merged_dir: Any, trainer_evaluate: Any = None
) -> None:
    """A callback's pre-flight at train begin (:func:`~ram_live.training.preflight.preflight`); a LoRA run's search
    is checked as the adapter search it runs (:mod:`._lora_search`: over the live ``PeftModel``'s adapters, no
    ``rank`` family when folding into the base); ``evaluate="trainer"`` (transformers) needs ``trainer_evaluate``,
    the bound trainer's evaluation."""
    if evaluate == "trainer":
        if trainer_evaluate is None:
            raise ConfigError(f"{owner}: pre-flight: evaluate='trainer' needs the trainer: callback.bind(trainer)")
        evaluate = trainer_evaluate
    adapters, space = None, None
    if hasattr(schedule, "into_base"):  # a ._peft_agent.LoraSchedule
        from ..selection.adapters import ADAPTER_SPACE

        adapters = model
        if schedule.search is not None and schedule.search.space is None and schedule.into_base:
            space = {k: v for k, v in ADAPTER_SPACE.items() if k != "rank"}
    preflight(schedule, model, owner, evaluate, merged_dir, adapters=adapters, space=space)
