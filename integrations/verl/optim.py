"""Adam's second moments from a verl actor checkpoint's optimizer shards, one rank at a time, never gathered.

verl's ``FSDPCheckpointManager`` saves each rank's ``optimizer.state_dict()`` as ``optim_world_size_<W>_rank_<R>.pt``
next to ``model_world_size_<W>_rank_<R>.pt``: torch.optim's layout, ``{"state": {index: {"step", "exp_avg",
"exp_avg_sq"}}, "param_groups": [{"params": [index, ...], "betas": (β₁, β₂), ...}]}``, the indices numbering the
parameters in the order they were given to the optimizer. Under FSDP2 each ``exp_avg_sq`` is a DTensor sharded
like its parameter, so its local tensor is this rank's box of the parameter — the box the rank's model file
holds. Full fine-tuning gives the optimizer every parameter in ``model.parameters()`` order, which is the order
of the model file's keys without tied copies (HF models' buffers are not persistent); each index is matched to
the key at its position and checked by shape. Anything else (LoRA runs, FSDP1's flat parameters, a count or
shape that does not match) gives no importances: :func:`rank_importance` says why.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ram_live.io.dtensor import is_dtensor

__all__ = ["rank_importance"]


def _load(path: Path) -> Any:
    import torch.distributed.tensor  # noqa: F401 - registers DTensor for weights_only loading

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)


def rank_importance(
    actor: Path,
    world_size: int,
    rank: int,
    keys: list[str],
    local_shapes: dict[str, tuple[int, ...]],
    *,
    bias_correction: bool = False,
) -> tuple[dict[str, Tensor] | None, str | None]:
    """Rank ``rank``'s ``exp_avg_sq`` boxes keyed by the model file's ``keys`` (in the file's order, tied copies
    left out), float32: ``(importances, None)``, or ``(None, why)`` when the checkpoint has none that map.

    Args:
        actor: the ``global_step_<N>/actor`` folder.
        world_size, rank: which optimizer file.
        keys: the rank's model-file keys in order, without tied copies.
        local_shapes: each key's local box shape on this rank (the check of the mapping).
        bias_correction: divide by 1 − β₂^step (each parameter's own step and its group's β₂).

    Example:
        >>> imp, why = rank_importance(ckpt.path, ckpt.world_size, 0, keys, shapes)       # doctest: +SKIP
    """
    path = actor / f"optim_world_size_{world_size}_rank_{rank}.pt"
    if not path.is_file():
        return None, f"{path.name} is missing (saved without 'optimizer' in checkpoint.save_contents?)"
    try:
        sd = _load(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file: snapshots without importances
        return None, f"{path.name}: not readable as tensors only ({type(exc).__name__})"
    if (
        not isinstance(sd, dict)
        or not isinstance(sd.get("state"), dict)
        or not isinstance(sd.get("param_groups"), list)
    ):
        return None, f"{path.name} is not a torch.optim state dict"
    order: list[tuple[int, float | None]] = []
    for group in sd["param_groups"]:
        betas = group.get("betas")
        beta2 = float(betas[1]) if isinstance(betas, (list, tuple)) and len(betas) == 2 else None
        order += [(int(i), beta2) for i in group.get("params", [])]
    if len(order) != len(keys):
        return None, (
            f"{path.name} has state for {len(order)} parameters, the model file {len(keys)} tensors "
            "(a LoRA or partly frozen run, or FSDP1's flat parameters): no parameter names to match"
        )
    out: dict[str, Tensor] = {}
    for (index, beta2), key in zip(order, keys):
        state = sd["state"].get(index)
        if not state:
            out[key] = torch.zeros(local_shapes[key], dtype=torch.float32)  # never stepped: it did not move
            continue
        if "exp_avg_sq" not in state:
            return None, f"{path.name}: the optimizer keeps no 'exp_avg_sq' (state {sorted(state)})"
        v = state["exp_avg_sq"]
        v = v._local_tensor if is_dtensor(v) else v
        if tuple(v.shape) != tuple(local_shapes[key]):
            return None, (
                f"{path.name}: parameter {index}'s exp_avg_sq has shape {list(v.shape)}, the model "
                f"file's tensor {key!r} at that position {list(local_shapes[key])}: the order does not match"
            )
        v = v.float()
        if bias_correction:
            step = state.get("step")
            if beta2 is None or step is None:
                return None, f"{path.name}: no betas/step to bias-correct with"
            v = v / (1.0 - beta2 ** float(step))
        out[key] = v
    return out, None
