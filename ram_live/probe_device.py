"""The probe on an accelerator: one ``torch.ops.ram_live.probe_counts_`` launch per tensor (the Triton kernel of
:mod:`ram_live.kernels.device.counts_triton` where Triton serves the device, else torch over the whole tensor),
each tensor's counts kept in a row of one device buffer and read once at the end (:class:`DeviceProbe`), the
invalid entries in deferred slots (:mod:`ram_live.engine.checks`): no host sync per tensor.

Not ``from __future__ import annotations``: ``torch.library.custom_op`` reads the annotations as types.
"""

from typing import Callable, Sequence

import torch
from torch import Tensor

from .engine import checks
from .engine.stream import DeltaStream
from .functional.activity import apply_activity_
from .functional.counting import ram_statistics
from .kernels.device.common import launch, triton_takes
from .kernels.probe import ProbeCounts

__all__ = ["DeviceProbe"]

#: Programs of the counting kernel per multiprocessor (each adds its sums once).
PROGRAMS_PER_SM = 8
#: Entries per step of the torch implementation.
TORCH_STEP = 1 << 22


@torch.library.custom_op("ram_live::probe_counts_", mutates_args=("counts", "gram", "invalid"))
def probe_counts_(
    base: Tensor, agents: list[Tensor], eps: float, counts: Tensor, gram: Tensor, invalid: Tensor
) -> None:
    """Adds one flat tensor's probe statistics to ``counts`` (int64 ``[3K + 1 + K²]``: active, unique, histogram,
    intersections) and ``gram`` (float64 ``[K²]``), and its NaN/Inf inputs and task vectors to ``invalid``."""
    takes = triton_takes([base, *agents], len(agents))
    args = (base, agents, eps, counts, gram, invalid)
    launch("activity_counts_kernel[pairs]", takes, _triton_probe, _torch_probe, *args)


@probe_counts_.register_fake
def _(base, agents, eps, counts, gram, invalid) -> None:
    return None


def _triton_probe(base, agents, eps, counts, gram, invalid) -> None:
    from .kernels.device.counts_triton import launch_activity_counts

    launch_activity_counts(base, agents, eps, counts, gram, invalid, programs_per_sm=PROGRAMS_PER_SM)


def _torch_probe(base, agents, eps, counts, gram, invalid) -> None:
    numel, k = base.numel(), len(agents)
    step = max(1, min(numel, TORCH_STEP))
    for start in range(0, numel, step):
        end = min(numel, start + step)
        base_f = base[start:end].to(torch.float32)
        raw = [a[start:end].to(torch.float32) for a in agents]
        deltas = torch.stack([a - base_f for a in raw])
        bad = ~torch.isfinite(base_f) | ~torch.isfinite(deltas).all(0)
        for a in raw:
            bad |= ~torch.isfinite(a)
        invalid += bad.sum()
        wide = deltas.double()
        gram += (wide @ wide.T).reshape(-1)
        masks = apply_activity_(deltas, eps) != 0
        counts[: 3 * k + 1] += torch.cat(ram_statistics(masks))
        ints = masks.to(torch.int64)
        counts[3 * k + 1 :] += (ints @ ints.T).reshape(-1) if ints.device.type == "cpu" else _pairs(masks)


def _pairs(masks: Tensor) -> Tensor:
    """Σ m_i·m_j without an integer matmul (not every device has one)."""
    return (masks.unsqueeze(1) & masks.unsqueeze(0)).sum(-1).reshape(-1)


class DeviceProbe:
    """The probe's device counts over a probe's tensors: :meth:`add` launches one tensor's op into its rows,
    :meth:`finish` reads every row once and raises naming the first tensor with an invalid entry.

    Example:
        >>> DeviceProbe(["w"], 2).finish(lambda key: None)[0]
        {}
    """

    def __init__(self, keys: Sequence[str], k: int) -> None:
        self.keys, self.k = list(keys), k
        self.checks = checks.DeferredChecks(keys)
        self._rows: dict[torch.device, tuple[Tensor, Tensor]] = {}
        self._where: dict[str, tuple[torch.device, int]] = {}

    def add(self, index: int, stream: DeltaStream) -> None:
        """Count ``stream`` (the probe's tensor ``index``) on its device."""
        k, device = self.k, stream.device
        if device not in self._rows:
            n = len(self.keys)
            self._rows[device] = (
                torch.zeros(n, 3 * k + 1 + k * k, dtype=torch.int64, device=device),
                torch.zeros(n, k * k, dtype=torch.float64, device=device),
            )
        counts, gram = self._rows[device]
        eps = stream.activity.threshold if stream.activity is not None else 0.0
        slot = self.checks.slot(index, device)
        torch.ops.ram_live.probe_counts_(stream.base, list(stream.tensors), eps, counts[index], gram[index], slot)
        self._where[stream.key] = (device, index)

    def finish(self, recheck: Callable[[str], None]) -> tuple[dict[str, tuple[list[int], list[int]]], ProbeCounts]:
        """Per added tensor, its active and unique counts per agent, and the counts summed over all of them (one
        read per device); ``recheck(key)`` raises for a tensor whose inputs hold NaN/Inf."""
        self.checks.raise_first(recheck)
        k, total = self.k, ProbeCounts.zeros(self.k)
        rows: dict[str, tuple[list[int], list[int]]] = {}
        for device, (counts, gram) in self._rows.items():
            summed = torch.cat([counts.sum(0).double(), gram.sum(0)]).cpu()  # exact: every count is below 2^53
            total.add_(
                ProbeCounts(
                    summed[:k].long(),
                    summed[k : 2 * k].long(),
                    summed[3 * k + 1 : 3 * k + 1 + k * k].long().reshape(k, k),
                    summed[2 * k : 3 * k + 1].long(),
                    summed[3 * k + 1 + k * k :].reshape(k, k),
                )
            )
            host = counts[:, : 2 * k].cpu().tolist()
            for key, (where, index) in self._where.items():
                if where == device:
                    rows[key] = (host[index][:k], host[index][k:])
        return rows, total
