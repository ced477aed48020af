"""RAMCallback with the real Lightning Trainer on 2 CPU processes (gloo): DDP (rank zero writes, every rank merges
the same snapshots) and ModelParallelStrategy (DTensor parameters, tensor parallel and FSDP2: every rank writes
its shards; the merge runs shard by shard).

Each test writes a script and runs it; Lightning's launcher starts the second rank by running the script again.
The script saves what the ranks saw (live weights at snapshot steps, the merged weights inside ``evaluate``,
weights around the merge); the test compares them with the store read in this process.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

from safetensors.torch import load_file

from ram_live import merge
from ram_live.store import SnapshotStore

ROOT = Path(__file__).resolve().parent.parent

COMMON = r'''
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, lightning as L
from torch import nn
from safetensors.torch import save_file
from ram_live.integrations.lightning import RAMCallback

ROOT_OUT = sys.argv[1]
OUT = MODE = None


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def weights(module):
    return {k: full(v.detach()).clone().contiguous() for k, v in module.state_dict().items()}


def local(module):
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in module.state_dict().items()}


def data(agent, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + ord(agent)))
    return torch.utils.data.TensorDataset(x, x @ w)


class Recorder(L.Callback):
    """Around RAMCallback: weights before and after its on_train_batch_end, live weights at snapshots."""

    def __init__(self, ram, first):
        self.ram, self.first, self.before, self.report = ram, first, None, {"restored": [], "merges": 0}

    def on_train_batch_end(self, trainer, pl_module, *args):
        if self.first:
            self.before = local(pl_module)
            return
        step = trainer.global_step
        if self.ram.schedule.last_snapshot_step == step:
            w = weights(pl_module)
            if trainer.is_global_zero:
                save_file(w, f"{OUT}/live_{self.ram.agent}_{step}.safetensors")
        if self.ram.schedule.last_merge_step == step and self.before_ref.before is not None:
            after = local(pl_module)
            ok = all(torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
                     for a, b in zip(self.before_ref.before.values(), after.values()))
            self.report["restored"].append(ok)
            self.report["merges"] += 1
            if MODE == "ddp":  # replicated: the merge result holds whole tensors
                merged = {k: v.contiguous() for k, v in self.ram.last_result.tensors.items()}
                save_file(merged, f"{OUT}/merged_rank{trainer.global_rank}.safetensors")


def record_merged(module):
    w = weights(module)  # the merged weights are swapped in here
    rank = int(os.environ.get("LOCAL_RANK", 0))
    save_file(w, f"{OUT}/merged_rank{rank}.safetensors")
    return {"probe_norm": float(sum(v.float().norm() for v in w.values()))}


def fit(module, agent, steps, merge_every, evaluate, strategy, val=False):
    ram = RAMCallback(f"{OUT}/store", agent, snapshot_every=2, merge_every=merge_every, evaluate=evaluate,
                      durable=False)
    pre, post = Recorder(ram, True), Recorder(ram, False)
    post.before_ref = pre
    logger = L.pytorch.loggers.CSVLogger(OUT, name=f"logs_{agent}", version=0)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=steps, logger=logger,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0 if not val else None,
                        callbacks=[pre, ram, post], use_distributed_sampler=True)
    dl = torch.utils.data.DataLoader(data(agent), batch_size=8)
    vl = torch.utils.data.DataLoader(data("v", 32, 1), batch_size=4) if val else None
    trainer.fit(module, dl, vl)
    rank = trainer.global_rank
    with open(f"{OUT}/report_{agent}_rank{rank}.json", "w") as fh:
        json.dump({**post.report, "state": ram.state_dict(), "history": ram.history, "mode": ram.mode}, fh)
'''

SCRIPT = (
    COMMON
    + r"""
