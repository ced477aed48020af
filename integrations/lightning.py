"""Lightning callback: snapshot this run's task vector every n steps into a store shared by several agents' runs,
and every m steps merge the latest snapshot of every agent there with RAM into a generalist, evaluate it, log.

>>> from ram_live.integrations.lightning import RAMCallback                               # doctest: +SKIP
>>> trainer = L.Trainer(callbacks=[RAMCallback(store="runs/ram", agent="coder", snapshot_every=50,
...                                            merge_every=200)])
>>> trainer.fit(model)      # logs ram/<validation metric>, ram/<agent>/density|rho|lambda, ...

Follows ``lightning.pytorch.callbacks.WeightAveraging``'s conventions: overridable ``should_snapshot(step, epoch)``
and ``should_merge(step, epoch)`` are asked after every optimizer step (``step`` = optimizer steps taken, so
``snapshot_every=50`` snapshots after steps 50, 100, ...); the merged weights are swapped into the module for the
evaluation and swapped back (bit-exact); the counters are the callback's ``state_dict`` so a resumed run continues
where it stopped. Strategies: single device, DDP (rank zero writes, every rank merges the same snapshots) and
``ModelParallelStrategy`` (DTensor parameters: every rank writes and merges its own shards). Others raise at setup.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
        from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]
        from pytorch_lightning.utilities.model_helpers import is_overridden  # type: ignore[no-redef]
        from pytorch_lightning.utilities.rank_zero import rank_zero_warn  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError(
            'ram_live.integrations.lightning needs Lightning: pip install -e ".[lightning]" (in the ram-live clone)'
        ) from exc

from ..errors import RamLiveError
from ..methods.ram.config import RamConfig
from ..training.tensors import ScheduleAdapter, swap_tensors
from ..training.schedule import MergeResult, RAMSchedule
from ..training.search_record import save_next_to
from ..store import LocalCollective, LocalModel, SnapshotStore, TorchCollective
from ..engine.unchanged import quiet_unchanged
from ._common import AdamImportance, SingleAgentWarning, agent_folder, importance_option, save_generalist
from ._common import callback_preflight, check_merged_dir, guarded_hook, warn_single_agent, warn_unchanged_agents
from ._lightning_validation import validation_metrics
from .metrics import logged_as

__all__ = ["RAMCallback", "SingleAgentWarning", "UnsupportedStrategyError"]


class UnsupportedStrategyError(RamLiveError, TypeError):
    """The trainer's strategy is one RAMCallback does not support."""


def _strategy_check(strategy: Any) -> str:
    """'single', 'ddp' or 'model_parallel'; raises for anything else."""
    S = pl.strategies

    unsupported = tuple(
        getattr(S, n)
        for n in ("DeepSpeedStrategy", "XLAStrategy", "SingleDeviceXLAStrategy", "FSDPStrategy", "XLAFSDPStrategy")
        if hasattr(S, n)
    )
    if not isinstance(strategy, unsupported):
        if isinstance(strategy, S.ModelParallelStrategy):
            return "model_parallel"
        if isinstance(strategy, S.DDPStrategy):
            return "ddp"
        if isinstance(strategy, S.SingleDeviceStrategy):
            return "single"
    raise UnsupportedStrategyError(
        f"RAMCallback supports the single-device, DDP and ModelParallel strategies; the trainer uses "
        f"{type(strategy).__name__}. (FSDP1 flattens parameters and DeepSpeed shards them its own way: use "
        "ModelParallelStrategy with FSDP2/tensor parallelism instead.)"
    )


