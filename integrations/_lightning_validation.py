"""The Lightning callback's own validation pass (:func:`validation_metrics`): the module's ``validation_step`` over
the validation dataloaders with its ``self.log`` calls collected, outside Lightning's validation loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..training.tensors import metric_float

__all__ = ["validation_metrics"]


def validation_metrics(trainer: Any, pl_module: Any, val_batches: int | None, collective: Any) -> dict[str, float]:
    """The module's ``validation_step`` over the validation dataloaders, its ``self.log`` calls collected (mean
    over batches, weighted by ``batch_size`` when given; averaged over ranks by ``collective``), outside Lightning's
    validation loop: no other callback sees it, nothing is checkpointed; ``val_batches``: at most this many batches
    per dataloader (None: the trainer's limits)."""
    loop = trainer.fit_loop.epoch_loop.val_loop
    if trainer.val_dataloaders is None:
        loop.setup_data()
    loaders = trainer.val_dataloaders
    if loaders is None:
        return {}
    if isinstance(loaders, Mapping):
        loaders = list(loaders.values())
    elif not isinstance(loaders, (list, tuple)):
        loaders = [loaders]
    limits = list(getattr(trainer, "num_val_batches", []) or [])
    sums: dict[str, list[float]] = {}

    def log(name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        if not isinstance(value, (int, float, torch.Tensor)):
            return  # torchmetrics objects and the like: not collected
        w = float(batch_size) if batch_size else 1.0
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] += metric_float(value) * w
        acc[1] += w

    def log_dict(values: Mapping[str, Any], *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        for name, value in values.items():
            log(name, value, batch_size=batch_size)

    modes = {m: m.training for m in pl_module.modules()}
    pl_module.eval()
    pl_module.log = log  # type: ignore[method-assign]
    pl_module.log_dict = log_dict  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            for i, loader in enumerate(loaders):
                limit = val_batches if val_batches is not None else (limits[i] if i < len(limits) else float("inf"))
                for b, batch in enumerate(loader):
                    if b >= limit:
                        break
                    batch = trainer.strategy.batch_to_device(batch, dataloader_idx=i)
                    if len(loaders) > 1:
                        pl_module.validation_step(batch, b, i)
                    else:
                        pl_module.validation_step(batch, b)
    finally:
        del pl_module.log
        del pl_module.log_dict
        for m, training in modes.items():
            m.train(training)
    c = collective
    if c.world_size > 1:
        names = c.broadcast_json(sorted(sums))
        flat = torch.tensor([x for n in names for x in sums.get(n, [0.0, 0.0])], dtype=torch.float64)
        c.all_reduce_sum_(flat)
        return {
            n: float(flat[2 * i] / flat[2 * i + 1]) if flat[2 * i + 1] else float("nan") for i, n in enumerate(names)
        }
    return {n: s / w for n, (s, w) in sums.items() if w}
