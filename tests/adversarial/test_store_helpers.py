"""Helpers of the store's adversarial tests (no tests here): a small store whose snapshot uses every encoding,
and bit-exact comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ram_live.store import SnapshotStore

STEP = 7
RUN = "r1"  # the run the store's snapshots are written in (its manifests: <step:012d>.r1.json)


def small_base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(16, 16, generator=g),
        "e": torch.randn(4, 16, generator=g).bfloat16(),
        "b": torch.randn(10, generator=g).half(),
        "s": torch.tensor(0.25),
    }


def small_agent(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """w: 3 of 256 changed (indices), e: every other entry (bitmask), b: all (dense), s: none."""
    out = {k: v.clone() for k, v in base.items()}
    out["w"].view(-1)[[1, 17, 200]] += 1.0
    out["e"].view(-1)[::2] += 1.0
    out["b"] += 1.0
    return out


def build(root: Path) -> tuple[SnapshotStore, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A store with the base, agent ``a`` at :data:`STEP` (every encoding once) and agent ``other`` at the same
    step. Returns (store, base, a's weights)."""
    store = SnapshotStore(root, durable=False)
    base = small_base()
    agent = small_agent(base)
    store.writer("a", base, run=RUN).snapshot(agent, STEP)
    other = {k: v.clone() for k, v in base.items()}
    other["w"] += 2.0
    store.writer("other", base, run=RUN).snapshot(other, STEP)
    pieces = json.loads(manifest_path(root).read_text())["tensors"]
    assert sorted(p["pieces"][0]["encoding"] for p in pieces.values()) == ["bitmask", "dense", "indices", "none"]
    return store, base, agent


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Same keys, dtypes, shapes and bits."""
    if sorted(a) != sorted(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            return False
    return True


def manifest_path(root: Path, agent: str = "a") -> Path:
    return root / agent / f"{STEP:012d}.{RUN}.json"


def data_files(root: Path, agent: str = "a") -> list[Path]:
    m = json.loads(manifest_path(root, agent).read_text())
    return [root / agent / f["name"] for f in m["files"]]


def base_files(root: Path) -> list[Path]:
    m = json.loads((root / "_base" / "base.json").read_text())
    return [root / "_base" / f["name"] for f in m["files"]]


def read_all(root: Path, agent: str = "a") -> dict[str, torch.Tensor]:
    """Agent's snapshot at :data:`STEP`, every tensor, through a fresh store object (no cached base)."""
    return SnapshotStore(root, create=False).open(agent, STEP).to_state_dict()
