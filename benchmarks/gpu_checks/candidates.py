"""A search's candidates on the device (``check_candidate``): each merge into the search's reused output after its
first (:class:`ram_live.selection.target.Merger`: the scratch module made, the inputs planned and read, RAM+'s
counts taken once), the time a search pays per candidate, as x the floor with the GPU's busy time beside it; its
bits are those of the one-shot merge of the same options."""

from __future__ import annotations

from typing import Any

import bench_merge
from gpu_checks import compare, inputs, timing
from gpu_checks.merges import TARGET_FLOOR, Setup, _busy
from gpu_checks.runner import Outcome


def check_candidate(setup: Setup, label: str, small: bool, out: Outcome) -> None:
    """``label``'s options as a search candidate: best of the setup's runs after the first merge, launches per
    candidate (``device_launches``: the grouped merge is one or a few), bits against ``merge()``'s."""
    from ram_live import merge
    from ram_live.selection.target import Merger

    candidate = setup.options(label)
    merger = Merger(setup.agents, setup.base)  # as search() makes it: merged where the weights are
    _, info, _ = merger.merge(candidate)
    bench_merge.sync(setup.device)

    def call() -> Any:
        return merger.merge(candidate)[0]

    times, _, share = bench_merge.timed(call, setup.reps, setup.device)
    best = min(times)
    floor = setup.floor_seconds(label)
    out.result.update(seconds=best, times=times, x_floor=best / floor if floor else None, others_cpu=share)
    kernel_s = _busy(call, setup.device, floor, out)
    out.result["bound_by"] = timing.verdict(best, kernel_s, floor, TARGET_FLOOR[label])
    out.result["kernels"] = info.extra.get("kernels")
    if setup.device.type == "cuda" and not small:
        out.targets[f"le_{TARGET_FLOOR[label]:g}x_floor"] = floor is not None and best <= TARGET_FLOOR[label] * floor
    got = inputs.subset(call(), setup.keys)
    once = inputs.subset(merge(setup.agents, base=setup.base, **candidate), setup.keys)
    worst = max(int(compare.ulp_distance(got[k], once[k]).max()) for k in once)
    out.require(worst == 0, f"a candidate differs from merge() of its options by {worst} ULP")
