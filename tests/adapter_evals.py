"""An evaluation the parallel adapter-search tests hand to worker processes: importable on its own, as a spawned
worker unpickles it by module."""

from __future__ import annotations

import torch


class LogitsScore:
    """Minus the mean square of the merged model's logits on fixed tokens (a module), or of its weights (a state
    dict): a pure function of the merge."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.tokens = torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(seed))

    def __call__(self, merged) -> float:
        with torch.no_grad():
            if isinstance(merged, torch.nn.Module):
                return -float(merged(self.tokens).logits.double().pow(2).mean())
            return -float(sum(v.double().pow(2).sum() for v in merged.values()))
