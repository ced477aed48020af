"""Importances from data: a diagonal empirical Fisher, for agents that come without optimizer state.

>>> fisher = empirical_fisher(agent, loader, loss, batches=64)                              # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from ..errors import ConfigError

__all__ = ["empirical_fisher"]


def empirical_fisher(
    model: nn.Module, loader: Iterable[Any], loss_fn: Callable[[nn.Module, Any], Tensor], *, batches: int | None = None
) -> dict[str, Tensor]:
    """Diagonal empirical Fisher: the mean over batches of each parameter's squared gradient (float32).

    Args:
        model: the agent; its gradients (``.grad``) and train/eval mode are restored afterwards.
        loader: an iterable of batches (e.g. a ``DataLoader``) from the agent's own task.
        loss_fn: ``loss_fn(model, batch) -> scalar loss`` (the squared gradients are those of each batch's loss:
            pass batches of one example for the per-example Fisher).
        batches: use at most this many batches (None: the whole loader).

    Runs the model in eval mode (no dropout).

    Returns:
        ``{parameter name: float32 tensor}``, the mean squared gradient; zeros for parameters that do not require
        gradients.

    Raises:
        ConfigError: ``batches`` < 1, a ``loss_fn`` that does not return a scalar tensor, or a loader that yields no
            batch.

    >>> loss = lambda m, batch: F.cross_entropy(m(batch[0]), batch[1])                          # doctest: +SKIP
    >>> fisher = empirical_fisher(agent, loader, loss, batches=64)                              # doctest: +SKIP
    """
    if batches is not None and batches < 1:
        raise ConfigError(f"batches must be >= 1 or None, got {batches!r}")
    params = list(model.named_parameters())
    saved = [p.grad for _, p in params]
    was_training = model.training
    total = {n: torch.zeros(p.shape, dtype=torch.float32, device=p.device) for n, p in params}
    seen = 0
    try:
        model.eval()
        for batch in loader:
            if batches is not None and seen >= batches:
                break
            for _, p in params:
                p.grad = None
            loss = loss_fn(model, batch)
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                raise ConfigError(
                    f"loss_fn must return a scalar tensor, got {type(loss).__name__}"
                    f"{'' if not isinstance(loss, Tensor) else f' of shape {list(loss.shape)}'}"
                )
            loss.backward()
            with torch.no_grad():
                for n, p in params:
                    if p.grad is not None:
                        total[n].add_(p.grad.detach().float().square())
            seen += 1
    finally:
        for (_, p), g in zip(params, saved):
            p.grad = g
        model.train(was_training)
    if seen == 0:
        raise ConfigError("empirical_fisher: the loader yielded no batch")
    return {n: t.div_(seen) for n, t in total.items()}
