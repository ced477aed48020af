"""transformers / TRL callback: snapshot this run's task vector every n steps (or at each checkpoint save) into a
store shared by several agents' runs, and every m steps merge the latest snapshot of every agent there with RAM
into a generalist, evaluate it, save it and log it. Works with every ``transformers.Trainer``, TRL's
``GRPOTrainer``, ``PPOTrainer``-style trainers built on it, ``SFTTrainer`` and so on. With a ``PeftModel`` (TRL's
``peft_config=``) the snapshots are the LoRA adapter's factors and the merges are in ΔW space (``._peft_agent``).

>>> from ram_live.integrations.transformers import RAMTrainerCallback                    # doctest: +SKIP
>>> callback = RAMTrainerCallback("runs/ram", agent="coder", snapshot_every=50, merge_every=200,
...                               merged_dir="runs/generalists", evaluate=my_eval)
>>> trainer = GRPOTrainer(model, reward_funcs=reward, args=args, train_dataset=ds, callbacks=[callback])
>>> callback.bind(trainer)          # optional: logs through trainer.log, allows evaluate="trainer"
>>> trainer.train()                 # logs ram/<metric>, ram/<agent>/density|rho|lambda, ...

The callback's state (the schedule's counters, the base fingerprint, ``history``, the saved generalists) is an
``ExportableState``: it is written into every checkpoint's ``trainer_state.json`` (``stateful_callbacks``) and read
back when training resumes from one (``trainer.train(resume_from_checkpoint=...)``), whether or not
``restore_callback_states_from_checkpoint`` is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import ExportableState
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'ram_live.integrations.transformers needs transformers: pip install -e ".[trl]" '
        '(or ".[transformers]"; in the ram-live clone)'
    ) from exc

from ..errors import ConfigError, RamLiveError
from ..training.tensors import ScheduleAdapter
from ..methods.ram.config import RamConfig
from ..training.schedule import MergeResult, RAMSchedule
from ..store import SnapshotStore
from ..engine.unchanged import quiet_unchanged
from ._common import AdamImportance, SingleAgentWarning, agent_folder, importance_option
from ._common import check_merged_dir, logged_as, warn_single_agent, warn_unchanged_agents
from ._common import callback_preflight, guarded_hook
from ._peft_agent import LoraSchedule, is_peft_model, lora_options
from ._trl_outputs import save_trl_generalist, trainer_evaluation
from ._trl_state import CallbackState
from ._trl_weights import check_vllm_marker, force_vllm_resync, sharding_refusal, uses_vllm

__all__ = ["RAMTrainerCallback", "SingleAgentWarning"]


class RAMTrainerCallback(CallbackState, ScheduleAdapter, TrainerCallback, ExportableState):
    r"""Snapshots of this run's agent into a shared :class:`~ram_live.store.SnapshotStore`; periodic RAM merges of
    the latest snapshot of every agent in it, evaluated, saved and logged under ``ram/``.

    Args:
        store: the store folder (created if needed); shared by the agents' runs.
        agent: this run's agent name (a folder of the store).
        base: the model every agent was trained from: ``None`` (the model's weights at train start on a fresh
            run, the store's base on resume), ``"store"``, or an ``nn.Module`` / state dict / checkpoint path.
        snapshot_every: snapshot after every this many optimizer steps (None: see ``snapshot_on_save``).
        merge_every: merge the generalist after every this many steps (None: never).
        snapshot_on_save: also snapshot at every step the trainer saves a checkpoint.
        evaluate: ``evaluate(model) -> dict`` called with the generalist swapped into the model (restored
            bit-exactly afterwards); ``"trainer"``: ``trainer.evaluate()`` of the bound trainer (:meth:`bind`) on
            its eval dataset with the generalist swapped in (its metrics are logged as ``ram/eval_*``, not as the
            trainer's ``eval_*``); ``None``: only the probe numbers.
        merged_dir: save every generalist as ``merged_dir/<agent>/step-<N>`` (``save_pretrained`` with the run's
            tokenizer/processor; written to a temporary name and renamed), on the main process. A name already
            taken is never replaced: the save is ``step-<N>-v1``, ``-v2``, ... (:attr:`saved` lists them).
        ram: the merges' :class:`~ram_live.RamConfig` (default ``RamConfig()``: RAM+), or its flat mapping
            (``{"method": "ram", "eps": 0.0}``); saved with the checkpoint's arguments as ``ram``
            (:meth:`RamConfig.to_dict`).
        snapshot_on_train_end: take a last snapshot when training ends.
        importance: ``"adam"`` (default): at each snapshot read Adam's ``exp_avg_sq`` from the live optimizer
            (the ``optimizer`` the trainer passes to its callbacks; ``ram_live.importance.adam_importance``) and
            store it with the snapshot, and the merges weigh by them (``importance="stored"``,
            docs/curvature.md: every agent's picked snapshot must carry them, else a ConfigError naming it).
            Optimizers without ``exp_avg_sq`` (SGD, Adafactor): snapshots without importances, one
            ``NoImportanceWarning``, and this callback's merges are plain RAM. ``None``: never, plain RAM.
        importance_bias_correction: divide ``exp_avg_sq`` by 1 − β₂^step (off by default: between Adam agents at
            similar steps raw and corrected tie, 79.4 % both on the RL demo, benchmarks/quality.md; only ratios
            between agents matter, and agents at different steps are reweighted by it).
        sparsify, into_base, svd_options: LoRA runs only (the model is a ``PeftModel``; docs/callbacks.md): the
            activity rule for the adapters' dense ΔW (``"auto"``: ``TopK(0.5)`` for the RAM family, ``TopK(d)``,
            ``RelativeThreshold(t)``, None), folding the merged ΔW into the base weights instead of re-factoring it
            into a new adapter, and the re-factorisation's :class:`~ram_live.peft.SvdOptions`, as in
            :func:`ram_live.peft.ram_merge_adapters`. Snapshots are then the adapter's A/B factors.
        trainer: the trainer (or call :meth:`bind` once it exists). Required for TRL trainers generating with vLLM
            (``use_vllm=True``): after each merge their next generation pushes the agent's weights to vLLM again.
        _from_checkpoint: set in the arguments saved with the checkpoint: transformers rebuilds the callback from
            them (``restore_callback_states_from_checkpoint``), and the rebuilt one takes ``evaluate``, ``base``,
            ``search`` and the trainer from the callback it replaces.
        **schedule_options: the options of :class:`~ram_live.RAMSchedule` (``snapshot_activity``,
            ``snapshot_eps``, ``keep``, ``agents``, ``async_write``, ``durable``, ...; ``search``: a
            :class:`~ram_live.training.search.SearchSetting`, each merge the one :func:`ram_live.search` picks); any
            other name (RAM's options among them: they go in ``ram=RamConfig(...)``) is a ``ConfigError``.
            ``on_error``: ``"warn"`` (default: a failure after training started is a ``MergeFailedWarning`` and
            ``ram/errors``, training goes on) or ``"raise"``. At train begin a pre-flight checks what it can
            (the search setting, a ``rewards()`` evaluation on the base's first prompts, ``merged_dir``).

    Raises:
        ConfigError: ``evaluate`` neither a callable, ``"trainer"`` nor None; an unknown option; an invalid
            ``importance`` / ``importance_bias_correction``, LoRA option (``sparsify``, ``into_base``,
            ``svd_options``), schedule value (``snapshot_every``, ``snapshot_activity``, ...) or agent name. At train
            begin: LoRA options on a model that is not a ``PeftModel``, DeepSpeed ZeRO-3 or FSDP1 sharding, a vLLM
            trainer not bound (or of a TRL version without ``_last_loaded_step``).
        RamLiveError: at train begin (full-weight runs), resuming from a checkpoint without RAM state while the store
            has no base and ``base`` is None.

    Example:
        >>> cb = RAMTrainerCallback("runs/ram", "coder", snapshot_every=10, merge_every=50,
        ...                         merged_dir="runs/merged", evaluate=lambda m: {"acc": score(m)})  # doctest: +SKIP
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        agent: str,
        base: Any = None,
        snapshot_every: int | None = None,
        merge_every: int | None = None,
        snapshot_on_save: bool = False,
        evaluate: Callable[[Any], Mapping[str, Any]] | str | None = None,
        merged_dir: str | os.PathLike[str] | None = None,
        ram: RamConfig | Mapping[str, Any] | None = None,
        *,
        snapshot_on_train_end: bool = True,
        trainer: Any = None,
        importance: str | None = "adam",
        importance_bias_correction: bool = False,
        sparsify: Any = "auto",
        into_base: bool = False,
        svd_options: Any = None,
        _from_checkpoint: bool = False,
        **schedule_options: Any,
    ) -> None:
        importance_option(importance, importance_bias_correction)
        if isinstance(store, SnapshotStore):
            store = store.root
        if evaluate is not None and not callable(evaluate) and evaluate != "trainer":
            raise ConfigError(f"evaluate must be a callable, 'trainer' or None, got {evaluate!r}")
        RAMSchedule.check_options(schedule_options, "RAMTrainerCallback")
        self.schedule = RAMSchedule(
            store, agent, snapshot_every=snapshot_every, merge_every=merge_every, ram=ram, **schedule_options
        )
        self._lora = lora_options(sparsify, into_base, svd_options, self.schedule.ram.method)
        # the JSON arguments a resumed run rebuilds the callback from (search: taken from the live instance)
        given = {
            k: list(v) if k == "agents" and v is not None else v for k, v in schedule_options.items() if k != "search"
        }
        self._args = {
            "store": str(store),
            "agent": agent,
            "snapshot_every": snapshot_every,
            "merge_every": merge_every,
            "snapshot_on_save": snapshot_on_save,
            "merged_dir": str(merged_dir) if merged_dir is not None else None,
            "ram": self.schedule.ram.to_dict(),
            "snapshot_on_train_end": snapshot_on_train_end,
            "importance": importance,
            "importance_bias_correction": importance_bias_correction,
            **self._lora,
            **given,
        }
        self.agent, self.base, self.evaluate = agent, base, evaluate
        self.merged_dir = Path(merged_dir) if merged_dir is not None else None
        check_merged_dir(self.merged_dir, str(store), f"RAMTrainerCallback({agent!r})")
        self.snapshot_on_save = snapshot_on_save
        self.snapshot_on_train_end = snapshot_on_train_end
        self.trainer = trainer
        self._optimizer: Any = None  # the optimizer the trainer passes to the events
        self.importance = importance
        if importance == "adam":  # stored with every snapshot, and the merges weigh by them while it is
            self.schedule.importance_from = AdamImportance(
                f"RAMTrainerCallback({agent!r})",
                lambda: self._optimizer or getattr(self.trainer, "optimizer", None),
                importance_bias_correction,
                self.schedule,
            )
        self.saved: list[str] = []  # the generalists' folders, oldest first
        self.last_result: MergeResult | None = None
        self._processor: Any = None
        self._restored: dict[str, Any] | None = None
        self._register_live(_from_checkpoint)  # a callback rebuilt on resume: the one it replaces' objects

    # ------------------------------------------------------------------------------------------- conventions

    def bind(self, trainer: Any) -> "RAMTrainerCallback":
        """Use ``trainer``: metrics are logged through ``trainer.log`` (every reporter sees them), and
        ``evaluate="trainer"`` runs ``trainer.evaluate()``; required when the trainer generates with vLLM.

        Args:
            trainer: the ``transformers.Trainer`` (or TRL trainer) this callback is registered with.

        Returns:
            The callback itself.

        Example:
            >>> trainer.add_callback(RAMTrainerCallback("runs/ram", "coder").bind(trainer))  # doctest: +SKIP
        """
        self.trainer = trainer
        return self

    # ------------------------------------------------------------------------------------------- hooks

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        processing_class: Any = None,
        **kwargs: Any,
    ) -> None:
        lora = is_peft_model(model)
        if lora and not isinstance(self.schedule, LoraSchedule):  # merged in ΔW space (the state: a checkpoint's)
            self.schedule = LoraSchedule.adopt(self.schedule, self._lora, (self._restored or {}).get("schedule"))
        elif not lora and self._lora != lora_options("auto", False, None, "ram"):
            raise ConfigError(
                f"RAMTrainerCallback({self.agent!r}): sparsify=, into_base= and svd_options= apply to "
                "LoRA runs (a PeftModel) only"
            )
        self._processor = processing_class if processing_class is not None else kwargs.get("tokenizer")
        why = sharding_refusal(model)
        if why is not None:
            raise ConfigError(f"RAMTrainerCallback({self.agent!r}): unsupported model sharding: {why}")
        if uses_vllm(self.trainer, args):
            if self.trainer is None:
                raise ConfigError(
                    f"RAMTrainerCallback({self.agent!r}): the trainer generates with vLLM (use_vllm=True): bind it "
                    "(callback.bind(trainer)), so that after each merge the agent's weights are pushed to vLLM again "
                    "(an evaluation of the generalist may have pushed the generalist's)"
                )
            check_vllm_marker(self.trainer, f"RAMTrainerCallback({self.agent!r})")
        if state.global_step > 0 and self._restored is None:
            saved = self._find_state(state)
            if saved is not None:
                self._load(saved)
        base = self.base
        if lora:
            self.schedule.attach(model, base=base)
            self._preflight(model)
            return
        if base is None and self.schedule.base_fingerprint is None and state.global_step > 0:
            if not self.store.has_base():
                raise RamLiveError(
                    f"RAMTrainerCallback({self.agent!r}): resuming at step {state.global_step} from a "
                    "checkpoint without RAM state, and the store has no base: pass base=..."
                )
            base = "store"
        self.schedule.attach(model, base=base)
        self._preflight(model)

    def _preflight(self, model: Any) -> None:  # before the first step (ram_live.training.preflight)
        bound = self._trainer_evaluate if self.trainer is not None else None  # evaluate="trainer" needs it bound
        callback_preflight(
            self.schedule, model, f"RAMTrainerCallback({self.agent!r})", self.evaluate, self.merged_dir, bound
        )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> None:
        step, s = state.global_step, self.schedule
        self._optimizer = kwargs.get("optimizer") or self._optimizer
        epoch = int(state.epoch) if state.epoch is not None else None
        # DefaultFlowCallback ran first: control.should_save says this step's checkpoint is about to be written
        if step > s.last_snapshot_step and (
            s.should_snapshot(step, epoch) or self.snapshot_on_save and control.should_save
        ):
            with self._guard("snapshot", step, state):
                s.snapshot(model, step, epoch)
        if step > s.last_merge_step and s.should_merge(step, epoch):
            with self._guard("merge", step, state):
                self.merge_now(model, state)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any
    ) -> None:
        step = state.global_step
        self._optimizer = kwargs.get("optimizer") or self._optimizer
        with self._guard("last snapshot", step, state):
            if self.snapshot_on_train_end and step > 0 and self.schedule.last_snapshot_step < step:
                self.schedule.snapshot(model, step, int(state.epoch) if state.epoch is not None else None)
            self.schedule.flush()

    # ------------------------------------------------------------------------------------------- merging

    def merge_now(self, model: Any, state: TrainerState) -> dict[str, float]:
        """Merge the latest snapshot of every agent now, evaluate, save (under ``merged_dir``), log; afterwards a bound
        vLLM trainer pushes the agent's weights to vLLM again.

        Args:
            model: the model trained (a ``PeftModel``: the merge is of its LoRA adapters); the generalist is swapped
                in for the evaluation and swapped back.
            state: the trainer's ``TrainerState`` (its step, epoch, main-process flag and log history).

        Returns:
            The logged metrics, ``ram/``-prefixed: the merge's probe numbers, ``ram/search/*`` under ``search``, and
            the evaluation's.

        Raises:
            StoreError: training has not begun (the schedule is not attached); ``SnapshotNotFoundError`` (a
                ``StoreError``): the store holds no snapshot to merge.
            ConfigError: ``evaluate="trainer"`` and no trainer bound; this run's snapshots carry Adam importances
                and another agent's picked snapshot carries none (its agent named).
            SearchError: under ``search``, an evaluation that raised or returned no finite number.

        Warns:
            UnchangedAgentWarning: once per merge, naming the agents with density 0 (``last_result.extra``).
        """
        evaluate = self.evaluate
        if evaluate == "trainer":
            evaluate = self._trainer_evaluate
        epoch = int(state.epoch) if state.epoch is not None else None
        try:
            with quiet_unchanged():  # an agent that changed nothing is named once, below
                metrics = self.schedule.merge_and_evaluate(model, state.global_step, epoch, logged_as(evaluate, "trl"))
            result = self.last_result = self.schedule.last_result
            assert result is not None
            warn_single_agent(f"RAMTrainerCallback({self.agent!r})", result)
            warn_unchanged_agents(f"RAMTrainerCallback({self.agent!r})", result)
            if self.merged_dir is not None:
                self._save(model, result, state)
        finally:  # the generalist was swapped in and out: vLLM may hold it now
            self._force_vllm_resync()
        self._log(state, metrics)
        return metrics

    def _force_vllm_resync(self) -> None:
        force_vllm_resync(self.trainer, f"RAMTrainerCallback({self.agent!r})")

    def _trainer_evaluate(self, model: Any) -> dict[str, float]:
        return trainer_evaluation(self.trainer)

    def _save(self, model: Any, result: MergeResult, state: TrainerState) -> None:
        """``merged_dir/<agent>/step-<N>`` (or ``-v<k>``): the generalist ``save_pretrained`` (main process)."""
        if state.is_world_process_zero and self.merged_dir is not None:
            folder = agent_folder(self.merged_dir, self.agent)
            self.saved.append(save_trl_generalist(self.schedule, model, result, folder, self._processor))

    def _guard(self, what: str, step: int, state: TrainerState) -> Any:  # on_error (a failure logs ram/errors)
        return guarded_hook(
            self.schedule, f"RAMTrainerCallback({self.agent!r})", what, step, lambda m: self._log(state, m)
        )

    def _log(self, state: TrainerState, metrics: dict[str, float]) -> None:
        if self.trainer is not None:
            self.trainer.log(dict(metrics))
        else:  # without the trainer: into the log history that trainer_state.json keeps
            state.log_history.append({**metrics, "step": state.global_step})
