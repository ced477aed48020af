"""The callbacks store Adam's exp_avg_sq with every snapshot (issue 20): read back from the store they equal the
optimizer's own state (to the stored codes' rounding), merges of the store use them, other optimizers warn
once and snapshot without."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from ram_live.errors import ConfigError
from ram_live.training.schedule import RAMSchedule
from ram_live.store import SnapshotStore
from ram_live.store.importance_codes import quantize, dequantize

L = pytest.importorskip("lightning")
from ram_live.integrations._common import NoImportanceWarning  # noqa: E402
from ram_live.integrations.lightning import RAMCallback  # noqa: E402

warnings.filterwarnings("ignore", ".*does not have many workers.*")


def _stored(v: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """What the store keeps of importances ``v`` at the ``active`` entries (0 elsewhere): a second computation."""
    out = torch.zeros(v.numel())
    codes, m = quantize(v.reshape(-1)[active.reshape(-1)])
    out[active.reshape(-1)] = dequantize(codes, m)
    return out.view(v.shape)


class Net(L.LightningModule):
    def __init__(self, opt: str = "adam"):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        self.opt = opt
        self.seen: dict[int, dict[str, torch.Tensor]] = {}

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        if self.opt == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.05)
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Spy(L.Callback):
    """The optimizer's exp_avg_sq at each step, read directly (runs before RAMCallback's hook)."""

    def on_train_batch_end(self, trainer, pl_module, *args):
        opt = trainer.optimizers[0]
        pl_module.seen[trainer.global_step] = {
            n: opt.state[p]["exp_avg_sq"].clone() for n, p in pl_module.named_parameters() if p in opt.state
        }


def _loader(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 6, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :3] * (seed + 1)), batch_size=8)


def _fit(tmp_path, agent, seed, opt="adam", **kw):
    module = Net(opt)
    cb = RAMCallback(tmp_path / "store", agent, snapshot_every=2, evaluate=False, **kw)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Spy(), cb],
    )
    trainer.fit(module, _loader(seed))
    return module, cb


def test_lightning_stores_exp_avg_sq_and_merges_use_it(tmp_path: Path) -> None:
    module, cb = _fit(tmp_path, "a", 0)
    store = SnapshotStore(tmp_path / "store")
    assert store.steps("a") == [2, 4]
    for step in (2, 4):
        snap = store.open("a", step)
        assert snap.manifest["version"] == 3
        for name, v in module.seen[step].items():
            active = snap.get(name) != store.base_source().get(name)
            assert active.any()
            assert torch.equal(snap.importance.get(name), _stored(v, active)), (step, name)
    _fit(tmp_path, "b", 1)
    from ram_live import merge

    _, info = merge(store.latest_all(), return_info=True, importance="stored")
    assert info.extra["importance"] == "stored"
    assert cb.schedule.importance == "stored"  # importance="adam": the callback's merges weigh by them


def test_lightning_bias_correction_and_off(tmp_path: Path) -> None:
    module, _ = _fit(tmp_path / "bc", "a", 0, importance_bias_correction=True)
    store = SnapshotStore(tmp_path / "bc" / "store")
    snap = store.open("a", 4)
    name, v = next(iter(module.seen[4].items()))
    active = snap.get(name) != store.base_source().get(name)
    assert torch.equal(snap.importance.get(name), _stored(v / (1 - 0.999**4), active))
    _fit(tmp_path / "off", "a", 0, importance=None)
    assert SnapshotStore(tmp_path / "off" / "store").open("a", 4).importance is None
    assert RAMCallback(tmp_path / "off" / "store", "c", importance=None).schedule.importance is None


def test_lightning_sgd_warns_once_and_snapshots_without(tmp_path: Path) -> None:
    with pytest.warns(NoImportanceWarning, match="SGD keeps no 'exp_avg_sq'") as record:
        _fit(tmp_path, "a", 0, opt="sgd")
    assert sum(isinstance(w.message, NoImportanceWarning) for w in record) == 1
    assert SnapshotStore(tmp_path / "store").latest("a").importance is None


def test_schedule_snapshot_importance_and_merge_result(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = nn.Linear(4, 3)
    sd0 = {k: v.detach().clone() for k, v in base.state_dict().items()}
    results = {}
    for name, seed in (("a", 1), ("b", 2)):
        m = nn.Linear(4, 3)
        m.load_state_dict(sd0)
        s = RAMSchedule(tmp_path / "store", name, importance="stored")
        s.attach(m, base=sd0)
        with torch.no_grad():
            m.weight.add_(torch.randn(3, 4, generator=torch.Generator().manual_seed(seed)))
        imp = {"weight": torch.rand(3, 4) + 0.1, "bias": torch.zeros(3)}
        s.snapshot(m, 1, importance=imp)
        results[name] = s
    result = results["b"].merge(m, 1)
    assert result.extra["importance"] == "stored"
    plain = RAMSchedule(tmp_path / "store", "b")  # importance=None: plain RAM though the snapshots carry them
    plain.attach(m, base=sd0)
    assert "importance" not in plain.merge(m, 2).extra
    with pytest.raises(ConfigError, match="None \\(plain RAM\\) or 'stored'"):
        RAMSchedule(tmp_path / "store", "b", importance=False)


def test_schedule_stored_with_an_agent_without_importances_names_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = nn.Linear(4, 3)
    sd0 = {k: v.detach().clone() for k, v in base.state_dict().items()}
    for name in ("a", "b"):
        m = nn.Linear(4, 3)
        m.load_state_dict(sd0)
        s = RAMSchedule(tmp_path / "store", name, importance="stored")
        s.attach(m, base=sd0)
        with torch.no_grad():
            m.weight.add_(1.0)
        s.snapshot(m, 1, importance={"weight": torch.ones(3, 4), "bias": torch.ones(3)} if name == "a" else None)
    with pytest.raises(ConfigError, match=r"agent\(s\) 'b' carry no stored importances"):
        s.merge(m, 1)


def test_trl_grpo_callback_stores_the_live_optimizers_exp_avg_sq(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    import test_transformers_callback as tc

    from ram_live.integrations.transformers import RAMTrainerCallback

    seen: dict[int, dict[str, torch.Tensor]] = {}

    class Spy(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            opt = getattr(optimizer, "optimizer", optimizer)
            seen[state.global_step] = {
                n: opt.state[p]["exp_avg_sq"].clone() for n, p in model.named_parameters() if p in opt.state
            }

    transformers.logging.set_verbosity_error()
    cb = RAMTrainerCallback(tmp_path / "store", "vowels", snapshot_every=2)
    trainer = tc._trainer(tmp_path / "a", tc._vowels, 2, cb)
    trainer.add_callback(Spy())
    trainer.callback_handler.callbacks.sort(key=lambda c: isinstance(c, RAMTrainerCallback))  # the spy first
    trainer.train()
    store = SnapshotStore(tmp_path / "store")
    snap = store.open("vowels", 2)
    assert snap.manifest["version"] == 3 and seen[2]
    checked = 0
    for name, v in seen[2].items():
        key = name if name in snap.keys() else name.removeprefix("module.")
        active = snap.get(key) != store.base_source().get(key)
        if active.any():
            assert torch.equal(snap.importance.get(key), _stored(v.float(), active)), name
            checked += 1
    assert checked >= 3


def test_verl_optimizer_file_reader_maps_exp_avg_sq_by_position(tmp_path: Path) -> None:
    """integrations.verl.optim on torch.optim's real state dict layout (one rank, plain tensors; the FSDP2
    DTensor case is tests/verl): exp_avg_sq keyed by the model file's names, bias correction, refusals."""
    from ram_live.integrations.verl.checkpoint import ActorCheckpoint
    from ram_live.integrations.verl.optim import rank_importance

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()
    actor = tmp_path / "global_step_3" / "actor"
    actor.mkdir(parents=True)
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    torch.save(opt.state_dict(), actor / "optim_world_size_1_rank_0.pt")
    shards = ActorCheckpoint(actor).shards(0)
    keys = [k for k in shards.state if k not in shards.aliases]
    shapes = {k: tuple(shards.boxes[k].tensor.shape) for k in keys}
    imp, why = rank_importance(actor, 1, 0, keys, shapes)
    assert why is None and list(imp) == [n for n, _ in model.named_parameters()]
    for n, p in model.named_parameters():
        assert torch.equal(imp[n], opt.state[p]["exp_avg_sq"])
    bc, _ = rank_importance(actor, 1, 0, keys, shapes, bias_correction=True)
    assert torch.equal(bc["0.weight"], opt.state[model[0].weight]["exp_avg_sq"] / (1 - 0.99**3.0))
    # an optimizer over some parameters only (LoRA, frozen layers): the positions do not name them
    part = torch.optim.AdamW(model[2].parameters())
    model(torch.randn(2, 4)).sum().backward()
    part.step()
    torch.save(part.state_dict(), actor / "optim_world_size_1_rank_0.pt")
    imp, why = rank_importance(actor, 1, 0, keys, shapes)
    assert imp is None and "state for 2 parameters, the model file 4 tensors" in why
    (actor / "optim_world_size_1_rank_0.pt").unlink()
    imp, why = rank_importance(actor, 1, 0, keys, shapes)
    assert imp is None and "missing" in why


