"""The ``ram`` config group of a verl run: every option of the integration, validated at start-up.

On verl's command line (Hydra, struct mode) new keys take a ``+``::

    +ram.store=/shared/ram_store +ram.agent=coder +ram.merge_every=2

:func:`options_from_verl` reads the group from the trainer's config, fills what verl already knows (the base
model's path, the checkpoint folder) and checks the verl settings the integration relies on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from ram_live.errors import ConfigError
from ram_live.methods.ram.config import FLAT_NAMES, RamConfig
from ram_live.training.failures import ON_ERROR, check_on_error

from .checks import check_choice, check_int, check_number
from .dotted import get_dotted
from .dotted import plain as _plain
from .remote import check_eval_resources, check_eval_timeout
from .rewards import check_rewards, run_reward_function

__all__ = [
    "DTYPES",
    "EVAL_RESOURCES",
    "EVAL_RESOURCES_CPU",
    "EVAL_TIMEOUT",
    "RAM_KEYS",
    "SPARSIFY",
    "WEIGHTS",
    "RAMVerlOptions",
    "options_from_mapping",
    "options_from_verl",
]

WEIGHTS = ("master", "bf16", "fp16", "fp32")
DTYPES = ("auto", "bf16", "fp16", "fp32")
SPARSIFY = ("auto", "topk", "relative", None)
#: the evaluation actor's Ray resources when ``ram.eval_resources`` is not set: one whole GPU
EVAL_RESOURCES = {"num_gpus": 1}
#: ... and with ``ram.rewards.device=cpu``: one CPU of a Ray worker (still not the driver)
EVAL_RESOURCES_CPU = {"num_cpus": 1}
#: ``ram.eval_timeout``'s default, in seconds
EVAL_TIMEOUT = 3600.0
#: The ``ram.*`` keys of RAM's config: ``ram.variant`` (the short method name) and the flat keywords.
RAM_KEYS = ("variant", *FLAT_NAMES)


@dataclass
class RAMVerlOptions:
    """Options of the verl integration (the ``ram`` config group; the keys are the field names). Build them with
    :func:`options_from_verl` or :func:`options_from_mapping`, or call :meth:`validate`: the constructor checks
    nothing. The snapshot options come first, then (from ``merge_every``) the merge options.

    Attributes:
        store: the snapshot store folder shared by every agent's run (required).
        agent: this run's agent name, a folder of the store (required).
        base: the base model every agent was trained from, a Hugging Face folder. Default: verl's
            ``actor_rollout_ref.model.path``.
        weights: what a snapshot records. ``"master"``: the actor's weights as checkpointed (fp32 master weights
            under verl's default ``model_dtype: fp32``); ``"bf16"`` / ``"fp16"`` / ``"fp32"``: their cast to that
            dtype (``bf16``: what a released bf16 checkpoint of this step would hold). The store's base is kept in
            the same dtype, so one store holds one setting. Recorded in each manifest (``extra.verl.weights``).
        snapshot_every: snapshot every this many checkpoint saves (default 1: every save).
        snapshot_activity, snapshot_eps: ``"changed"`` (lossless, default) or ``"abs"`` (keep |τ| > snapshot_eps).
        keep: keep only this agent's newest ``keep`` snapshots in the store.
        lora: ``"auto"`` (LoRA checkpoints are detected by their ``lora_A``/``lora_B`` tensors), ``True`` or
            ``False``. A LoRA snapshot holds base + ΔW (ΔW = s·B·A per target module, in float32).
        lora_rank, lora_alpha: override what ``lora_train_meta.json`` / verl's ``actor_rollout_ref.model`` say.
        sparsify, density, threshold: the activity rule on LoRA ΔW at merge time, ``sparsify=`` of
            :mod:`ram_live.peft` (its :class:`~ram_live.peft.TopK` / :class:`~ram_live.peft.RelativeThreshold`):
            ``"auto"`` (default: ``TopK(0.5)``, :data:`~ram_live.peft.RECOMMENDED_SPARSIFY`), ``"topk"`` (keep the
            ``density`` fraction of largest |ΔW| per agent and module; default 0.2), ``"relative"`` (keep |ΔW| >
            ``threshold``·RMS(ΔW); default 1.0) or ``None`` (|τ| > eps: on dense ΔW a plain mean). Merges of LoRA
            snapshots then use ``eps=0`` (the rule decides what is active); full-weight snapshots are merged as
            they are (their task vectors are sparse already).
        max_part_bytes: a snapshot's changed values are written in part files of about this size (the most
            memory the encoding holds at once, besides one rank's memory-mapped shard file).
        merge_every: merge the latest snapshot of every agent in the store every this many saves (None: never),
            and at the last training step.
        merged_dir: where merged models go, one Hugging Face folder per merge, ``<agent>/global_step_<N>`` (so that
            several agents' runs may share one; never replaced: ``global_step_<N>-v1``, ... where taken). Default:
            ``<trainer.default_local_dir>/ram_merged``.
        keep_merged: keep only the newest ``keep_merged`` merged folders of this agent (None: all).
        merged_dtype: dtype of the merged weights: ``"auto"`` (the base model's), ``"bf16"``, ``"fp16"``, ``"fp32"``.
        agents: merge only these agents (default: every agent of the store).
        variant, r, alpha, eps, activity, rho_scope, lambdas, exclude, shared: RAM's config, the keys users
            had: ``ram.variant`` is the short method name (``ram``, ``ram_plus``, ``ram_plus_soft``) and the others
            its flat keywords (``merge(method=variant, r=..., ...)``); held as one :class:`~ram_live.RamConfig` in
            ``ram`` (``opts.ram.lam``, ``opts.ram.method``). A key the variant does not take (``ram.r`` with
            ``ram.variant=ram``, ``ram.alpha`` with ``ram_plus_soft``) is refused.
        evaluate: dotted path of ``fn(merged_dir: str, step: int) -> dict[str, float]`` (``pkg.mod.fn`` or
            ``pkg.mod:fn``), called after each merge; its scores are logged as ``ram/<name>``.
        search: the options of a :class:`~ram_live.training.search.SearchSetting` (``+ram.search.budget=60
            +ram.search.metric=acc +ram.search.evaluate=pkg.mod:fn``): each merge is then the one
            :func:`ram_live.search` picks with that held-out evaluation (default: ``evaluate``), each candidate
            evaluated in a folder under ``merged_dir``; logs ``ram/search/*``; the chosen options go into the
            merged folder's ``ram_merge.json`` (``"search"``) and ``ram_search.json``. Its ``variant``/``r``/...
            above are then unused. ``+ram.search.sampler=optuna-tpe`` (``tpe``, ``moves``, ...), ``.storage=`` and
            ``.study=NAME``: as the setting's (a study per merge, ``NAME:<agent>:<run>:step_<step>:<inputs>``).
        rewards: the run's own reward on held-out prompts as the evaluation (instead of ``evaluate``; also what
            ``search`` uses, maximising ``reward``): ``+ram.rewards.prompts=held_out.jsonl`` (verl's rows),
            optional ``compute_score`` / ``reward`` (default: verl's ``custom_reward_function``, else its
            ``default_compute_score``), ``max_new_tokens``, ``batch_size``, ``device``, ``dtype``, ``generate``
            (``vllm``: generated with vLLM) (:mod:`.rewards`).
        eval_resources: inside a Ray job (verl's driver), the evaluations (``evaluate``, ``rewards``, ``search``'s)
            run in one Ray actor, never on the driver (:mod:`.remote`); its ``.options(...)``: ``num_gpus``,
            ``num_cpus``, ``memory``, ``resources`` (custom resources), ``accelerator_type``. Default
            :data:`EVAL_RESOURCES` (``{"num_gpus": 1}``; :data:`EVAL_RESOURCES_CPU` with ``rewards.device=cpu``).
            A cluster without a GPU is refused at start-up unless these ask for none. Outside Ray: unused.
        eval_timeout: seconds the evaluation actor may take to be placed (first evaluation) and each evaluation to
            finish (default :data:`EVAL_TIMEOUT`, an hour); past it, an EvaluationError naming this key.
        durable: fsync snapshot files before their manifest.
        importance: ``"adam"`` (default): store each rank's ``exp_avg_sq`` boxes from the checkpoint's
            ``optim_world_size_W_rank_R.pt`` with the snapshot (never gathered; :mod:`.optim`), and the merges
            weigh by them (``importance="stored"``, docs/curvature.md); a checkpoint without usable optimizer state
            (no ``optimizer`` in ``save_contents``): one warning, a snapshot without. Merges are plain RAM where no
            agent's snapshots carry importances (LoRA snapshots never do), and a ConfigError naming the agents
            without where only some do. ``null``: never, plain RAM.
        importance_bias_correction: divide ``exp_avg_sq`` by 1 − β₂^step (default false).
        on_error: ``"warn"`` (default): a snapshot, merge, evaluation or search that fails at a checkpoint save is
            a ``MergeFailedWarning`` and ``ram/errors`` (training goes on; the next merge tries again);
            ``"raise"``: it ends training (:mod:`ram_live.training.failures`).
        save_freq, checkpoint_root: filled by :func:`options_from_verl` from verl's ``trainer.save_freq`` and
            ``trainer.default_local_dir`` (not ``ram.*`` keys).

    Example:
        >>> opts = RAMVerlOptions(store="runs/ram", agent="coder", merge_every=2).validate()  # doctest: +SKIP
    """

    store: str = ""
    agent: str = ""
    base: str | None = None
    weights: str = "master"
    snapshot_every: int = 1
    snapshot_activity: str = "changed"
    snapshot_eps: float = 0.0
    keep: int | None = None
    lora: Any = "auto"
    lora_rank: int | None = None
    lora_alpha: float | None = None
    sparsify: str | None = "auto"
    density: float | None = None
    threshold: float | None = None
    max_part_bytes: int = 1 << 30
    merge_every: int | None = None
    merged_dir: str | None = None
    keep_merged: int | None = None
    merged_dtype: str = "auto"
    agents: list[str] | None = None
    evaluate: str | None = None
    search: Any = None
    rewards: Any = None
    eval_resources: Any = None
    eval_timeout: float = EVAL_TIMEOUT
    durable: bool = True
    importance: str | None = "adam"
    importance_bias_correction: bool = False
    on_error: str = ON_ERROR[0]
    #: RAM's config (the ``ram.variant``, ``ram.r``, ... keys)
    ram: RamConfig = field(default_factory=RamConfig, repr=False)
    # filled from verl's config (not ram.* keys a user sets)
    save_freq: int | None = field(default=None, repr=False)
    checkpoint_root: str | None = field(default=None, repr=False)

    def validate(self) -> RAMVerlOptions:
        """Check every option and normalise it in place: ``store`` / ``base`` as strings, ``ram`` a
        :class:`~ram_live.RamConfig`, ``search`` a :class:`~ram_live.training.search.SearchSetting` (its metric
        ``reward`` when ``ram.rewards`` evaluates), ``rewards`` / ``eval_resources`` / ``eval_timeout`` checked.

        Returns:
            ``self``, validated.

        Raises:
            ConfigError: naming the key at fault: ``store`` or ``agent`` missing; an invalid agent name, choice,
                number, RAM key (one the variant does not take), LoRA rule (:meth:`lora_rule`), ``agents``,
                ``evaluate`` (not a dotted path), ``rewards``, ``eval_resources``, ``eval_timeout`` or ``search``;
                both ``evaluate`` and ``rewards``; ``search`` without an evaluation or without ``merge_every``.
        """
        from ram_live.store import SnapshotStore

        if not self.store or not isinstance(self.store, (str, os.PathLike)):
            raise ConfigError(
                "ram.store is required: the snapshot store folder shared by the agents' runs "
                "(e.g. +ram.store=/shared/ram_store)"
            )
        self.store = os.fspath(self.store)
        if not self.agent:
            raise ConfigError("ram.agent is required: this run's agent name (e.g. +ram.agent=coder)")
        try:
            SnapshotStore.check_agent(str(self.agent))
        except ConfigError as exc:
            raise ConfigError(f"ram.agent: {exc}") from None
        self.agent = str(self.agent)
        check_choice("weights", self.weights, WEIGHTS)
        check_choice("merged_dtype", self.merged_dtype, DTYPES)
        check_choice("snapshot_activity", self.snapshot_activity, ("changed", "abs"))
        check_choice("importance", self.importance, ("adam", None))
        check_choice("importance_bias_correction", self.importance_bias_correction, (True, False))
        check_on_error(self.on_error, "ram.on_error")
        for name in ("snapshot_every", "max_part_bytes"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("keep", "keep_merged", "merge_every", "lora_rank"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=1)
        check_number("snapshot_eps", self.snapshot_eps)
        self.ram = RamConfig.from_dict(self.ram, prefix="ram.", method_key="variant")
        if self.lora_alpha is not None:
            check_number("lora_alpha", self.lora_alpha)
        if self.lora not in ("auto", True, False):
            raise ConfigError(f"ram.lora must be 'auto', true or false, got {self.lora!r}")
        self.lora_rule()
        if self.agents is not None:
            if isinstance(self.agents, str) or not isinstance(self.agents, Sequence):
                raise ConfigError(f"ram.agents must be a list of agent names, got {self.agents!r}")
            self.agents = [SnapshotStore.check_agent(str(a)) for a in self.agents]
        if self.evaluate is not None:
            if not isinstance(self.evaluate, str) or "." not in self.evaluate.replace(":", "."):
                raise ConfigError(
                    f"ram.evaluate must be a dotted path 'package.module.function', got {self.evaluate!r}"
                )
        if self.base is not None:
            self.base = os.fspath(self.base)
        if self.rewards is not None:
            if self.evaluate is not None:
                raise ConfigError("set ram.evaluate or ram.rewards (the run's reward on held-out prompts), not both")
            self.rewards = check_rewards(_plain(self.rewards))
        self.eval_resources = check_eval_resources(_plain(self.eval_resources))
        self.eval_timeout = check_eval_timeout(self.eval_timeout)
        if self.search is not None:
            from ram_live.training.search import SearchSetting

            try:
                self.search = SearchSetting.from_mapping(self.search)
            except ConfigError as exc:
                raise ConfigError(f"ram.search: {exc}") from None
            if self.search.evaluate is None and self.evaluate is None and self.rewards is None:
                raise ConfigError(
                    "ram.search needs an evaluation: set ram.search.evaluate, ram.evaluate or ram.rewards.prompts"
                )
            if self.search.evaluate is None and self.rewards is not None and self.search.metric is None:
                self.search = replace(self.search, metric="reward")  # ram.rewards' mean reward
            if self.merge_every is None:
                raise ConfigError("ram.search is set but ram.merge_every is not: nothing would be searched")
        return self

    def lora_rule(self) -> Any:
        """The activity rule the merge applies to LoRA ΔW (``ram.sparsify``, ``ram.density``, ``ram.threshold``),
        built by :mod:`ram_live.peft`'s own ``sparsify=`` rules and checks.

        Returns:
            A :class:`~ram_live.peft.TopK` / :class:`~ram_live.peft.RelativeThreshold`, or None (|τ| > eps):
            ``"auto"`` is ``TopK(0.5)`` for the RAM family and None for other methods.

        Raises:
            ConfigError: naming the key: ``sparsify`` not one of ``"auto"``, ``"topk"``, ``"relative"``, None;
                ``density`` / ``threshold`` without its ``sparsify`` kind, not a number, or out of range.
        """
        from ram_live.peft.sparsify import RelativeThreshold, TopK, sparsify_rule

        check_choice("sparsify", self.sparsify, SPARSIFY)
        for name, kind in (("density", "topk"), ("threshold", "relative")):
            value = getattr(self, name)
            if value is None:
                continue
            if self.sparsify != kind:
                raise ConfigError(
                    f"ram.{name} is the parameter of ram.sparsify={kind}; got ram.sparsify={self.sparsify!r}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"ram.{name} must be a number; got {value!r}")
            try:
                return TopK(value) if kind == "topk" else RelativeThreshold(value)
            except ConfigError as exc:
                raise ConfigError(f"ram.{name}: {exc}") from None
        return sparsify_rule(self.sparsify, self.ram.method)

    @classmethod
    def keys(cls) -> list[str]:
        """The ``ram.*`` keys a user may set.

        Returns:
            The integration's own keys (the fields, less ``ram``, ``save_freq``, ``checkpoint_root``), then RAM's
            config's (:data:`RAM_KEYS`: ``variant`` and the flat keywords).
        """
        return [f.name for f in fields(cls) if f.repr] + list(RAM_KEYS)


def options_from_mapping(values: Mapping[str, Any] | None, **defaults: Any) -> RAMVerlOptions:
    """Options from a plain mapping (the ``ram`` group as a dict), validated.

    Args:
        values: the ``ram.*`` keys and their values (None: none).
        **defaults: values for keys ``values`` does not set (a None default is ignored).

    Returns:
        The :class:`RAMVerlOptions`, validated (:meth:`RAMVerlOptions.validate`).

    Raises:
        ConfigError: an unknown key (the valid ones named), an invalid RAM key or value (the key named).

    Example:
        >>> opts = options_from_mapping({"store": "runs/ram", "agent": "coder", "merge_every": 2})  # doctest: +SKIP
    """
    values = dict(values or {})
    allowed = RAMVerlOptions.keys()
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ConfigError(
            f"unknown ram option(s) {', '.join('ram.' + u for u in unknown)}; the options are: {', '.join(allowed)}"
        )
    merged = {**{k: v for k, v in defaults.items() if v is not None}, **values}
    ram = RamConfig.from_dict({k: merged.pop(k) for k in RAM_KEYS if k in merged}, prefix="ram.", method_key="variant")
    return RAMVerlOptions(**merged, ram=ram).validate()


def options_from_verl(config: Any) -> RAMVerlOptions:
    """The ``ram`` group of a verl trainer config (``DictConfig``), validated, with verl's own settings checked:
    checkpoints are saved (``trainer.save_freq > 0``) with the model (``checkpoint.save_contents``), by the
    FSDP/FSDP2 actor (Megatron's distributed checkpoints are another format), synchronously.

    Args:
        config: verl's full trainer config. ``ram.base`` defaults to ``actor_rollout_ref.model.path``,
            ``ram.merged_dir`` to ``<trainer.default_local_dir>/ram_merged``, ``ram.lora_rank`` / ``lora_alpha`` to
            ``actor_rollout_ref.model``'s, ``ram.rewards``' score function to the run's ``custom_reward_function``.

    Returns:
        The :class:`RAMVerlOptions`, validated, with ``save_freq`` and ``checkpoint_root`` filled.

    Raises:
        ConfigError: no ``ram`` group, or not a mapping; as :func:`options_from_mapping`; ``trainer.save_freq``
            <= 0; an actor strategy other than ``fsdp`` / ``fsdp2``; ``save_contents`` without ``model``;
            ``async_save``; ``merge_every`` without ``merged_dir`` or ``trainer.default_local_dir``; no base.

    Example:
        >>> opts = options_from_verl(config)  # doctest: +SKIP
    """
    group = get_dotted(config, "ram")
    if group is None:
        raise ConfigError(
            "the verl config has no `ram` group: add +ram.store=<folder> +ram.agent=<name> to the "
            "command line (see the README's verl section)"
        )
    values = _plain(group)
    if not isinstance(values, Mapping):
        raise ConfigError(f"the `ram` config group must be a mapping, got {type(values).__name__}")
    model_path = get_dotted(config, "actor_rollout_ref.model.path")
    opts = options_from_mapping(
        values,
        base=str(model_path) if model_path is not None and values.get("base") is None else None,
        lora_rank=None,
    )
    save_freq = get_dotted(config, "trainer.save_freq")
    if save_freq is not None:
        save_freq = int(save_freq)
        if save_freq <= 0:
            raise ConfigError(
                f"ram: trainer.save_freq is {save_freq}, so verl saves no checkpoint and no snapshot "
                "would be taken; set trainer.save_freq=<steps>"
            )
    opts.save_freq = save_freq
    strategy = get_dotted(config, "actor_rollout_ref.actor.strategy")
    if strategy is not None and str(strategy) not in ("fsdp", "fsdp2"):
        raise ConfigError(
            f"ram: actor_rollout_ref.actor.strategy={strategy!r}; the integration reads FSDP/FSDP2 "
            "checkpoints (model_world_size_W_rank_R.pt) only"
        )
    contents = _plain(get_dotted(config, "actor_rollout_ref.actor.checkpoint.save_contents"))
    if contents is not None and "model" not in list(contents):
        raise ConfigError(
            f"ram: actor_rollout_ref.actor.checkpoint.save_contents={list(contents)} does not save "
            "the model; add 'model'"
        )
    if bool(get_dotted(config, "actor_rollout_ref.actor.checkpoint.async_save", False)):
        raise ConfigError(
            "ram: actor_rollout_ref.actor.checkpoint.async_save=true: the checkpoint files are not "
            "complete when the callback runs; disable async_save"
        )
    root = get_dotted(config, "trainer.default_local_dir")
    opts.checkpoint_root = str(root) if root is not None else None
    if opts.merged_dir is None and opts.merge_every is not None:
        if opts.checkpoint_root is None:
            raise ConfigError("ram.merged_dir is required when trainer.default_local_dir is not set")
        opts.merged_dir = os.path.join(opts.checkpoint_root, "ram_merged")
    if opts.lora_rank is None:
        rank = get_dotted(config, "actor_rollout_ref.model.lora_rank")
        if rank:
            opts.lora_rank = int(rank)
            alpha = get_dotted(config, "actor_rollout_ref.model.lora_alpha")
            if opts.lora_alpha is None and alpha is not None:
                opts.lora_alpha = float(alpha)
    if opts.base is None:
        raise ConfigError("ram.base is not set and the config has no actor_rollout_ref.model.path")
    if opts.rewards is not None and not opts.rewards.get("compute_score") and not opts.rewards.get("reward"):
        opts.rewards["compute_score"] = run_reward_function(config)  # the run's own reward (None: verl's default)
    return opts
