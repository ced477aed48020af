"""The front door: :func:`merge` for every method, :func:`ram_merge` for RAM and its variants."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn

from .engine.run import run_merge
from .engine.stream import DEFAULT_CHUNK_NUMEL
from .types import MergeInfo
from .errors import ConfigError, MissingBaseError, NoAgentsError
from .option_checks import shown
from .methods import RamStatistics, get_method, make_config, method_of_config
from .methods.ram.config import RamConfig
from .progress import ProgressHook, TerminalProgress
from .io.distributed import Distributed
from .io.model_files import base_files, provenance
from .io.side_files import PROVENANCE
from .io.sinks import DistributedSafetensorsSink, ModuleSink, SafetensorsSink, StateDictSink
from .importance import resolve_importance
from .io.sources import SafetensorsSource, TensorSource, ZerosSource, as_source, check_agent_names, iter_named

#: What ``dtype=`` may ask merged tensors to be stored as.
OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

__all__ = ["merge", "ram_merge", "merge_task_vectors"]

Model = nn.Module | Mapping[str, Tensor] | str | os.PathLike | TensorSource
Models = Sequence[Model] | Mapping[str, Model]


def check_run_options(device: Any, chunk_numel: Any, workers: Any) -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None) after checking the options every run takes, as
    :class:`~ram_live.errors.ConfigError`, before anything runs (used by :func:`merge` and
    :func:`ram_live.probe`).

    Args:
        device: must exist here: its backend available (``torch.<type>.is_available()``), its index below the
            device count (``"cuda:7"`` on a machine without 8 GPUs, ``"cpu:1"``, ``"xla"`` are refused).
        chunk_numel: a positive integer (not a bool or float).
        workers: None or a positive integer.

    >>> check_run_options("cpu", 2**20, None)
    device(type='cpu')
    """
    for name, value in (("chunk_numel", chunk_numel), ("workers", workers)):
        if value is None and name == "workers":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {shown(value)}")
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(f"device={shown(device)}: {exc}") from None
    if dev.type == "meta":
        raise ConfigError("device='meta' holds no values: merge on the device the weights are on, or cpu/cuda")
    backend = getattr(torch, dev.type, None)
    if backend is None or not callable(getattr(backend, "is_available", None)) or not backend.is_available():
        raise ConfigError(f"device={shown(device)}: no {dev.type} device is available here")
    count = backend.device_count() if callable(getattr(backend, "device_count", None)) else 1
    if dev.index is not None and dev.index >= count:
        raise ConfigError(
            f"device={shown(device)}: there {'is' if count == 1 else 'are'} only {count} {dev.type} "
            f"device{'' if count == 1 else 's'} here"
        )
    return dev


def input_sources(models: Models, base: Model | None) -> tuple[list[TensorSource], TensorSource]:
    """The agents and the base as :class:`~ram_live.io.sources.TensorSource` objects (names checked; a base the
    snapshots carry when ``base`` is None), for :func:`merge`, :func:`ram_live.probe` and the search."""
    named = list(iter_named(models))
    if not named:
        raise NoAgentsError("no agents to merge: `models` is empty")
    check_agent_names([n for n, _ in named])
    agents = [as_source(m, n) for n, m in named]
    if base is not None:
        return agents, as_source(base, "base")
    return agents, _carried_base(agents)


def _carried_base(agents: list[TensorSource]) -> TensorSource:
    """The base that agents carry themselves (task-vector snapshots, adapters): ``source.base_source()``."""
    bases = [a.base_source() if callable(getattr(a, "base_source", None)) else None for a in agents]
    if any(b is None for b in bases):
        missing = [a.name for a, b in zip(agents, bases) if b is None]
        raise MissingBaseError(
            f"agent(s) {', '.join(map(repr, missing))} do not carry their base model: pass it as `base=` (the model "
            "they were all trained from: an nn.Module, a state dict, or a checkpoint path)"
        )
    prints = {getattr(b, "fingerprint", id(b)) for b in bases}
    if len(prints) > 1:
        raise MissingBaseError("the agents carry different base models; pass the common base as `base=`")
    return bases[0]  # type: ignore[return-value]


