"""verl's side: the checkpoint callback of verl ≥ 0.9 (``trainer.checkpoint_callback_class``) and a mixin for
trainers without one.

verl 0.9's v1 trainer builds, on the driver, the class named by ``trainer.checkpoint_callback_class`` with
``cls(config=<the full trainer DictConfig>)`` and calls ``on_save(trainer=..., global_step=..., checkpoint_dir=
<default_local_dir>/global_step_<N>, async_save=...)`` after every checkpoint save (``trainer.save_freq`` and
the last step), after the workers wrote their shards and before the next save can rotate them away
(``max_actor_ckpt_to_keep``). The subclass of verl's ``CheckpointCallback`` is created on first use, so
importing this module does not import verl.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from .common import VERL_DTYPES, VerlIntegrationError
from .config import options_from_verl
from .core import RAMVerl
from .dotted import get_dotted

__all__ = ["RAMTrainerMixin", "RAMVerlHooks", "callback_class"]  # RAMCheckpointCallback: module __getattr__

log = logging.getLogger("ram_live.verl")


def _master_dtype(config: Any) -> torch.dtype | None:
    """The dtype verl keeps the actor's weights in (``actor.fsdp_config.model_dtype``; fp32 when unset)."""
    value = get_dotted(config, "actor_rollout_ref.actor.fsdp_config.model_dtype")
    if value is None:
        return torch.float32
    return VERL_DTYPES.get(str(value).replace("torch.", ""))


class RAMVerlHooks:
    """The callback's behaviour, without verl's base class: validates the ``ram`` config group at construction
    (and sets or checks the store's base), snapshots and merges on :meth:`on_save`.

    Example:
        >>> hooks = RAMVerlHooks(config)  # verl's trainer DictConfig, with a ``ram`` group  # doctest: +SKIP
    """

    def __init__(self, config: Any = None) -> None:
        """Read and check the ``ram`` group and verl's settings; set or check the store's base when verl's
        ``actor.fsdp_config.model_dtype`` (fp32 when unset) tells the snapshots' dtype.

        Args:
            config: verl's full trainer config (``DictConfig``), holding the ``ram`` group.

        Raises:
            ConfigError: no or an invalid ``ram`` group, or verl settings it cannot work with
                (:func:`options_from_verl`); and as :class:`RAMVerl`.
            VerlIntegrationError: as :meth:`RAMVerl.prepare`.
            BaseMismatchError: as :meth:`RAMVerl.prepare`.
        """
        self.config = config
        self.options = options_from_verl(config)
        self.ram = RAMVerl(self.options, master_dtype=_master_dtype(config))
        # a fresh run that verl does not resume never continues the store run of older checkpoints in its folder
        self.ram.resumes = str(get_dotted(config, "trainer.resume_mode") or "auto") != "disable"

    @property
    def history(self) -> list[dict[str, float]]:
        """Every save's logged metrics, with its ``step``."""
        return self.ram.history

    def on_save(
        self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs: Any
    ) -> None:
        """verl's hook (keyword arguments): snapshot ``checkpoint_dir``'s actor weights, merge when due, log ``ram/*``
        through ``trainer.logger`` (through ``logging`` when it has none), as :meth:`RAMVerl.on_save`.

        Args:
            trainer: the verl trainer (its ``total_training_steps`` marks the last step, its ``logger`` logs).
            global_step: verl's global step of the save.
            checkpoint_dir: the save's ``global_step_<N>`` folder.
            async_save: whether verl saved the checkpoint asynchronously (refused).
            **kwargs: verl's other arguments, ignored.

        Raises:
            VerlIntegrationError: ``async_save`` (the files may still be in flight); and as :meth:`RAMVerl.on_save`.
            UnsupportedInputError: as :meth:`RAMVerl.on_save`.
            ConfigError: as :meth:`RAMVerl.on_save`.
            EvaluationError: as :meth:`RAMVerl.on_save`.
        """
        if async_save:
            raise VerlIntegrationError(
                f"checkpoint {checkpoint_dir} was saved asynchronously: its files may still be in flight; the RAM "
                "callback needs actor_rollout_ref.actor.checkpoint.async_save=false"
            )
        total = getattr(trainer, "total_training_steps", None)
        last = total is not None and global_step >= int(total)
        self.ram.on_save(int(global_step), checkpoint_dir, last=last, log_fn=lambda m, s: _log(trainer, m, s))


