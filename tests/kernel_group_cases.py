"""The grouped kernels' cases of tests/kernel_compile.py (many tensors in one launch: RAM's merge and counts, TA,
linear, DARE, TIES with its radix passes and thresholds), each a call of its op's Triton wrapper on two tensors."""

from __future__ import annotations

from typing import Any, Callable

import torch


def group_cases(
    flat: Callable[[int, torch.dtype], Any], dtypes: dict
) -> list[tuple[str, str, str, Callable[[], None]]]:
    """``(label, kernel's module, kernel's name, call)`` as :func:`kernel_compile.cases` gives them; a label ending
    in ``#n`` builds the call's n-th launch of its kernel."""
    from ram_live.kernels.device import linear, ties
    from ram_live.methods.ram import device as ram

    out: list[tuple[str, str, str, Callable[[], None]]] = []
    n = flat(1, torch.float32)[0].numel()
    group_mod, group_name = "ram_live.kernels.device.group_triton", "ram_merge_group_kernel"
    for dtype, k, lam, sign, weighted, eps in [
        (torch.bfloat16, 3, False, False, False, 1e-5),
        (torch.float32, 8, True, True, True, 0.0),
    ]:
        base, agents = flat(k, dtype)
        imps = [torch.ones(n, dtype=torch.float32) for _ in range(k)] if weighted else []
        lambdas = torch.ones(k, dtype=torch.float32) if lam else None

        def call(base=base, agents=agents, imps=imps, lambdas=lambdas, eps=eps, sign=sign) -> None:
            from ram_live.kernels.device.group_triton import launch_ram_merge_group

            slots = torch.zeros(2, dtype=torch.int64)
            outs = [torch.empty_like(base), torch.empty_like(base)]
            launch_ram_merge_group(
                outs, [base, base], [agents, agents], [imps, imps] if imps else [], lambdas, eps, sign, slots, [0, 1]
            )

        label = f"RAM group {dtypes[dtype]} K={k} lambdas={lam} sign={sign} weighted={weighted} eps={eps}"
        out.append((label, group_mod, group_name, call))
    for dtype, k, eps in [(torch.bfloat16, 3, 1e-5), (torch.float32, 8, 0.0)]:
        base, agents = flat(k, dtype)

        def call(base=base, agents=agents, eps=eps, k=k) -> None:
            counts, slots = torch.zeros(3 * k + 1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
            ram._triton_counts_group([base, base], [agents, agents], eps, counts, slots, [0, 1])

        label = f"RAM counts group {dtypes[dtype]} K={k} eps={eps}"
        out.append((label, group_mod, "activity_counts_group_kernel", call))
    baseline_mod = "ram_live.kernels.device.group_baseline_triton"
    for dtype, k, scale, dare in [(torch.bfloat16, 3, 1.0, False), (torch.float32, 8, 0.5, True)]:
        base, agents = flat(k, dtype)
        densities, seeds = ([0.4] * k, [list(range(k))] * 2) if dare else ([], [])

        def call(base=base, agents=agents, k=k, scale=scale, densities=densities, seeds=seeds) -> None:
            weights = torch.ones(k, dtype=torch.float64)
            slots = torch.zeros(2, dtype=torch.int64)
            outs = [torch.empty_like(base), torch.empty_like(base)]
            linear._triton_group(outs, [base, base], [agents, agents], weights, scale, densities, seeds, slots, [0, 1])

        label = f"linear group {dtypes[dtype]} K={k} scale={scale} dare={dare}"
        out.append((label, baseline_mod, "linear_merge_group_kernel", call))
    for dtype, k, majority, weighted, divide in [(torch.bfloat16, 3, 0, False, 0), (torch.float16, 5, 1, True, 1)]:
        base, agents = flat(k, dtype)

        def call(base=base, agents=agents, k=k, majority=majority, weighted=weighted, divide=divide) -> None:
            weights = torch.ones(k, dtype=torch.float64)
            slots = torch.zeros(2, dtype=torch.int64)
            outs = [torch.empty_like(base), torch.empty_like(base)]
            ties._triton_group(outs, [base, base], [agents, agents], weights, [0.5] * k, [list(range(k))] * 2, 1.0,
                               majority, weighted, divide, slots, [0, 1])  # fmt: skip

        label = f"DARE-TIES group {dtypes[dtype]} K={k} majority={majority} weighted={weighted} divide={divide}"
        out.append((label, baseline_mod, "dare_ties_group_kernel", call))
    ties_group_mod = "ram_live.kernels.device.group_ties_triton"
    for dtype, k, majority, weighted, divide in [(torch.bfloat16, 3, 0, False, 0), (torch.float32, 8, 1, True, 1)]:
        base, agents = flat(k, dtype)

        def call(base=base, agents=agents, k=k, majority=majority, weighted=weighted, divide=divide) -> None:
            weights = torch.ones(k, dtype=torch.float64)
            slots = torch.zeros(2, dtype=torch.int64)
            outs = [torch.empty_like(base), torch.empty_like(base)]
            ties._triton_ties_group(outs, [base, base], [agents, agents], weights, [[5] * k] * 2, 1.0, majority,
                                    weighted, divide, slots, [0, 1])  # fmt: skip

        label = f"TIES group {dtypes[dtype]} K={k} majority={majority} weighted={weighted} divide={divide}"
        out.append((label, ties_group_mod, "ties_group_kernel", call))
        for p in range(3):
            out.append((f"{label} radix pass #{p}", ties_group_mod, "radix_histogram_group_kernel", call))
        out.append((f"TIES group thresholds K={k}", ties_group_mod, "select_thresholds_group_kernel", call))
    return out