def merge_task_vectors(
    task_vectors: Sequence[Mapping[str, Tensor]] | Mapping[str, Mapping[str, Tensor]],
    method: str | None = None,
    *,
    return_info: bool = False,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    **options: Any,
) -> Any:
    """Merge task vectors τ_t given directly (``{key: τ}`` per agent, e.g. LoRA ΔW) into τ* ``{key: τ*}``:
    :func:`merge` of ``θ₀ + τ_t`` onto a base θ₀ = 0.

    Args:
        task_vectors: ``{key: τ}`` per agent, a sequence or a mapping from agent name.
        method: as in :func:`merge` (default ``"ram_plus"``).
        return_info: also return the :class:`~ram_live.types.MergeInfo`.
        chunk_numel: entries per chunk.
        **options: :func:`merge`'s other keywords and the method's options.

    Returns:
        τ* as ``{key: tensor}`` (with ``return_info=True``: ``(τ*, MergeInfo)``).

    Raises:
        NoAgentsError: no task vectors; otherwise what :func:`merge` raises.

    >>> tau = merge_task_vectors([{"w": d1}, {"w": d2}], method="ram", eps=0.0)      # doctest: +SKIP
    """
    named = list(iter_named(task_vectors))
    if not named:
        raise NoAgentsError("no task vectors to merge")
    check_agent_names([n for n, _ in named])
    agents = [as_source(tv, n) for n, tv in named]
    return merge(
        agents,
        base=ZerosSource(agents[0], "zero base"),
        method=method,
        chunk_numel=chunk_numel,
        return_info=return_info,
        **options,
    )


