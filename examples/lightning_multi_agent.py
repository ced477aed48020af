"""Three Lightning runs, three tasks, one base, one snapshot store; RAM merges them into one generalist.

    python examples/lightning_multi_agent.py            # CPU, well under a minute
    python examples/lightning_multi_agent.py --steps 300 --store runs/ram

The tasks: a 4-way classification of a 24-feature input whose features come in three blocks; task t uses block t
only (the others are zero) and its own teacher labels. A tiny MLP is pretrained briefly on all three (the base);
then each task's run fine-tunes a copy with Adam, a ``RAMCallback`` snapshotting its task vector into the shared
store every 25 steps and merging the latest snapshot of every agent there every 50 steps (scores logged under
``ram/``, e.g. ``ram/acc_task2``). Since task t's inputs are zero outside block t, its run changes its own block of
the first layer only (unique updates) and every later layer (shared updates): the case RAM is made for.

At the end the generalist is merged from the store (``ram_merge(store.latest_all())``: no model in memory
needed) and compared with the base, each specialist and plain averaging, as a table.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from ram_live.integrations.lightning import RAMCallback
from torch import nn

from ram_live import RamConfig, Unit, merge, probe, ram_merge
from ram_live.store import SnapshotStore

TASKS = ("task0", "task1", "task2")
BLOCK = 8
FEATURES = BLOCK * len(TASKS)
CLASSES = 4


def task_data(t: int, n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed * 100 + t)
    x = torch.zeros(n, FEATURES)
    x[:, t * BLOCK : (t + 1) * BLOCK] = torch.randn(n, BLOCK, generator=g)
    teacher = torch.randn(BLOCK, CLASSES, generator=torch.Generator().manual_seed(1000 + t))
    y = (x[:, t * BLOCK : (t + 1) * BLOCK] @ teacher + 0.3 * torch.randn(n, CLASSES, generator=g)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


TEST = [task_data(t, 2000, seed=99) for t in range(len(TASKS))]


class Net(L.LightningModule):
    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.lr = lr
        self.body = nn.Sequential(
            nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)  # no weight decay: zero gradients change nothing


@torch.no_grad()
def accuracy(model: nn.Module, t: int) -> float:
    x, y = TEST[t].tensors
    model.eval()
    out = (model(x).argmax(dim=1) == y).float().mean().item()
    return out


def scores(model: nn.Module) -> dict[str, float]:
    accs = {f"acc_{name}": accuracy(model, t) for t, name in enumerate(TASKS)}
    accs["acc_mean"] = sum(accs.values()) / len(TASKS)
    return accs


def trainer(steps: int, callbacks: list, logdir: Path, name: str) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=25,
        logger=L.pytorch.loggers.CSVLogger(logdir, name=name),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="optimizer steps per task run")
    p.add_argument("--pretrain", type=int, default=40, help="steps of the base on the mixture")
    p.add_argument("--store", help="store folder (default: a temporary folder)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.manual_seed(0)
    root = Path(a.store or tempfile.mkdtemp(prefix="ram-lightning-"))
    store_dir = root / "store"
    t0 = time.time()

    # the base: a short pretraining on the mixture of the three tasks
    base = Net()
    mixture = torch.utils.data.ConcatDataset([task_data(t, 1024, seed=1) for t in range(len(TASKS))])
    trainer(a.pretrain, [], root, "base").fit(base, torch.utils.data.DataLoader(mixture, batch_size=64, shuffle=True))
    base_state = {k: v.clone() for k, v in base.state_dict().items()}

    # three runs, one per task, from the same base, sharing one store
    specialists: dict[str, Net] = {}
    callbacks: dict[str, RAMCallback] = {}
    for t, name in enumerate(TASKS):
        model = Net()
        model.load_state_dict(base_state)
        ram = RAMCallback(store_dir, name, snapshot_every=25, merge_every=50, evaluate=scores, keep=3)
        loader = torch.utils.data.DataLoader(task_data(t, 4096, seed=2), batch_size=64, shuffle=True)
        trainer(a.steps, [ram], root, name).fit(model, loader)
        specialists[name], callbacks[name] = model, ram
        last = ram.history[-1]
        print(
            f"{name}: {a.steps} steps; generalist at step {int(last['step'])} from "
            f"{int(last['ram/agents'])} agent(s): mean accuracy {last['ram/acc_mean']:.3f}"
        )

    # the generalist, straight from the store (any process could do this, while the runs go on)
    store = SnapshotStore(store_dir)
    latest = store.latest_all()
    base_model = Net()
    base_model.load_state_dict(base_state)
    generalist, info = ram_merge(latest, base=base_model, return_info=True)  # RAM+ (paper defaults)
    plain = ram_merge(latest, base_model, RamConfig(lam=Unit()))  # RAM (λ = 1)
    average = merge(latest, base=base_model, method="linear")  # plain averaging
    ties = merge(latest, base=base_model, method="ties", density=0.2)

    rows = (
        [("base", base_model)]
        + [(f"specialist {n}", m) for n, m in specialists.items()]
        + [
            ("average (linear)", average),
            ("TIES (density 0.2)", ties),
            ("RAM", plain),
            ("RAM+ (generalist)", generalist),
        ]
    )
    head = f"{'model':<22}" + "".join(f"{n:>9}" for n in TASKS) + f"{'mean':>9}"
    print()
    print(head)
    print("-" * len(head))
    for label, model in rows:
        s = scores(model)
        print(f"{label:<22}" + "".join(f"{s[f'acc_{n}']:>9.3f}" for n in TASKS) + f"{s['acc_mean']:>9.3f}")
    print()
    report = probe(latest, base=base_model)
    print(report.table())
    snaps = ", ".join(
        f"{n}@{s.step}: {s.bytes / 1024:.1f} KiB ({s.bytes / s.dense_bytes:.0%} of dense)" for n, s in latest.items()
    )
    print(f"\nsnapshots merged: {snaps}")
    print("λ (RAM+): " + ", ".join(f"{n} {v:.3f}" for n, v in (info.lambdas or {}).items()))
    print(f"store: {store_dir}   logs: {root}   ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
