"""Merging the LoRA adapters of a live ``PeftModel``: into a new adapter on it, or into its base weights."""

from __future__ import annotations

import copy
import time
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..engine.stream import DEFAULT_CHUNK_NUMEL
from ..errors import ConfigError
from .configs import merged_fan_in_fan_out, new_config_fields
from .factors import AdapterSet
from .live import read_live, tuner_of
from .merging import check_options, finish_report, merge_in_delta_space, merge_into_base, prepare_merge, PreparedMerge
from .refactoring import Refactored, make_refactorer
from .report import AdapterMergeReport
from .spellings import peft_spellings
from .svd_options import SvdOptions


def ram_merge_adapters(
    peft_model: Any,
    adapters: Sequence[str] | None = None,
    new_adapter: str = "merged",
    method: str = "ram_plus",
    *,
    svd_options: SvdOptions | None = None,
    sparsify: Any = "auto",
    into_base: bool = False,
    inplace: bool = False,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    warn_dense: bool = True,
    return_info: bool = False,
    **options: Any,
) -> Any:
    """Merge LoRA adapters of a live ``PeftModel`` in ΔW space, into a new adapter (default) or its base weights.

    For each target module ΔW_t = s_t · B_t A_t with that adapter's exact scaling (the layer's own ``scaling``:
    rsLoRA, ``rank_pattern``, ``alpha_pattern``); a module an adapter does not target is ΔW = 0 for it. The merged
    ΔW* is re-factored (:func:`refactor`) into the new adapter, or folded into the base weights. PEFT's
    ``add_weighted_adapter`` spellings are taken where they mean the same (``combination_type="svd"|"ties_svd"|
    "dare_linear_svd"|"dare_ties_svd"``, ``svd_rank=``, ``majority_sign_method=``, ``adapter_name=``).

    Args:
        peft_model: a ``PeftModel`` with LoRA adapters (or a ``LoraModel``).
        adapters: the adapters' names (default: all of the model's).
        new_adapter: the name of the merged adapter, added to ``peft_model`` (not activated: call
            ``peft_model.set_adapter``; saved by ``save_pretrained``).
        method: any method of the registry (``"ram_plus"``, ``"ram"``, ``"ties"``, ...).
        svd_options: an :class:`SvdOptions` (``rank`` defaults to the largest input rank; ``energy`` picks a rank
            per module); or its old keywords ``rank=``, ``energy=``, ``svd=``, ``oversample=``, ``niter=``,
            ``seed=`` in ``options``, not both.
        sparsify: the activity rule for dense ΔW: ``"auto"`` (:data:`RECOMMENDED_SPARSIFY` for the RAM family,
            none for other methods), ``None`` (the paper's |Δ| > eps), :class:`TopK`, :class:`RelativeThreshold`,
            ``"topk"``, ``"relative"``, ``("topk", 0.1)`` or ``("relative", 1.0)``.
        into_base: fold ΔW* into the base weights of a copy of the model without any adapter.
        inplace: with ``into_base``, fold into ``peft_model``'s own base, whose adapters are removed (``unload``).
        chunk_numel: the engine's chunk size, in elements.
        warn_dense: warn (:class:`DenseDeltaWarning`) when a RAM method without a sparsifying rule sees dense ΔW.
        return_info: also return the :class:`AdapterMergeReport`.
        **options: the method's config (``r``/``alpha``/``rho_scope`` of RAM+, ``weights``, ``density``, ...).

    Returns:
        ``peft_model`` with the new adapter; with ``into_base=True`` the merged plain model (on the model's device;
        with ``inplace=True`` the unloaded base itself); ``(result, AdapterMergeReport)`` with ``return_info``.

    Raises:
        ConfigError: an unknown method, bad method / SVD / ``sparsify`` options, a PEFT spelling without an
            equivalent, an adapter name missing or repeated, ``new_adapter`` taken, ``inplace`` without
            ``into_base``, or ``into_base`` on layers with adapters merged into their weights.
        UnsupportedAdapterError: not a LoRA model, or an adapter that cannot be merged exactly (DoRA,
            ``lora_bias``, conv layers, ``modules_to_save``, ...).
        InputMismatchError: adapters whose ΔW of a module differ in shape or layout.
        MissingDependencyError: ``peft`` is not installed.

    Example:
        >>> ram_merge_adapters(peft_model, ["code", "tool"], "generalist",
        ...                    svd_options=SvdOptions(rank=16, svd="exact"))        # doctest: +SKIP
    """
    t0 = time.perf_counter()
    options = dict(options)
    svd_keywords = SvdOptions.take(options)
    method, rank, options, new_adapter = peft_spellings(
        method, svd_keywords.pop("rank", None), options, method_given=method != "ram_plus", new_adapter=new_adapter
    )
    svd_opts = check_options(svd_options, svd_keywords, rank, inplace, into_base, "ram_merge_adapters")
    adapter_set = read_live(peft_model, adapters)
    prep = prepare_merge(adapter_set, method, options, sparsify)
    report = AdapterMergeReport(adapter_set.names, "base weights" if into_base else f"adapter {new_adapter!r}")
    _, root = tuner_of(peft_model)
    with torch.no_grad():
        if into_base:
            result = _live_into_base(peft_model, root, adapter_set, prep, inplace, chunk_numel, report, warn_dense)
        else:
            if new_adapter in peft_model.peft_config:
                raise ConfigError(f"the model already has an adapter named {new_adapter!r}")
            refactorer = make_refactorer(adapter_set, report, svd_opts)
            info = merge_in_delta_space(adapter_set, prep, refactorer, device=None, chunk_numel=chunk_numel)
            report.merge_seconds = info.seconds
            _add_live_adapter(peft_model, root, adapter_set, new_adapter, refactorer.factors)
            result = peft_model
            finish_report(prep, info, report, warn_dense)
    report.seconds = time.perf_counter() - t0
    return (result, report) if return_info else result