class RAMCallback(ScheduleAdapter, Callback):
    r"""Snapshots of this run's agent into a shared :class:`~ram_live.store.SnapshotStore`; periodic RAM merges of
    the latest snapshot of every agent in it, evaluated and logged under ``ram/``.

    Args:
        store: the store folder (created if needed) or a :class:`SnapshotStore`; shared by the agents' runs.
        agent: this run's agent name (a folder of the store).
        base: the model every agent was trained from. ``None``: the module's weights at train start on a fresh
            run (reloaded from the store on resume); ``"store"``: the store's base; or an ``nn.Module``, a state
            dict or a checkpoint path. It must equal the store's base if the store has one.
        snapshot_every: snapshot after every this many optimizer steps (None: only at train end).
        merge_every: merge the generalist after every this many steps (None: never).
        evaluate: ``evaluate(module) -> dict`` called with the merged weights swapped in; ``None`` runs the
            module's ``validation_step`` over the validation dataloaders instead (when it has them); ``False``
            only logs the probe numbers.
        ram: the merges' :class:`~ram_live.RamConfig` (default ``RamConfig()``: RAM+), or its flat mapping
            (``{"method": "ram", "eps": 0.0}``, :meth:`~ram_live.RamConfig.to_dict`), as in
            :class:`~ram_live.RAMSchedule`.
        snapshot_activity, snapshot_eps: ``"changed"`` (lossless, default) or ``"abs"`` (keep |τ| > snapshot_eps).
        keep: keep only this run's newest ``keep`` snapshots.
        agents: merge only these agents (default: every agent of the store).
        snapshot_on_train_end: take a last snapshot when training ends.
        val_batches: at most this many batches per validation dataloader for the merged model's validation
            (default: the trainer's ``limit_val_batches``).
        async_write: write snapshot files in a background thread (the changed values are captured at the step;
            single device and DDP); waited for before the next snapshot, a merge, a checkpoint and at train end.
        durable: fsync snapshot files before their manifest (survives power loss, not only killed processes).
        search: a :class:`~ram_live.training.search.SearchSetting`: each merge is the one :func:`ram_live.search`
            picks with the setting's held-out evaluation (``evaluate(module)``, each candidate swapped in; when it
            names none, this callback's evaluation: ``evaluate`` or the validation loop). Logs ``ram/search/*``;
            the record is in ``last_result.extra["search"]``, the callback's state,
            ``<store>/_search/<agent>/step_<N>.json`` and, with ``merged_dir``, next to each saved generalist
            (``<agent>/step-<N>/ram_search.json`` or ``<agent>/step-<N>.search.json``). Single device and DDP.
        merged_dir: save every generalist as ``merged_dir/<agent>/step-<N>`` (``save_pretrained``, when the module
            or its one child with that method is a Hugging Face model) or ``merged_dir/<agent>/step-<N>.safetensors``,
            on rank 0; one ``merged_dir`` serves several agents' runs. A name already taken (a resumed run merging
            a step again) is never replaced: the save is ``step-<N>-v1``, ``-v2``, ... (:attr:`saved` lists them).
        load_generalist: at train end, merge the latest snapshots (unless this step was merged) and copy the
            generalist into the module, as ``WeightAveraging`` copies its average: a checkpoint saved afterwards
            holds the generalist as its ``state_dict`` and the agent's own weights under ``ram_agent_state``, which
            are put back into the module when training resumes from it. The agent's weights are in
            :attr:`agent_state` meanwhile.
        importance: ``"adam"`` (default): at each snapshot read Adam's ``exp_avg_sq`` from the live optimizer
            (``ram_live.importance.adam_importance``; FSDP2: each rank's local shards) and store it with the
            snapshot, and the merges weigh by them (``importance="stored"``,
            docs/curvature.md: every agent's picked snapshot must carry them, else a ConfigError naming it).
            Optimizers without ``exp_avg_sq`` (SGD, Adafactor): snapshots without importances, one
            ``NoImportanceWarning``, and this callback's merges are plain RAM. ``None``: never, plain RAM.
        importance_bias_correction: divide ``exp_avg_sq`` by 1 − β₂^step (off by default: between Adam agents at
            similar steps raw and corrected tie, 79.4 % both on the RL demo, benchmarks/quality.md; only ratios
            between agents matter, and agents at different steps are reweighted by it).
        **schedule_options: ``snapshot_activity``, ``snapshot_eps``, ``keep``, ``agents``, ``async_write``,
            ``durable``, ``search`` above, the other options of :class:`~ram_live.RAMSchedule`; any other name
            (RAM's options among them: they go in ``ram=RamConfig(...)``) is a ``ConfigError``. ``on_error``:
            ``"warn"`` (default: a failure after training started is a ``MergeFailedWarning`` and ``ram/errors``,
            training goes on) or ``"raise"``; a pre-flight at train start checks what it can (docs/callbacks.md).

    Raises:
        RamLiveError: ``evaluate=True`` (it takes a callable, None or False).
        ConfigError: an unknown option, an invalid ``importance`` / ``importance_bias_correction``, an invalid
            schedule value (``snapshot_every``, ``snapshot_activity``, ...) or agent name.
        UnsupportedStrategyError: at ``trainer.fit``'s setup, not here: a strategy other than single device, DDP or
            ``ModelParallelStrategy`` (FSDP1, DeepSpeed, XLA).

    Example:
        >>> cb = RAMCallback("runs/ram", "coder", snapshot_every=50, merge_every=200)  # doctest: +SKIP
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | SnapshotStore,
        agent: str,
        base: Any = None,
        snapshot_every: int | None = None,
        merge_every: int | None = None,
        evaluate: Callable[[Any], Mapping[str, Any]] | bool | None = None,
        ram: RamConfig | Mapping[str, Any] | None = None,
        *,
        snapshot_on_train_end: bool = True,
        val_batches: int | None = None,
        merged_dir: str | os.PathLike[str] | None = None,
        load_generalist: bool = False,
        importance: str | None = "adam",
        importance_bias_correction: bool = False,
        **schedule_options: Any,
    ) -> None:
        importance_option(importance, importance_bias_correction)
        if evaluate is True:
            raise RamLiveError("evaluate must be a callable, None (validation) or False")
        RAMSchedule.check_options(schedule_options, "RAMCallback")
        self.schedule = RAMSchedule(
            store, agent, snapshot_every=snapshot_every, merge_every=merge_every, ram=ram, **schedule_options
        )
        self.agent = agent
        self._trainer: Any = None
        self.importance = importance
        if importance == "adam":  # stored with every snapshot, and the merges weigh by them while it is
            self.schedule.importance_from = AdamImportance(
                f"RAMCallback({agent!r})",
                lambda: (self._trainer.optimizers or [None])[0] if self._trainer else None,
                importance_bias_correction,
                self.schedule,
            )
        self._store_name = str(store.root if isinstance(store, SnapshotStore) else store)
        self._base = base
        self._evaluate = evaluate
        self.snapshot_on_train_end = snapshot_on_train_end
        self.val_batches = val_batches
        self.mode: str | None = None
        self._loaded_state = False
        self.last_result: MergeResult | None = None
        self.merged_dir = Path(merged_dir) if merged_dir is not None else None
        check_merged_dir(self.merged_dir, self._store_name, f"RAMCallback({agent!r})")
        self.load_generalist = load_generalist
        self.saved: list[str] = []  # the generalists' files/folders (merged_dir), oldest first
        self.agent_state: dict[str, torch.Tensor] | None = None  # the agent's weights once the generalist is loaded

    # ------------------------------------------------------------------------------------------- conventions

    @property
    def state_key(self) -> str:
        """The agent and the store's resolved path: ``run/store`` and its absolute path are the same store."""
        return self._generate_state_key(agent=self.agent, store=_resolved(self._store_name))

    def should_snapshot(self, step: int, epoch: int) -> bool:
        """Called after every optimizer step: snapshot now? Override for rules of your own.

        Args:
            step: the optimizer steps taken (1-based).
            epoch: the trainer's current epoch.

        Returns:
            True on multiples of ``snapshot_every`` (never when it is None).
        """
        return self.schedule.should_snapshot(step, epoch)

    def should_merge(self, step: int, epoch: int) -> bool:
        """Called after every optimizer step: merge (and evaluate) the generalist now? Override for rules of your own.

        Args:
            step: the optimizer steps taken (1-based).
            epoch: the trainer's current epoch.

        Returns:
            True on multiples of ``merge_every`` (never when it is None).
        """
        return self.schedule.should_merge(step, epoch)

    # ------------------------------------------------------------------------------------------- hooks

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.mode = _strategy_check(trainer.strategy)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        base = self._base
        if base is None and self.schedule.base_fingerprint is None and trainer.ckpt_path is not None:
            if not self.schedule.store.has_base():
                raise RamLiveError(
                    f"RAMCallback({self.agent!r}): resuming from {trainer.ckpt_path}, which holds no RAMCallback "
                    "state, and the store has no base: the module's weights are no longer the base; pass base=..."
                )
            rank_zero_warn(f"RAMCallback({self.agent!r}): resuming without RAM state; using the store's base")
            base = "store"
        collective = TorchCollective() if trainer.world_size > 1 else LocalCollective()
        self._trainer = trainer  # the importances read trainer.optimizers[0] at each snapshot
        self.schedule.attach(pl_module, base=base, collective=collective)
        # before the first step, what the merges' options allow checking (ram_live.training.preflight)
        owner, evaluate = f"RAMCallback({self.agent!r})", self._evaluation(trainer, pl_module)
        callback_preflight(self.schedule, pl_module, owner, evaluate, self.merged_dir)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, epoch = trainer.global_step, trainer.current_epoch
        s = self.schedule
        if step > s.last_snapshot_step and self.should_snapshot(step, epoch):
            with self._guard("snapshot", trainer):
                s.snapshot(pl_module, step, epoch)
        if step > s.last_merge_step and self.should_merge(step, epoch):
            with self._guard("merge", trainer):
                self.merge_now(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        with self._guard("last snapshot", trainer):
            if self.snapshot_on_train_end and step > 0 and self.schedule.last_snapshot_step < step:
                self.schedule.snapshot(pl_module, step, trainer.current_epoch)
            self.schedule.flush()
        if self.load_generalist and step > 0:
            if self.schedule.last_merge_step < step or self.last_result is None:
                self.last_result = None  # not an older merge's, should this one fail
                with self._guard("merge", trainer):
                    self.merge_now(trainer, pl_module)
            if self.last_result is None:  # the merge failed (on_error="warn"): the module keeps the agent's weights
                return
            result = self.last_result
            # result now holds the agent's
            swap_tensors(LocalModel.from_obj(pl_module, name=self.agent), result.tensors)
            self.agent_state, self.last_result = result.tensors, None

    def state_dict(self) -> dict[str, Any]:
        return {**self.schedule.state_dict(), "history": self.history, "saved": list(self.saved)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict)
        self.schedule.history[:] = [dict(h) for h in state_dict.get("history", [])]
        self.saved = list(state_dict.get("saved", []))
        self._loaded_state = True

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.agent_state is not None:
            checkpoint["ram_agent_state"] = {k: v.detach().cpu() for k, v in self.agent_state.items()}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        saved = checkpoint.get("ram_agent_state")
        if saved is not None:  # the module was saved holding the generalist: train on from the agent's weights
            with torch.no_grad():
                for key, t in LocalModel.from_obj(pl_module, name=self.agent).tensors.items():
                    t.tensor.copy_(saved[key])
        if self.state_key not in checkpoint.get("callbacks", {}):  # saved with the store spelled differently
            for key, state in checkpoint.get("callbacks", {}).items():
                if _same_callback(key, type(self).__name__, self.agent, self._store_name):
                    self.load_state_dict(state)
                    break

    # ------------------------------------------------------------------------------------------- merging

    def merge_now(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        """Merge the latest snapshot of every agent now, evaluate, log (and save the generalist in ``merged_dir``).

        Args:
            trainer: the running trainer (its step, epoch, loggers and validation dataloaders).
            pl_module: the module trained; the merged weights are swapped in for the evaluation and swapped back.

        Returns:
            The logged metrics, ``ram/``-prefixed: the merge's probe numbers, ``ram/search/*`` under ``search``, and
            the evaluation's.

        Raises:
            StoreError: the callback was not set up (training not started); ``SnapshotNotFoundError`` (a
                ``StoreError``): the store holds no snapshot to merge.
            ConfigError: this run's snapshots carry Adam importances (``importance="adam"``) and another agent's
                picked snapshot carries none (its agent named).
            SearchError: under ``search``, an evaluation that raised or returned no finite number.

        Warns:
            UnchangedAgentWarning: (rank 0) once per merge, naming the agents that changed no entry of the base
                (density 0), for every method; they are in ``last_result.extra["unchanged"]``.

        Example:
            >>> metrics = callback.merge_now(trainer, model)  # doctest: +SKIP
        """
        evaluate = self._evaluation(trainer, pl_module)
        with quiet_unchanged():  # an agent that changed nothing is named once, below
            metrics = self.schedule.merge_and_evaluate(
                pl_module,
                trainer.global_step,
                trainer.current_epoch,
                logged_as(evaluate, "lightning"),
            )
        result = self.last_result = self.schedule.last_result
        assert result is not None
        warn_unchanged_agents(f"RAMCallback({self.agent!r})", result, warn=trainer.is_global_zero)
        if trainer.is_global_zero:
            warn_single_agent(f"RAMCallback({self.agent!r})", result)
            if self.merged_dir is not None:
                folder = agent_folder(self.merged_dir, self.agent)
                self.saved.append(str(save_generalist(self.schedule, pl_module, result, folder)))
                if "search" in result.extra:  # the chosen options next to the generalist
                    save_next_to(self.saved[-1], result.extra["search"], durable=self.schedule.durable)
        self._log(trainer, metrics)
        return metrics

    def _evaluation(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> Callable[[Any], Any] | None:
        """The merges' evaluation: ``evaluate``, else the validation loop where the module has one, else None."""
        if self._evaluate is None and is_overridden("validation_step", pl_module):
            return lambda module: self._validate(trainer, module)
        return self._evaluate if callable(self._evaluate) else None

    def _guard(self, what: str, trainer: pl.Trainer) -> Any:  # on_error (a failure logs ram/errors)
        return guarded_hook(
            self.schedule, f"RAMCallback({self.agent!r})", what, trainer.global_step, lambda m: self._log(trainer, m)
        )

    def _log(self, trainer: pl.Trainer, metrics: dict[str, float]) -> None:
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def _validate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, float]:
        return validation_metrics(trainer, pl_module, self.val_batches, self.schedule.collective)


def _resolved(store: str) -> str:
    return str(Path(store).expanduser().resolve())


def _same_callback(key: str, cls: str, agent: str, store: str) -> bool:
    """Whether checkpoint state key ``key`` (``Cls{'agent': ..., 'store': ...}``) names this agent and store."""
    if not key.startswith(cls + "{"):
        return False
    try:
        fields = ast.literal_eval(key[len(cls) :])
    except (ValueError, SyntaxError):
        return False
    return (
        isinstance(fields, dict)
        and fields.get("agent") == agent
        and _resolved(str(fields.get("store", ""))) == _resolved(store)
    )
