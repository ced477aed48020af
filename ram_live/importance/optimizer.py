"""Importances from the optimizer: Adam's second moments ``exp_avg_sq``, already in every Adam/AdamW optimizer.

>>> importance = adam_importance(opt, model, bias_correction=True)                          # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import ConfigError

__all__ = ["adam_importance"]


def adam_importance(
    optimizer: torch.optim.Optimizer, model: nn.Module, *, bias_correction: bool = False
) -> dict[str, Tensor]:
    """Each parameter's Adam second moment ``exp_avg_sq``, keyed by ``model``'s parameter names (a copy, float32).

    Args:
        optimizer: a torch Adam/AdamW (or any optimizer whose state holds ``exp_avg_sq``) over ``model``'s
            parameters, after at least one step.
        model: the model the optimizer trains (its ``named_parameters()`` name the result).
        bias_correction: divide by 1 − β₂^step (each parameter's own step), Adam's unbiased estimate.

    Returns:
        ``{parameter name: float32 tensor}`` for every parameter of ``model``. A parameter without optimizer state
        (frozen, or never given a gradient) gets zeros: it has not moved, so its importance weighs nothing.

    Raises:
        ConfigError: an optimizer without ``exp_avg_sq`` (SGD, Adafactor's factored moments, ...: use
            :func:`~ram_live.importance.empirical_fisher`), no state for the model's parameters (no step yet, or
            another model's optimizer), or ``bias_correction`` without betas.

    >>> opt = torch.optim.AdamW(model.parameters()); train(model, opt)                          # doctest: +SKIP
    >>> importance = adam_importance(opt, model, bias_correction=True)                          # doctest: +SKIP
    """
    names = {id(p): n for n, p in model.named_parameters()}
    found: dict[str, Tensor] = {}
    stepped = False
    for group in optimizer.param_groups:
        beta2 = (group.get("betas") or (None, None))[1]
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if id(p) not in names or not state:
                continue
            stepped = True
            if "exp_avg_sq" not in state:
                raise ConfigError(
                    f"{type(optimizer).__name__} keeps no 'exp_avg_sq' (its state holds {sorted(state)}): "
                    "adam_importance reads Adam/AdamW second moments; for other optimizers compute a diagonal "
                    "empirical Fisher with ram_live.importance.empirical_fisher(model, loader, loss_fn)"
                )
            v = state["exp_avg_sq"].detach().float()
            if bias_correction:
                if beta2 is None:
                    raise ConfigError(f"{type(optimizer).__name__}: no betas in its param groups to bias-correct with")
                step = float(state["step"])
                v = v / (1.0 - float(beta2) ** step)
            found[names[id(p)]] = v.clone() if v.data_ptr() == state["exp_avg_sq"].data_ptr() else v
    if not stepped:
        raise ConfigError(
            f"{type(optimizer).__name__} has no state for the model's parameters: take the "
            "importances after at least one optimizer step, with the optimizer of this model"
        )
    return {
        n: found[n] if n in found else torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        for n, p in model.named_parameters()
    }
