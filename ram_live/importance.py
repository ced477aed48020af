"""Per-parameter importances for curvature-aware RAM (``merge(..., importance=...)``, see docs/curvature.md).

Where they come from: Adam's second moments, already in every Adam/AdamW optimizer (:func:`adam_importance`), or
a diagonal empirical Fisher from a data loader, for agents that come without optimizer state
(:func:`empirical_fisher`). Only ratios between agents matter, entry by entry.

>>> imp = {"coder": adam_importance(coder_opt, coder), "tools": adam_importance(tools_opt, tools)}  # doctest: +SKIP
>>> merged = ram_merge({"coder": coder, "tools": tools}, base=base, importance=imp)               # doctest: +SKIP
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from .errors import ConfigError, UnsupportedInputError
from .io.sources import SafetensorsSource, StateDictSource, TensorSource

__all__ = ["adam_importance", "empirical_fisher", "importance_sources"]


def adam_importance(optimizer: torch.optim.Optimizer, model: nn.Module, *,
                    bias_correction: bool = False) -> dict[str, Tensor]:
    """Each parameter's Adam second moment ``exp_avg_sq``, keyed by ``model``'s parameter names (a copy, float32).

    Args:
        optimizer: a torch Adam/AdamW (or any optimizer whose state holds ``exp_avg_sq``) over ``model``'s
            parameters, after at least one step.
        model: the model the optimizer trains (its ``named_parameters()`` name the result).
        bias_correction: divide by 1 − β₂^step (each parameter's own step), Adam's unbiased estimate.

    A parameter without optimizer state (frozen, or never given a gradient) gets zeros: it has not moved, so
    its importance weighs nothing. Optimizers without ``exp_avg_sq`` (SGD, Adafactor's factored moments, ...) are
    a :class:`ConfigError`: use :func:`empirical_fisher` for them.

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
                    "empirical Fisher with ram_live.importance.empirical_fisher(model, loader, loss_fn)")
            v = state["exp_avg_sq"].detach().float()
            if bias_correction:
                if beta2 is None:
                    raise ConfigError(f"{type(optimizer).__name__}: no betas in its param groups to bias-correct with")
                step = float(state["step"])
                v = v / (1.0 - float(beta2) ** step)
            found[names[id(p)]] = v.clone() if v.data_ptr() == state["exp_avg_sq"].data_ptr() else v
    if not stepped:
        raise ConfigError(f"{type(optimizer).__name__} has no state for the model's parameters: take the "
                          "importances after at least one optimizer step, with the optimizer of this model")
    return {n: found[n] if n in found else torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            for n, p in model.named_parameters()}


def empirical_fisher(model: nn.Module, loader: Iterable[Any], loss_fn: Callable[[nn.Module, Any], Tensor], *,
                     batches: int | None = None) -> dict[str, Tensor]:
    """Diagonal empirical Fisher: the mean over batches of each parameter's squared gradient (float32).

    Args:
        model: the agent; its gradients (``.grad``) and train/eval mode are restored afterwards.
        loader: an iterable of batches (e.g. a ``DataLoader``) from the agent's own task.
        loss_fn: ``loss_fn(model, batch) -> scalar loss`` (the squared gradients are those of each batch's loss:
            pass batches of one example for the per-example Fisher).
        batches: use at most this many batches (None: the whole loader).

    Runs the model in eval mode (no dropout). Parameters that do not require gradients get zeros.

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
                raise ConfigError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}"
                                  f"{'' if not isinstance(loss, Tensor) else f' of shape {list(loss.shape)}'}")
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


Importance = Mapping[str, Tensor] | str | os.PathLike | TensorSource


def importance_sources(importance: Mapping[str, Importance] | Sequence[Importance], agents: Sequence[str]
                       ) -> dict[str, TensorSource]:
    """``merge``'s ``importance=`` as one :class:`TensorSource` per agent name: a state dict ``{key: Tensor}``,
    a ``.safetensors`` file or folder (memory-mapped, read tensor by tensor), any source (e.g. a snapshot's), or a
    number (:class:`~ram_live.auxiliary.ConstantImportance`: that value everywhere, a per-agent weight in the
    shared mean).
    A mapping is keyed by agent name (names that are not agents are a :class:`ConfigError`; agents without one
    are refused by the merge, which knows which agents it keeps); a sequence follows the agents' order."""
    if isinstance(importance, Mapping) and not any(isinstance(v, Tensor) for v in importance.values()):
        per_agent = dict(importance)
    elif isinstance(importance, Sequence) and not isinstance(importance, (str, bytes)):
        if len(importance) != len(agents):
            raise ConfigError(f"importance has {len(importance)} entries for {len(agents)} agents "
                              f"({', '.join(map(repr, agents))}); or pass a mapping agent name -> importances")
        per_agent = dict(zip(agents, importance))
    else:
        raise ConfigError("importance must map each agent's name to its importances (a state dict, a safetensors "
                          f"path or a TensorSource), got {type(importance).__name__}")
    unknown = [str(n) for n in per_agent if n not in agents]
    if unknown:
        raise ConfigError(f"importance: unknown agent(s) {', '.join(map(repr, unknown))} (the agents are "
                          f"{', '.join(map(repr, agents))})")
    return {name: _as_source(value, name) for name, value in per_agent.items()}


def _as_source(value: Any, agent: str) -> TensorSource:
    name = f"importance of {agent}"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        from .auxiliary import ConstantImportance

        return ConstantImportance(float(value), agent)  # one weight for every entry (RAM's shared mean)
    if isinstance(value, (str, os.PathLike)):
        return SafetensorsSource(value, name)
    if isinstance(value, Mapping):
        bad = [k for k, v in value.items() if not isinstance(v, Tensor)]
        if bad:
            raise ConfigError(f"importance of agent {agent!r}: {bad[0]!r} is a {type(value[bad[0]]).__name__}, "
                              "not a Tensor")
        return StateDictSource(value, name)
    if isinstance(value, TensorSource):
        return value
    raise UnsupportedInputError(f"importance of agent {agent!r}: a {type(value).__name__}; pass a state dict, a "
                                "safetensors file/folder or a TensorSource")