def merge(
    models: Models,
    base: Model | None = None,
    method: str | None = None,
    *,
    inplace: bool = False,
    out: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    max_shard_bytes: int = 5 * 2**30,
    return_info: bool = False,
    progress: ProgressHook | bool | None = None,
    workers: int | None = None,
    process_group: Any = None,
    compile: bool | str = "auto",
    statistics: RamStatistics | None = None,
    config: Any = None,
    importance: Any = None,
    **options: Any,
) -> Any:
    """Merge ``models`` (agents fine-tuned from ``base``) with ``method``, tensor by tensor, on the device where the
    weights are, inputs untouched. Parameters are merged; buffers and non-float tensors come from the base.

    Args:
        models: the agents: ``nn.Module`` s, state dicts, safetensors files or Hugging Face folders (or cached
            ``org/name[@revision]`` ids), store snapshots, any :class:`~ram_live.io.sources.TensorSource`; a
            sequence, or a mapping from agent name.
        base: the model they were trained from (same kinds); None where the agents carry it (store snapshots).
        method: a registered method's name (``"ram"``, ``"ram_plus"``, ``"ram_plus_soft"``, ``"ties"``,
            ``"dare_ties"``, ...); default: ``config``'s method, else ``"ram_plus"``.
        inplace: write the merge into ``base`` (an ``nn.Module``), after a validation pass.
        out: write safetensors there and return its path: a ``*.safetensors`` file (the weights only), or a
            Hugging Face folder (sharded at ``max_shard_bytes``) that ``from_pretrained`` loads: with the base's
            config, generation config and tokenizer files (a base folder's or cached id's; a live transformers
            model's ``config``/``generation_config`` and the files of the folder it was loaded from; what a store
            kept of its base) and ``ram_merge.json``, which says what was merged (:mod:`ram_live.io.model_files`).
        device: where to merge (default: where each tensor is).
        dtype: the stored dtype of a state-dict or file output (float16, bfloat16, float32, float64).
        chunk_numel: entries per chunk (extra memory does not grow with the number of agents).
        max_shard_bytes: largest safetensors shard of ``out=``.
        return_info: also return a :class:`~ram_live.types.MergeInfo` (kernels, passes, λ and ρ, seconds).
        progress: ``True`` draws a bar on stderr (plain log lines, logger ``ram_live.progress``, where stderr is
            not a terminal); or a :class:`~ram_live.progress.ProgressHook`.
        workers: CPU threads that share each tensor's chunks (default: torch's thread count, at most 8).
        process_group: merge across the ranks of an initialised torch.distributed group (``True``: the default
            group): checkpoints are split tensor by tensor (each rank writes its shards of ``out=``, or returns a
            state dict of its own tensors), DTensor-sharded modules merge their local shards.
        compile: ``True`` runs a method's ``torch.compile`` kernels (RAM's: compiled once per process and number
            of agents); ``"auto"`` (default) compiles merges of at least 4 G agent-entries where a toolchain is
            there, except on CPU where the native C kernels are built (they are faster); ``False`` never. Where
            the method's fused device kernels merge (the RAM family on GPUs) nothing is compiled, whatever
            ``compile`` says. A toolchain that fails falls back to torch ops with a warning before anything is
            written. Every kernel of the RAM family gives the same bits (``RAM_LIVE_NATIVE=0`` turns the native
            ones off).
        statistics: the counts of an earlier merge or probe of the same inputs (``info.statistics``,
            ``report.statistics()``), to skip RAM+'s counting pass, e.g. in a sweep over ``r``. Checked: the same
            agents (names, order), activity rule and tensors (and a digest of each tensor's first and last 64
            entries). Methods without global counts ignore them; ``inplace=True`` counts again.
        config: the method's config (``RamConfig(...)``, ``TiesConfig(...)``); it names the method.
        importance: curvature-aware RAM (docs/curvature.md). None (default): plain RAM, also for snapshots that
            carry importances. ``{agent name: importances}``: each a state dict, a ``.safetensors`` file/folder, a
            TensorSource or a number, of non-negative values of the parameters' shapes (e.g.
            :func:`ram_live.importance.adam_importance`); the shared entries become the importance-weighted mean of
            the active agents' τ (equal importances: RAM's bits). ``"stored"``: the importances stored with the
            store snapshots being merged. ``MergeInfo.extra["importance"]`` says ``"given"`` or ``"stored"``.
        **options: the method's options as keywords (``r=0.2``, ``density=0.2``), instead of ``config``.

    Returns:
        What ``base`` is: a new ``nn.Module`` of the base's structure, the base itself with ``inplace=True``, or a
        state dict (also for a path base); the path written with ``out=``; with ``return_info=True``,
        ``(result, MergeInfo)``.

    Raises:
        ConfigError: an unknown option or a bad value; a method name and a config that disagree
            (``method="ram", config=RamConfig()``, which is RAM+); RAM options given both ways; ``importance=``
            other than None, a mapping or ``"stored"``, or ``"stored"`` where an agent carries none (named).
        UnknownMethodError: ``method`` is not registered.
        NoAgentsError / MissingBaseError: no agents, or no base to merge onto.
        InputMismatchError: names, shapes or dtypes that disagree, or invalid importances (agent and tensor named).
        NonFiniteError: a NaN/Inf input or merged value (tensor and agent named), before an in-place merge writes.
        OutputExistsError / OutOfSpaceError: ``out=`` exists, or the disk cannot hold it (nothing left behind).

    >>> merged = merge([coder, tool_agent], base=base_model, method="ties", density=0.2)   # doctest: +SKIP
    >>> sd = merge({"a": sd_a, "b": sd_b}, base=base_sd, method="task_arithmetic", scale=0.5)  # doctest: +SKIP
    """
    dev = check_run_options(device, chunk_numel, workers)
    if method is None:
        method = method_of_config(config) if config is not None else "ram_plus"
    method_obj = get_method(method)
    cfg = make_config(method, config, **options)
    agents, base_src = input_sources(models, base)
    # None: plain RAM; "stored": the snapshots' (an excluded agent needs none)
    weights, how = resolve_importance(importance, agents, getattr(cfg, "exclude", ()))
    aux = None if weights is None else {"importance": weights}
    if inplace and not isinstance(base, nn.Module):
        raise ConfigError("inplace=True needs the base to be an nn.Module")
    if inplace and out is not None:
        raise ConfigError("pass either inplace=True or out=, not both")
    if dtype is not None and (inplace or (out is None and isinstance(base, nn.Module))):
        raise ConfigError("dtype= applies to state-dict and file outputs only")
    if dtype is not None and dtype not in OUTPUT_DTYPES:
        raise ConfigError(f"dtype= must be one of {', '.join(map(str, OUTPUT_DTYPES))}, got {shown(dtype)}")
    dist = None
    if process_group is not None and process_group is not False:
        dist = Distributed(
            None if process_group is True else process_group, sharded=bool(getattr(base_src, "sharded", False))
        )
        if not dist.sharded and isinstance(base, nn.Module) and out is None:
            raise ConfigError(
                "process_group with modules whose parameters are not DTensors: pass out= (each rank "
                "writes its shards), or shard the modules (FSDP2/DTensor) to merge them in place"
            )
    if out is not None:
        side = base_files(base, base_src, dtype)  # config, generation config, tokenizer: read before anything runs
        split = dist is not None and not dist.sharded
        sink: Any = (DistributedSafetensorsSink if split else SafetensorsSink)(
            out, copy_from=side.copy_from, files=side.files, dtype=dtype, max_shard_bytes=max_shard_bytes
        )
    elif isinstance(base, nn.Module):
        sink = ModuleSink(base, inplace=inplace)
    else:
        sink = StateDictSink(device=dev if isinstance(base_src, SafetensorsSource) or dev else None, dtype=dtype)
    try:
        info: MergeInfo = run_merge(
            base_src,
            agents,
            method_obj,
            cfg,
            sink,
            device=dev,
            chunk_numel=chunk_numel,
            validate_first=inplace,
            progress=TerminalProgress() if progress is True else (progress or None),
            workers=workers,
            dist=dist,
            compile=compile,
            statistics=statistics,
            auxiliary=aux,
        )
        if how is not None:
            info.extra["importance"] = how
        if out is not None and not sink.single and (dist is None or dist.rank == 0):
            given = dict(iter_named(models)) if isinstance(models, (Mapping, list, tuple)) else {}
            sink.files[PROVENANCE] = provenance(agents, base_src, given, base, side.about, info, dtype)
        result = sink.finish()
    except BaseException:
        sink.abort()
        raise
    return (result, info) if return_info else result