def _add_live_adapter(
    peft_model: Any, root: nn.Module, adapters: AdapterSet, new_adapter: str, factors: Mapping[str, Refactored]
) -> None:
    from peft import LoraConfig

    first = adapters.configs[adapters.names[0]]
    config = LoraConfig(
        **new_config_fields(factors),
        fan_in_fan_out=merged_fan_in_fan_out(adapters, factors),
        lora_dropout=getattr(first, "lora_dropout", 0.0),
        bias="none",
        task_type=getattr(first, "task_type", None),
        base_model_name_or_path=getattr(first, "base_model_name_or_path", None),
        revision=getattr(first, "revision", None),
        inference_mode=getattr(first, "inference_mode", False),
    )
    peft_model.add_adapter(new_adapter, config)
    for module_name, out in factors.items():
        layer = root.get_submodule(module_name)
        scaling = float(layer.scaling[new_adapter])
        if adapters.module(module_name).kind == "embedding":
            a_param, b_param = layer.lora_embedding_A[new_adapter], layer.lora_embedding_B[new_adapter]
        else:
            a_param, b_param = layer.lora_A[new_adapter].weight, layer.lora_B[new_adapter].weight
        if tuple(a_param.shape) != tuple(out.A.shape) or tuple(b_param.shape) != tuple(out.B.shape):
            raise AssertionError(  # pragma: no cover - a change of PEFT's contract
                f"{module_name}: new adapter shapes {tuple(a_param.shape)}/{tuple(b_param.shape)} != "
                f"{tuple(out.A.shape)}/{tuple(out.B.shape)}"
            )
        a_param.data.copy_(out.A.to(a_param.device))
        b_param.data.copy_((out.B / scaling).to(b_param.device))


def _live_into_base(
    peft_model: Any,
    root: nn.Module,
    adapters: AdapterSet,
    prep: PreparedMerge,
    inplace: bool,
    chunk_numel: int,
    report: "AdapterMergeReport",
    warn_dense: bool,
) -> nn.Module:
    for module_name in adapters.order:
        layer = root.get_submodule(module_name)
        if getattr(layer, "merged_adapters", None):
            raise ConfigError(
                f"module {module_name!r} has adapters {layer.merged_adapters} merged into its base weight; "
                "unmerge them (peft_model.unmerge_adapter()) before into_base=True"
            )
    # The factors are read from the source model, so the copy may drop its adapters before the merge.
    plain = (peft_model if inplace else copy.deepcopy(peft_model)).unload()
    result, info = merge_into_base(
        plain, prep, inplace=True, out=None, device=None, dtype=None, max_shard_bytes=0, chunk_numel=chunk_numel
    )
    report.merge_seconds = info.seconds
    finish_report(prep, info, report, warn_dense)
    return result
