"""Merging PEFT adapter folders without a live model: into a new adapter folder, or into a base model."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from ..engine.stream import DEFAULT_CHUNK_NUMEL
from ..io.outputs import rename_noreplace
from ..errors import ConfigError, InputMismatchError, OutputExistsError
from ..io.outputs import temp_folder
from ..io.sources import as_source
from .configs import merged_fan_in_fan_out, new_config_fields
from .errors import UnsupportedAdapterError
from .factors import AdapterSet, weight_key
from .folders import PEFT_PREFIX, read_folders
from .merging import check_options, finish_report, merge_in_delta_space, merge_into_base, prepare_merge
from .refactoring import Refactored, make_refactorer
from .report import AdapterMergeReport
from .spellings import peft_spellings
from .svd_options import SvdOptions


def ram_merge_adapter_files(
    adapters: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike],
    out: str | os.PathLike | None = None,
    method: str = "ram_plus",
    *,
    base: Any = None,
    into_base: bool = False,
    inplace: bool = False,
    svd_options: SvdOptions | None = None,
    sparsify: Any = "auto",
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 * 2**30,
    chunk_numel: int = DEFAULT_CHUNK_NUMEL,
    warn_dense: bool = True,
    return_info: bool = False,
    **options: Any,
) -> Any:
    """Merge PEFT LoRA adapter folders (``adapter_model.safetensors`` + ``adapter_config.json``) without a live
    model: the same ΔW-space merge as :func:`ram_merge_adapters` (same options and PEFT spellings), into a new
    adapter folder (default; no base needed) or into a base model.

    Args:
        adapters: a list of folders (adapters named after their folders) or a mapping name → folder.
        out: the new adapter folder (absent or empty; written to a temporary name and renamed), loadable with
            ``PeftModel.from_pretrained``: the first adapter's config with the new r/alpha/patterns/targets. With
            ``into_base``: :func:`ram_live.merge`'s ``out`` (safetensors written atomically), or None.
        method: any method of the registry (``"ram_plus"``, ``"ram"``, ``"ties"``, ...).
        base: with ``into_base`` only: an ``nn.Module``, a state dict, a ``.safetensors`` file or a Hugging Face
            folder; the base's key of module ``m`` is ``m + ".weight"`` (PEFT's ``base_model.model.`` stripped).
        into_base: fold ΔW* into ``base`` through :func:`ram_live.merge`.
        inplace: with ``into_base`` and a module ``base``, merge into the base itself (default: a new one).
        svd_options, sparsify, chunk_numel, warn_dense, return_info: as for :func:`ram_merge_adapters`.
        device: where the factors are read and merged (default: the CPU).
        dtype: the new factors' dtype (default: the inputs' when they agree, else float32); with ``into_base``,
            :func:`ram_live.merge`'s ``dtype``.
        max_shard_bytes: the shard size of a base written to ``out``.
        **options: the method's config, the old SVD keywords and PEFT's spellings, as for :func:`ram_merge_adapters`.

    Returns:
        ``out`` as a ``Path``; with ``into_base=True`` what :func:`ram_live.merge` returns for that base;
        ``(result, AdapterMergeReport)`` with ``return_info``.

    Raises:
        ConfigError: bad method / SVD / ``sparsify`` options, ``adapters`` a single path or empty or with repeated
            names, ``out`` missing or not empty, ``base`` without ``into_base`` (or missing with it), ``inplace``
            without ``into_base``; an ``adapter_config.json`` field of the wrong type or value (``r``,
            ``lora_alpha`` not a positive integer, ``rank_pattern`` / ``alpha_pattern`` not an object of valid
            regular expressions to positive integers), naming the file and the key.
        UnsupportedInputError: a folder without ``adapter_config.json`` or ``adapter_model.safetensors``, a config
            that is not a UTF-8 JSON object, weights that are not a well-formed safetensors file (truncated, garbage)
            or hold factors that are not floating point; the message names the adapter and the file.
        NonFiniteError: an adapter's factors hold NaN or Inf.
        UnsupportedAdapterError: an adapter that cannot be merged exactly (DoRA, ``lora_bias``,
            ``modules_to_save``, ...), or one saving its own embedding that differs from the base's.
        InputMismatchError: factors that disagree with their config or between adapters, or a base lacking a
            targeted weight or holding it in another shape.
        OutputExistsError: ``out`` was created by someone else during the merge.

    Example:
        >>> ram_merge_adapter_files({"code": "runs/code", "tool": "runs/tool"}, out="merged",
        ...                         svd_options=SvdOptions(energy=0.99))          # doctest: +SKIP
    """
    t0 = time.perf_counter()
    options = dict(options)
    svd_keywords = SvdOptions.take(options)
    method, rank, options, _ = peft_spellings(
        method, svd_keywords.pop("rank", None), options, method_given=method != "ram_plus"
    )
    svd_opts = check_options(svd_options, svd_keywords, rank, inplace, into_base, "ram_merge_adapter_files")
    dev = torch.device(device) if device is not None else None
    adapter_set, _ = read_folders(adapters, dev or "cpu")
    prep = prepare_merge(adapter_set, method, options, sparsify)
    report = AdapterMergeReport(adapter_set.names, "base weights" if into_base else f"adapter folder {out}")
    with torch.no_grad():
        if into_base:
            if base is None:
                raise ConfigError("into_base=True needs base= (the model the adapters were trained on)")
            _check_base(adapter_set, base)
            result, info = merge_into_base(
                base,
                prep,
                inplace=inplace,
                out=out,
                device=dev,
                dtype=dtype,
                max_shard_bytes=max_shard_bytes,
                chunk_numel=chunk_numel,
            )
        else:
            if out is None:
                raise ConfigError("pass out= (the folder to write the merged adapter to), or into_base=True")
            if base is not None:
                raise ConfigError("base= is used with into_base=True only (a merged adapter needs no base)")
            _check_out(Path(out))
            refactorer = make_refactorer(adapter_set, report, svd_opts)
            info = merge_in_delta_space(adapter_set, prep, refactorer, device=dev, chunk_numel=chunk_numel)
            result = _write_adapter_folder(Path(out), adapter_set, refactorer.factors, dtype)
        finish_report(prep, info, report, warn_dense)
    report.seconds = time.perf_counter() - t0
    return (result, report) if return_info else result


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"output folder {out} exists and is not empty")


def _check_base(adapters: AdapterSet, base: Any) -> None:
    source = as_source(base, "base")
    keys = set(source.keys())
    for m in adapters.order:
        key = weight_key(m)
        owner = adapters.targeting(m)[0]
        if key not in keys:
            raise InputMismatchError(
                f"adapter {owner!r} targets module {m!r} but the base has no tensor {key!r} (another architecture?)",
                key=key,
                agent=owner,
            )
        expected = adapters.module(m).weight_shape
        if tuple(source.spec(key).shape) != tuple(expected):
            raise InputMismatchError(
                f"module {m!r}: the base's {key!r} has shape {list(source.spec(key).shape)}, adapter {owner!r}'s "
                f"ΔW {list(expected)}",
                key=key,
                agent=owner,
            )
    for adapter, saved in adapters.saved_weights.items():
        for key, tensor in saved.items():
            if (
                key not in keys
                or tuple(source.spec(key).shape) != tuple(tensor.shape)
                or not torch.equal(source.get(key).to(device=tensor.device, dtype=tensor.dtype), tensor)
            ):
                raise UnsupportedAdapterError(
                    f"adapter {adapter!r} stores its own {key!r} (PEFT's save_embedding_layers), which differs from "
                    "the base's: a resized or retrained embedding is not a LoRA delta and cannot be merged",
                    adapter=adapter,
                    module=key,
                )


def _write_adapter_folder(
    out: Path, adapters: AdapterSet, factors: Mapping[str, Refactored], dtype: torch.dtype | None
) -> Path:
    from safetensors.torch import save_file

    _check_out(out)
    if dtype is None:
        dtypes = {f.A.dtype for per in adapters.factors.values() for f in per.values()}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    tensors: dict[str, Tensor] = {}
    for module, f in factors.items():
        if adapters.module(module).kind == "linear":
            a_key, b_key = "lora_A.weight", "lora_B.weight"
        else:
            a_key, b_key = "lora_embedding_A", "lora_embedding_B"
        tensors[f"{PEFT_PREFIX}{module}.{a_key}"] = f.A.to(device="cpu", dtype=dtype).contiguous()
        tensors[f"{PEFT_PREFIX}{module}.{b_key}"] = f.B.to(device="cpu", dtype=dtype).contiguous()
    config = dict(adapters.configs[adapters.names[0]])
    config.update(new_config_fields(factors))
    config["fan_in_fan_out"] = merged_fan_in_fan_out(adapters, factors)
    config.update(peft_type="LORA", use_dora=False, lora_bias=False, bias="none", init_lora_weights=True)
    for key in (
        "modules_to_save",
        "layers_to_transform",
        "layers_pattern",
        "exclude_modules",
        "target_parameters",
        "trainable_token_indices",
    ):
        if key in config:
            config[key] = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_folder(out.parent, out.name)
    try:
        save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if out.exists():
            out.rmdir()
        try:
            rename_noreplace(tmp, out)
        except FileExistsError:
            raise OutputExistsError(
                f"output {out}: created by someone else while the adapter was merged; left as it is"
            ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
