"""The verl integration's ``ram/<agent>/active`` counts entries the way the merge does, also at the float
boundary (a τ of exactly eps rounded to float32): checkpoints written here in verl's file layout (one rank, plain
tensors), so these tests need neither verl nor a process group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_live.integrations.verl import RAMVerl, options_from_mapping

_AT = float(torch.tensor(1e-3))  # float32(1e-3) > 1e-3
_BELOW = float(torch.nextafter(torch.tensor(_AT), torch.tensor(0.0)))
CASES = {  # name: (base, agent, eps, active entries by hand)
    "f32": (torch.zeros(2, 4), torch.tensor([[_AT, -_AT, 2e-3, _BELOW], [0.0, 5e-4, _AT, 0.0]]), 1e-3, 4),
    # bf16 steps of 2^-7 around 1.0; float32(eps) rounds up to 2^-7
    "bf16": (
        torch.ones(2, 4, dtype=torch.bfloat16),
        torch.tensor([[1 + 2**-7, 1 - 2**-7, 1 + 2**-6, 1 - 2**-8], [1.0, 1 + 2**-7, 1.0, 1.0]], dtype=torch.bfloat16),
        2**-7 - 2**-40,
        4,
    ),
}


def _checkpoint(root: Path, state: dict[str, torch.Tensor]) -> Path:
    actor = root / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    torch.save(state, actor / "model_world_size_1_rank_0.pt")
    return actor.parent


@pytest.mark.parametrize("case", sorted(CASES))
def test_active_metric_equals_the_merge_density_at_eps(tmp_path, case):
    base, agent, eps, by_hand = CASES[case]
    folder = tmp_path / "base"
    folder.mkdir()
    save_file({"w": base}, str(folder / "model.safetensors"))
    metrics = {}
    for name, weights in (("a", agent), ("b", base.clone())):  # b changed nothing
        opts = options_from_mapping(
            {
                "store": str(tmp_path / "store"),
                "agent": name,
                "base": str(folder),
                "eps": eps,
                "importance": None,
                "merged_dir": str(tmp_path / "merged"),
                "variant": "ram_plus",
                "durable": False,
            }
        )
        ram = RAMVerl(opts)
        metrics[name] = ram.snapshot(_checkpoint(tmp_path / name, {"w": weights}), step=1)
    merged = ram.merge(step=1)  # density from the merge's own counts (global ρ)
    assert metrics["a"]["ram/a/active"] == by_hand / base.numel()
    assert merged["ram/a/density"] == metrics["a"]["ram/a/active"]
    assert metrics["b"]["ram/b/active"] == merged["ram/b/density"] == 0.0
    tau = agent.float() - base.float()
    assert int((tau.abs() > eps).sum()) != by_hand  # the boundary case: abs() > eps counts otherwise