def ram_merge(
    models: Models,
    base: Model | None = None,
    config: RamConfig | None = None,
    **kwargs: Any,
) -> Any:
    """Reinforced Agent Merging (paper Eq. 7) of agents RL-trained from ``base``: :func:`merge` with a
    :class:`~ram_live.methods.ram.config.RamConfig` (default ``RamConfig()``: RAM+ with the paper's r = 0.1, α = 2).

    Args:
        models, base: the agents and the model they were trained from (see :func:`merge` for inputs and outputs).
        config: the merge: ``lam`` (``Unit()``: λ = 1; ``RhoClip(r, alpha)``: λ_t = 1 + r·clip(ρ_t, 0, alpha);
            ``RhoSoft(r)``: λ_t = 1 + r·ρ_t/(1+ρ_t); ``Given({agent: λ})``), ``rho_scope``, ``activity``, ``eps``,
            ``exclude``, ``shared``. The authors' script: ``RhoClip(r=0.2, alpha=1.0)``; mergekit ``ramplus_tl``:
            ``RamConfig(lam=RhoClip(r=0.1, alpha=0.2), rho_scope="tensor")``.
        **kwargs: :func:`merge`'s keywords (``out``, ``inplace``, ``device``, ``dtype``, ``chunk_numel``,
            ``max_shard_bytes``, ``return_info``, ``progress``, ``workers``, ``process_group``, ``compile``,
            ``statistics``, ``importance``: None (plain RAM), ``{agent: importances}`` or ``"stored"`` for
            curvature-aware RAM, docs/curvature.md).

    Returns:
        What :func:`merge` returns.

    Raises:
        ConfigError: ``method=`` or flat RAM options (``r=0.2``: put them in the config, or call
            ``merge(models, base, method="ram_plus", r=0.2)``), or a config that is not a :class:`RamConfig`.

    >>> generalist = ram_merge([coder, tool_agent, memory_agent], base=base_model)          # doctest: +SKIP
    >>> generalist = ram_merge(agents, base_model, RamConfig(lam=RhoClip(r=0.2, alpha=1.0)))  # doctest: +SKIP
    >>> sweep = [ram_merge(agents, base_model, RamConfig(lam=RhoClip(r=r)), statistics=info.statistics)
    ...          for r in (0.05, 0.1, 0.2)]                       # doctest: +SKIP
    """
    if "method" in kwargs:
        raise ConfigError(
            "ram_merge takes no method=: the config is the method (RamConfig(lam=...)); "
            "merge(models, base, method=...) runs any method"
        )
    flat = sorted(set(kwargs) & {f for m in ("ram", "ram_plus", "ram_plus_soft") for f in RamConfig.flat_names(m)})
    if flat:
        raise ConfigError(
            f"ram_merge takes the RAM options in config=RamConfig(...), not as keywords "
            f"({', '.join(flat)}); or merge(models, base, method='ram_plus', {flat[0]}=...)"
        )
    if config is not None and not isinstance(config, RamConfig):
        raise ConfigError(f"ram_merge: config must be a RamConfig, got {type(config).__name__}")
    return merge(models, base, config=config if config is not None else RamConfig(), **kwargs)
