"""The demo's side studies: sign agreement on shared entries, the ε sweep, the results figure."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ram_live import merge

from .lang import accuracy
from .train import EPS_SWEEP


def module_of(base: nn.Module, state: Any) -> nn.Module:
    m = copy.deepcopy(base)
    m.load_state_dict(dict(state) if not isinstance(state, nn.Module) else state.state_dict())
    return m


def sign_agreement(agents: dict[str, Any], base: nn.Module) -> dict[str, float]:
    """On entries changed by ≥ 2 agents: share where all changing agents agree in sign; also counts."""
    shared = agree = 0
    for key, b in base.state_dict().items():
        deltas = torch.stack([a.get(key).float() - b.float() for a in agents.values()])
        active = deltas != 0
        c = active.sum(0)
        mask = c >= 2
        if not mask.any():
            continue
        pos = ((deltas > 0) & active).sum(0)
        neg = ((deltas < 0) & active).sum(0)
        shared += int(mask.sum())
        agree += int((mask & ((pos == c) | (neg == c))).sum())
    return {"shared_entries": shared, "sign_agree_share": agree / shared if shared else float("nan")}


def eps_sweep(agents: dict[str, Any], base: nn.Module, test: dict[str, tuple[Tensor, Tensor]]) -> dict[str, Any]:
    """RAM and RAM+ with larger activity thresholds ε: an entry counts as updated by an agent only if |τ| > ε, so
    an agent's tiny incidental change no longer halves another agent's large update there (nor counts as shared)."""
    rows: dict[str, Any] = {}
    for eps in EPS_SWEEP:
        row = {}
        for variant in ("ram", "ram_plus"):
            merged, info = merge(agents, base=base, method=variant, eps=eps, return_info=True)
            acc = accuracy(merged, test)
            acc["mean"] = sum(acc[t] for t in test) / len(test)
            row[variant] = acc
            if info.lambdas:
                row["lambdas"] = dict(info.lambdas)
        rows[str(eps)] = row
    return rows


def plot_results(path: Path, table: dict[str, dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    cols = list(next(iter(table.values())))
    fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.9), 4))
    w = 0.8 / len(cols)
    for j, c in enumerate(cols):
        ax.bar([i + j * w for i in range(len(names))], [table[n][c] for n in names], w, label=c)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("greedy exact-match accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=4)
    ax.set_title("RL demo: specialists and merges (held-out prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