def _log(trainer: Any, metrics: dict[str, float], step: int) -> None:
    tracking = getattr(trainer, "logger", None)
    if tracking is not None and callable(getattr(tracking, "log", None)) and not isinstance(tracking, logging.Logger):
        tracking.log(data=metrics, step=step)
    else:  # the legacy RayPPOTrainer keeps its Tracking object local to fit()
        log.info("ram_live step %s: %s", step, " ".join(f"{k}={v:.6g}" for k, v in sorted(metrics.items())))


_CLASS: type | None = None


def callback_class() -> type:
    """``RAMCheckpointCallback``: :class:`RAMVerlHooks` on verl's ``CheckpointCallback`` (plain when verl has none)."""
    global _CLASS
    if _CLASS is None:
        try:
            from verl.trainer.ppo.checkpoint_callback import CheckpointCallback
        except ImportError:  # verl < 0.9: usable through RAMTrainerMixin
            CheckpointCallback = object  # type: ignore[misc,assignment]
        _CLASS = type(
            "RAMCheckpointCallback",
            (RAMVerlHooks, CheckpointCallback),
            {
                "__module__": __name__,
                "__doc__": "RAM snapshots and merges from verl's checkpoints: set "
                "trainer.checkpoint_callback_class=ram_live.integrations.verl.RAMCheckpointCallback and the "
                "`ram` config group (+ram.store=... +ram.agent=...). verl builds it as cls(config=...): see "
                "RAMVerlHooks.__init__ (Args, Raises) and on_save.\n\n"
                "Example:\n"
                "    >>> cb = RAMCheckpointCallback(config=config)  # doctest: +SKIP\n",
            },
        )
    return _CLASS


class RAMTrainerMixin:
    """For verl trainers that do not call ``trainer.checkpoint_callback_class`` (``RayPPOTrainer``, the legacy
    trainer of verl 0.9 and the only one before): runs the same code after ``_save_checkpoint``.

    >>> from verl.trainer.ppo.ray_trainer import RayPPOTrainer                         # doctest: +SKIP
    >>> class RAMRayPPOTrainer(RAMTrainerMixin, RayPPOTrainer): pass                   # doctest: +SKIP

    The ``ram`` group is validated when the trainer is built. Metrics go to ``logging`` (that trainer keeps its
    tracker local to ``fit``) and to ``trainer.ram_history``.

    Args:
        *args, **kwargs: the trainer's own; its ``config`` then holds the ``ram`` group. When the trainer's
            ``checkpoint_callback`` is a :class:`RAMVerlHooks` already, the mixin does nothing.

    Raises:
        ConfigError: as :class:`RAMVerlHooks` (an invalid ``ram`` group or verl settings), at construction.
        VerlIntegrationError: ``async_save`` checkpoints, and as :meth:`RAMVerl.on_save`, after a checkpoint save.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(getattr(self, "checkpoint_callback", None), RAMVerlHooks):
            self._ram_hooks = RAMVerlHooks(self.config)  # type: ignore[attr-defined]

    @property
    def ram_history(self) -> list[dict[str, float]]:
        hooks = self.__dict__.get("_ram_hooks") or getattr(self, "checkpoint_callback", None)
        return hooks.history if isinstance(hooks, RAMVerlHooks) else []

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._save_checkpoint(*args, **kwargs)  # type: ignore[misc]
        hooks = self.__dict__.get("_ram_hooks")
        if hooks is None:  # the trainer calls the RAM checkpoint callback itself
            return result
        config = self.config  # type: ignore[attr-defined]
        step = int(self.global_steps)  # type: ignore[attr-defined]
        folder = os.path.join(config.trainer.default_local_dir, f"global_step_{step}")
        ckpt = config.actor_rollout_ref.actor.get("checkpoint", {}) or {}
        hooks.on_save(self, global_step=step, checkpoint_dir=folder, async_save=bool(ckpt.get("async_save", False)))
        return result


def __getattr__(name: str) -> Any:
    if name == "RAMCheckpointCallback":
        return callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