_FSDP2_SCRIPT = r"""
import os, sys, torch, torch.distributed as dist
from torch import nn
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from ram_live.integrations._common import AdamImportance
from ram_live.training.schedule import RAMSchedule
from ram_live.store import SnapshotStore, TorchCollective
from ram_live.store.importance_codes import dequantize, quantize
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
fully_shard(m, mesh=init_device_mesh("cpu", (1,)))
s = RAMSchedule(sys.argv[1], "a")
s.attach(m, collective=TorchCollective())
opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
s.importance_from = AdamImportance("test", lambda: opt)
for _ in range(2):
    opt.zero_grad(); m(torch.randn(3, 4)).sum().backward(); opt.step()
s.snapshot(m, 2)
store = SnapshotStore(sys.argv[1])
snap = store.open("a", 2)
ok = 0
for n, p in m.named_parameters():
    v = opt.state[p]["exp_avg_sq"].to_local().reshape(-1)
    active = (snap.get(n) != store.base_source().get(n)).reshape(-1)
    want = torch.zeros(v.numel())
    codes, mx = quantize(v[active])
    want[active] = dequantize(codes, mx)
    ok += int(torch.equal(snap.importance.get(n).reshape(-1), want))
print("MATCHED", ok, "OF", len(list(m.parameters())), "VERSION", snap.manifest["version"])
dist.destroy_process_group()
"""


def test_fsdp2_dtensor_moments_are_stored_as_local_shards(tmp_path: Path) -> None:
    """FSDP2 (fully_shard, one gloo process): parameters and exp_avg_sq are DTensors; the schedule stores the
    local shards read from the live optimizer (a separate process: the test session keeps no process group)."""
    import subprocess
    import sys

    script = tmp_path / "fsdp2.py"
    script.write_text(_FSDP2_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store"), str(29500 + os.getpid() % 400)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "MATCHED 4 OF 4 VERSION 3" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