from lightning.pytorch.strategies import ModelParallelStrategy


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class TPNet(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def configure_model(self):
        if MODE == "tp":
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
            parallelize_module(self.net, self.device_mesh["tensor_parallel"],
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
        else:
            from torch.distributed.fsdp import fully_shard
            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def strategy():
    if MODE == "ddp":
        return "ddp"
    if MODE == "tp":
        return ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
    return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)


for MODE in ("ddp", "tp", "fsdp"):  # one launch of two processes, three strategies one after the other
    OUT = os.path.join(ROOT_OUT, MODE)
    os.makedirs(OUT, exist_ok=True)
    model = Net if MODE == "ddp" else TPNet
    fit(model(), "a", 4, None, False, strategy())
    if MODE == "ddp":
        fit(model(), "b", 4, 4, None, strategy(), val=True)
    else:
        fit(model(), "b", 4, 4, record_merged, strategy())
"""
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs the script once (two processes: DDP, then tensor parallel, then FSDP2); one folder per strategy."""
    tmp_path = tmp_path_factory.mktemp("lightning_dist")
    _run(tmp_path, SCRIPT)
    return tmp_path


def _run(tmp_path: Path, script: str) -> None:
    path = tmp_path / "run.py"
    path.write_text(script)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run(
        [sys.executable, str(path), str(tmp_path)],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _base_weights(tmp_path):
    return SnapshotStore(tmp_path / "store").base_source()


def _same(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


def _check_common(tmp_path, parts):
    store = SnapshotStore(tmp_path / "store")
    assert store.steps("a") == [2, 4] and store.steps("b") == [2, 4]
    for agent in ("a", "b"):
        for step in (2, 4):
            snap = store.open(agent, step)
            assert len(snap.manifest["files"]) == parts == snap.manifest["parts"]
            live = load_file(str(tmp_path / f"live_{agent}_{step}.safetensors"))
            for k, v in live.items():
                assert _same(snap.get(k), v), (agent, step, k)
    reports = [json.loads((tmp_path / f"report_b_rank{r}.json").read_text()) for r in (0, 1)]
    for rep in reports:
        assert rep["merges"] == 1 and rep["restored"] == [True]
        assert rep["state"]["snapshots"] == 2 and rep["state"]["merges"] == 1
        assert rep["state"]["last_snapshot_step"] == 4 and rep["state"]["last_merge_step"] == 4
    history = reports[0]["history"][0]
    assert history["ram/a/snapshot_step"] == 4 and history["ram/b/snapshot_step"] == 4
    # the generalist equals RAM+ of the live weights (and of the snapshots, read here)
    live = {a: load_file(str(tmp_path / f"live_{a}_4.safetensors")) for a in ("a", "b")}
    base = {k: store.base_source().get(k).clone() for k in store.base_source().keys()}
    ref, info = merge(live, base=base, return_info=True)
    from_store = merge({a: store.open(a, 4) for a in ("a", "b")})
    for k in ref:
        assert _same(from_store[k], ref[k]), k
    assert history["ram/a/lambda"] == pytest.approx(info.lambdas["a"])
    assert history["ram/b/lambda"] == pytest.approx(info.lambdas["b"])
    total = sum(v.numel() for v in base.values())
    assert history["ram/a/density"] == pytest.approx(info.statistics.active[0].item() / total)
    with open(tmp_path / "logs_b" / "version_0" / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    logged = [r for r in rows if r.get("ram/b/lambda")]
    assert len(logged) == 1 and float(logged[0]["ram/b/lambda"]) == pytest.approx(info.lambdas["b"])
    return ref, reports


def test_ddp_rank_zero_writes_every_rank_merges_validation_swapped(runs):
    tmp_path = runs / "ddp"
    ref, reports = _check_common(tmp_path, parts=1)
    assert reports[0]["mode"] == "ddp"
    assert {p.name.rsplit(".", 2)[-2] for p in (tmp_path / "store" / "a").glob("*.safetensors")} == {"p0"}
    # validation of the merged weights, averaged over both ranks' halves of the validation set
    g = torch.Generator().manual_seed(1)
    xv = torch.randn(32, 8, generator=g)
    wv = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + ord("v")))
    yv = xv @ wv
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    net.load_state_dict({k.removeprefix("net."): v for k, v in ref.items()})
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(net(xv), yv).item()
    for rep in reports:
        assert rep["history"][0]["ram/val_loss"] == pytest.approx(expected, rel=1e-5)
    for rank in (0, 1):
        merged = load_file(str(tmp_path / f"merged_rank{rank}.safetensors"))
        for k in ref:
            assert _same(merged[k], ref[k]), (rank, k)


@pytest.mark.parametrize("mode", ["tp", "fsdp"])
def test_model_parallel_dtensor_shards(runs, mode):
    tmp_path = runs / mode
    ref, reports = _check_common(tmp_path, parts=2)
    assert reports[0]["mode"] == "model_parallel"
    store = SnapshotStore(tmp_path / "store")
    snap = store.open("a", 4)
    pieces = snap.manifest["tensors"]["net.0.weight"]["pieces"]
    assert sorted(p["offsets"][0] for p in pieces) == [0, 8] and all(p["shape"] == [8, 8] for p in pieces)
    if mode == "tp":  # row-wise parallel: the second linear is cut along dim 1; its bias is replicated (one piece)
        assert sorted(p["offsets"][1] for p in snap.manifest["tensors"]["net.2.weight"]["pieces"]) == [0, 8]
        assert len(snap.manifest["tensors"]["net.2.bias"]["pieces"]) == 1
    for rank in (0, 1):
        merged = load_file(str(tmp_path / f"merged_rank{rank}.safetensors"))
        for k in ref:
            assert _same(merged[k], ref[k]), (rank, k)
