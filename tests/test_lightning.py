"""RAMCallback on one device with the real Lightning Trainer (CPU), and RAMSchedule in a plain PyTorch loop."""

from __future__ import annotations

import csv
from pathlib import Path
import types
import warnings

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

from ram_live.integrations.lightning import RAMCallback, SingleAgentWarning, UnsupportedStrategyError  # noqa: E402

from ram_live import merge, probe  # noqa: E402
from ram_live.errors import UnchangedAgentWarning  # noqa: E402
from ram_live.training.schedule import RAMSchedule  # noqa: E402
from ram_live.store import BaseMismatchError, SnapshotStore  # noqa: E402

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")


class Net(L.LightningModule):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.norm = nn.BatchNorm1d(4)  # buffers: taken from the base by the merge

    def forward(self, x):
        return self.norm(self.net(x))

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), batch_size=len(x))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data(agent: str, n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 + ord(agent)))
    return torch.utils.data.TensorDataset(x, x @ w)


VAL = _data("v", 24, 1)


def _loader(ds, batch=8):
    return torch.utils.data.DataLoader(ds, batch_size=batch)


def _trainer(callbacks, steps, tmp_path=None, name="logs", **kw):
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name=name, version=0) if tmp_path is not None else False
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **kw,
    )


def _copy(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _module(state):
    m = Net()
    m.load_state_dict(state)
    return m


def _val_loss(state) -> float:
    """The validation loss of a Net holding ``state`` (what the callback's validation loop logs)."""
    merged = _module(state)
    merged.eval()
    with torch.no_grad():
        xs, ys = VAL.tensors
        return nn.functional.mse_loss(merged(xs), ys).item()


def _same(a, b):
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


class Around(L.Callback):
    """Weights before (listed before RAMCallback) / after (listed after) each on_train_batch_end, per step."""

    def __init__(self):
        self.at: dict[int, dict] = {}

    def on_train_batch_end(self, trainer, pl_module, *args):
        self.at[trainer.global_step] = _copy(pl_module)


def test_merge_equals_ram_merge_of_live_models_and_validation_swap_restores(tmp_path):
    store = tmp_path / "store"
    base = _copy(Net())
    model_a = Net()
    _trainer([RAMCallback(store, "a", snapshot_every=2, durable=False)], 6).fit(model_a, _loader(_data("a")))
    before, after = Around(), Around()
    ram = RAMCallback(store, "b", snapshot_every=2, merge_every=4, durable=False)
    model_b = Net()
    trainer = _trainer([before, ram, after], 6, tmp_path, "b")
    trainer.fit(model_b, _loader(_data("b")), _loader(VAL))
    # the merge at step 4 used a's latest snapshot (6) and b's snapshot of step 4
    s = SnapshotStore(store)
    assert s.steps("a") == [2, 4, 6] and s.steps("b") == [2, 4, 6]
    result = ram.last_result
    assert result.step == 4 and result.agents == {"a": 6, "b": 4}
    live = {"a": model_a, "b": _module(after.at[4])}  # modules: buffers marked (taken from the base)
    ref, info = merge(live, base=_module(base), return_info=True)
    ref = _copy(ref)
    for k in ref:
        assert _same(result.tensors[k], ref[k]), k
    # buffers come from the base
    assert _same(result.tensors["norm.running_mean"], base["norm.running_mean"])
    # the validation ran with the merged weights swapped in, and the weights came back bit-exactly
    for k, v in before.at[4].items():
        assert _same(after.at[4][k], v), k
    expected = _val_loss(ref)
    h = ram.history[0]
    assert h["ram/val_loss"] == pytest.approx(expected, rel=1e-6)
    assert h["ram/a/lambda"] == pytest.approx(info.lambdas["a"]) and h["ram/b/lambda"] == pytest.approx(
        info.lambdas["b"]
    )
    total = info.parameters
    assert h["ram/a/density"] == pytest.approx(info.statistics.active[0].item() / total)
    assert h["ram/b/rho"] == pytest.approx(info.rho["b"])
    assert float(trainer.callback_metrics["ram/val_loss"]) == pytest.approx(expected, rel=1e-6)
    with open(tmp_path / "b" / "version_0" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("ram/val_loss")]
    assert len(rows) == 1 and int(rows[0]["step"]) == 4
    assert float(rows[0]["ram/val_loss"]) == pytest.approx(expected, rel=1e-6)
    assert {"ram/a/density", "ram/a/rho", "ram/a/lambda", "ram/b/snapshot_step", "ram/merge_seconds"} <= set(rows[0])
    # the model still trains after the merge: its final weights are its own snapshot of step 6
    final = s.open("b", 6)
    for k, v in _copy(model_b).items():
        assert _same(final.get(k), v), k


def test_evaluate_callable_sees_the_merged_weights_and_probe_numbers_match(tmp_path):
    store = tmp_path / "store"
    base = _copy(Net())
    model_a = Net()
    writes_behind = RAMCallback(store, "a", snapshot_every=1, async_write=True, durable=False)
    _trainer([writes_behind], 3).fit(model_a, _loader(_data("a")))
    assert SnapshotStore(store).steps("a") == [1, 2, 3]  # written in the background, all on disk at train end
    seen = {}

    def evaluate(module):
        seen.update(_copy(module))
        return {"score": torch.tensor(0.75), "ram/custom": 2}

    ram = RAMCallback(
        store,
        "b",
        snapshot_every=3,
        merge_every=3,
        evaluate=evaluate,
        ram={"method": "ram"},
        async_write=True,
        durable=False,
    )
    model_b = Net()
    _trainer([ram], 3).fit(model_b, _loader(_data("b")))
    live = {"a": model_a, "b": model_b}
    ref = _copy(merge(live, base=_module(base), method="ram"))
    for k in ref:
        assert _same(seen[k], ref[k]), k
    h = ram.history[0]
    assert h["ram/score"] == 0.75 and h["ram/custom"] == 2.0
    report = probe(live, base=_module(base))
    for name in ("a", "b"):
        assert h[f"ram/{name}/density"] == pytest.approx(report.agents[name].density)
        assert h[f"ram/{name}/rho"] == pytest.approx(report.agents[name].rho)
        assert h[f"ram/{name}/lambda"] == 1.0


def test_resume_continues_counters_and_reloads_the_base(tmp_path):
    store = tmp_path / "store"
    initial = _copy(Net())
    model = Net()
    ram = RAMCallback(store, "a", snapshot_every=2, merge_every=4, evaluate=False, durable=False)
    trainer = _trainer([ram], 4)
    trainer.fit(model, _loader(_data("a")))
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    assert ram.state_dict()["snapshots"] == 2 and ram.state_dict()["merges"] == 1
    fingerprint = ram.state_dict()["base_fingerprint"]

    ram2 = RAMCallback(store, "a", snapshot_every=2, merge_every=4, evaluate=False, durable=False)
    model2 = Net(seed=7)  # not the base: its weights are replaced by the checkpoint's, the base comes from the store
    trainer2 = _trainer([ram2], 8)
    trainer2.fit(model2, _loader(_data("a")), ckpt_path=ckpt)
    state = ram2.state_dict()
    assert state["snapshots"] == 4 and state["merges"] == 2
    assert state["last_snapshot_step"] == 8 and state["last_merge_step"] == 8
    assert state["base_fingerprint"] == fingerprint == SnapshotStore(store).base_fingerprint
    assert [h["step"] for h in ram2.history] == [4.0, 8.0]  # the first run's merge is restored with the state
    assert ram2.history[0] == ram.history[0]
    for k, t in ram2.schedule.base.tensors.items():
        assert _same(t.tensor, initial[k]), k
    s = SnapshotStore(store)
    assert s.steps("a") == [2, 4, 6, 8]
    for k, v in _copy(model2).items():
        assert _same(s.open("a", 8).get(k), v), k


def test_a_run_from_another_base_is_refused(tmp_path):
    store = tmp_path / "store"
    _trainer([RAMCallback(store, "a", snapshot_every=2, durable=False)], 2).fit(Net(), _loader(_data("a")))
    with pytest.raises(BaseMismatchError, match="same base"):
        _trainer([RAMCallback(store, "c", snapshot_every=2, durable=False)], 2).fit(Net(seed=3), _loader(_data("c")))
    # the right base given explicitly works although the module starts elsewhere
    ram = RAMCallback(store, "c", base=SnapshotStore(store).base_source(), snapshot_every=2, keep=1, durable=False)
    _trainer([ram], 4).fit(Net(seed=3), _loader(_data("c")))
    assert SnapshotStore(store).steps("c") == [4]  # keep=1 pruned step 2


def test_unsupported_strategies_raise_at_setup():
    from lightning.pytorch.strategies import FSDPStrategy

    ram = RAMCallback("unused", "a")
    with pytest.raises(UnsupportedStrategyError, match="FSDPStrategy"):
        ram.setup(types.SimpleNamespace(strategy=FSDPStrategy()), Net(), "fit")
    assert issubclass(UnsupportedStrategyError, TypeError)


def test_should_snapshot_override_and_state_key(tmp_path):
    class Odd(RAMCallback):
        def should_snapshot(self, step, epoch):
            return step in (1, 3)

    ram = Odd(tmp_path / "store", "a", snapshot_on_train_end=False, durable=False)
    _trainer([ram], 5).fit(Net(), _loader(_data("a")))
    assert SnapshotStore(tmp_path / "store").steps("a") == [1, 3]
    assert ram.state_key != RAMCallback(tmp_path / "store", "b").state_key


def test_schedule_in_a_plain_loop(tmp_path):
    """Framework-free: a hand-written loop with RAMSchedule."""
    store = SnapshotStore(tmp_path / "store", durable=False)
    base = nn.Linear(6, 3)
    models = {name: nn.Linear(6, 3) for name in ("x", "y")}
    scores = []
    for name, model in models.items():
        model.load_state_dict(base.state_dict())
        schedule = RAMSchedule(store, name, snapshot_every=2, merge_every=4, evaluate=lambda m: {"w0": m.weight[0, 0]})
        schedule.attach(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(ord(name))
        for step in range(1, 5):
            opt.zero_grad()
            model(torch.randn(4, 6, generator=g)).pow(2).sum().backward()
            opt.step()
            metrics = schedule.on_step(model, step)
            if metrics:
                scores.append(metrics)
    assert len(scores) == 2 and scores[1]["ram/agents"] == 2.0
    ref = merge({n: m for n, m in models.items()}, base=base)
    assert scores[1]["ram/w0"] == pytest.approx(float(ref.weight[0, 0]))
    assert scores[1]["ram/y/snapshot_step"] == 4.0


def test_search_setting_picks_the_merge_with_the_validation_loop_logs_and_saves_it(tmp_path):
    """search=SearchSetting(metric="val_loss", mode="min"): every candidate scored by the module's own
    validation loop (weights swapped in and back), the winner merged, logged under ram/search/*, saved."""
    pytest.importorskip("ram_live.selection")
    from ram_live import merge
    from ram_live.training.search import SearchSetting
    from ram_live.training.search_record import load_choice

    store = tmp_path / "store"
    base = _copy(Net())
    _trainer([RAMCallback(store, "a", snapshot_every=3, durable=False)], 3).fit(Net(), _loader(_data("a")))
    before, after = Around(), Around()
    ram = RAMCallback(
        store,
        "b",
        snapshot_every=2,
        merge_every=4,
        durable=False,
        merged_dir=tmp_path / "merged",
        search=SearchSetting(metric="val_loss", mode="min", budget=6),
    )
    model_b = Net()
    trainer = _trainer([before, ram, after], 4, tmp_path, "b")
    trainer.fit(model_b, _loader(_data("b")), _loader(VAL))
    for k, v in before.at[4].items():  # every candidate's swap was undone bit for bit
        assert _same(after.at[4][k], v), k
    result = ram.last_result
    rec = result.extra["search"]
    assert rec["evaluations"] <= 6 and rec["metric"] == "val_loss"
    s = SnapshotStore(store)
    snaps = {n: s.open(n, step) for n, step in result.agents.items()}
    again = merge(snaps, base=base, **load_choice(rec["file"]))
    assert ram.saved == [str(tmp_path / "merged" / "b" / "step-4.safetensors")]  # and the choice next to it
    assert load_choice(tmp_path / "merged" / "b" / "step-4.search.json") == load_choice(rec["file"])
    for k, v in again.items():
        assert _same(result.tensors[k], v), k
    expected = _val_loss(again)
    h = ram.history[0]
    # the selection score is that merge's validation loss; the regular evaluation ran on it too
    assert h["ram/search/best_score"] == pytest.approx(expected, rel=1e-6)
    assert h["ram/val_loss"] == pytest.approx(expected, rel=1e-6)
    assert h[f"ram/search/method/{rec['best']['method']}"] == 1.0
    assert ram.state_dict()["last_search"]["best"] == rec["best"]
    with open(tmp_path / "b" / "version_0" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("ram/search/best_score")]
    assert len(rows) == 1 and float(rows[0]["ram/search/best_score"]) == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------------------------- generalists on disk


class Capture(L.Callback):
    """The module's weights when training starts."""

    def on_train_start(self, trainer, pl_module):
        self.weights = _copy(pl_module)


def test_merged_dir_and_load_generalist_like_weight_averaging(tmp_path):
    from safetensors.torch import load_file

    store = tmp_path / "store"
    _trainer([RAMCallback(store, "b", snapshot_every=2, durable=False)], 2).fit(Net(), _loader(_data("b")))
    ram = RAMCallback(
        store,
        "a",
        snapshot_every=2,
        merge_every=2,
        evaluate=False,
        durable=False,
        merged_dir=tmp_path / "merged",
        load_generalist=True,
    )
    model = Net()
    trainer = _trainer([ram], 4)
    trainer.fit(model, _loader(_data("a")))
    assert ram.saved == [str(tmp_path / "merged" / "a" / f"step-{n}.safetensors") for n in (2, 4)]
    s = SnapshotStore(store)
    want = merge({"a": s.open("a", 4), "b": s.open("b", 2)}, base=s.base_source())
    saved = load_file(ram.saved[-1])
    # the module holds the generalist (parameters merged, buffers the base's), bit for bit the file's
    got = _copy(model)
    for k, v in want.items():
        assert _same(got[k], v) and _same(saved[k], v), k
    # ...and the agent's own weights are kept: they are its last snapshot
    assert set(ram.agent_state) == set(want)
    for k, v in ram.agent_state.items():
        assert _same(v, s.open("a", 4).get(k)), k
    assert not torch.equal(ram.agent_state["net.0.weight"], got["net.0.weight"])
    # a checkpoint saved now holds the generalist as state_dict and the agent under ram_agent_state;
    # resuming from it trains on from the agent's weights
    ckpt = tmp_path / "end.ckpt"
    trainer.save_checkpoint(ckpt)
    raw = torch.load(ckpt, weights_only=False)
    assert torch.equal(raw["state_dict"]["net.0.weight"], want["net.0.weight"])
    assert torch.equal(raw["ram_agent_state"]["net.0.weight"], ram.agent_state["net.0.weight"])
    capture = Capture()
    ram2 = RAMCallback(store, "a", snapshot_every=2, evaluate=False, durable=False)
    _trainer([ram2, capture], 6).fit(Net(seed=5), _loader(_data("a")), ckpt_path=ckpt)
    for k, v in ram.agent_state.items():
        assert _same(capture.weights[k], v), k
    assert [h["step"] for h in ram2.history] == [2.0, 4.0] and ram2.saved == ram.saved


def test_two_agents_runs_sharing_a_merged_dir_keep_both_generalists(tmp_path):
    """One merged_dir for two agents' runs merging at the same step: each run saves under its agent's name, and a
    merge of a step already saved (a resumed run merging it again) goes beside it, never over it."""
    from safetensors.torch import load_file

    store, shared = tmp_path / "store", tmp_path / "merged"
    runs = {}
    for agent in ("a", "b"):
        ram = RAMCallback(
            store, agent, snapshot_every=2, merge_every=2, evaluate=False, durable=False, merged_dir=shared
        )
        model, trainer = Net(), _trainer([ram], 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SingleAgentWarning)  # a merges alone: b has not run yet
            warnings.simplefilter("ignore", UserWarning)  # SGD: no Adam importances
            trainer.fit(model, _loader(_data(agent)))
        runs[agent] = (ram, trainer, model)
    assert runs["a"][0].saved == [str(shared / "a" / "step-2.safetensors")]
    assert runs["b"][0].saved == [str(shared / "b" / "step-2.safetensors")]
    s = SnapshotStore(store)
    want = {
        "a": merge({"a": s.open("a", 2)}, base=s.base_source()),
        "b": merge({"a": s.open("a", 2), "b": s.open("b", 2)}, base=s.base_source()),
    }
    saved = {agent: load_file(shared / agent / "step-2.safetensors") for agent in want}
    for agent, tensors in want.items():
        assert set(saved[agent]) == set(tensors)
        for k, v in tensors.items():
            assert _same(saved[agent][k], v), (agent, k)
    assert not torch.equal(saved["a"]["net.0.weight"], saved["b"]["net.0.weight"])
    # b merges step 2 again: step-2-v1, then step-2-v2; the first file keeps its bytes
    ram, trainer, model = runs["b"]
    first = (shared / "b" / "step-2.safetensors").read_bytes()
    ram.merge_now(trainer, model)
    ram.merge_now(trainer, model)
    assert ram.saved == [
        str(shared / "b" / name) for name in ("step-2.safetensors", "step-2-v1.safetensors", "step-2-v2.safetensors")
    ]
    assert (shared / "b" / "step-2.safetensors").read_bytes() == first
    for path in ram.saved[1:]:
        again = load_file(path)
        assert all(_same(again[k], v) for k, v in want["b"].items())
    assert sorted(p.name for p in shared.iterdir()) == ["a", "b"]  # and no temporary file is left
    assert sorted(p.name for p in (shared / "b").iterdir()) == sorted(Path(p).name for p in ram.saved)


class Idle(Net):
    """An agent whose weights never move (learning rate 0), as a GRPO run's whose reward is always 0."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("method", ["ram", "ram_plus"])
def test_an_agent_that_never_changed_is_named_once_per_merge(tmp_path, method):
    store = tmp_path / "store"
    idle = RAMCallback(store, "idle", snapshot_every=2, durable=False, importance=None)
    _trainer([idle], 2).fit(Idle(), _loader(_data("i")))
    ram = RAMCallback(
        store,
        "a",
        snapshot_every=2,
        merge_every=2,
        evaluate=False,
        durable=False,
        importance=None,
        ram={"method": method},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer([ram], 4).fit(Net(), _loader(_data("a")))
    named = [w for w in caught if issubclass(w.category, UnchangedAgentWarning)]
    assert [w.message.agents for w in named] == [("idle",), ("idle",)]  # the merges of steps 2 and 4, once each
    assert all(str(w.message).startswith("RAMCallback('a'): agent 'idle' changed no entry") for w in named)
    assert [h["ram/idle/density"] for h in ram.history] == [0.0, 0.0]
    assert [h["ram/a/density"] > 0 for h in ram.history] == [True, True]
    assert ram.last_result.extra["unchanged"] == ["idle"]
    # the generalist is the merge of both snapshots, which is a's alone: idle adds nothing
    s = SnapshotStore(store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnchangedAgentWarning)
        want = merge({"a": s.open("a", 4), "idle": s.open("idle", 2)}, base=s.base_source(), method=method)
    alone = merge({"a": s.open("a", 4)}, base=s.base_source(), method=method)
    for k, v in want.items():
        assert _same(ram.last_result.tensors[k], v) and _same(alone[k], v), k


def test_merged_dir_saves_a_pretrained_folder_when_the_module_wraps_one(tmp_path):
    transformers = pytest.importorskip("transformers")

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            cfg = transformers.LlamaConfig(
                vocab_size=16,
                hidden_size=8,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
                max_position_embeddings=16,
            )
            self.model = transformers.LlamaForCausalLM(cfg)

        def training_step(self, batch, i):
            (ids,) = batch
            return self.model(input_ids=ids, labels=ids).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    ids = torch.utils.data.TensorDataset(torch.randint(0, 16, (8, 6), generator=torch.Generator().manual_seed(0)))
    store = tmp_path / "store"
    _trainer([RAMCallback(store, "b", snapshot_every=2, durable=False)], 2).fit(LM(), _loader(ids, 4))
    ram = RAMCallback(
        store,
        "a",
        base="store",
        snapshot_every=2,
        merge_every=2,
        evaluate=False,
        durable=False,
        merged_dir=tmp_path / "merged",
    )
    module = LM()
    with torch.no_grad():
        module.model.model.embed_tokens.weight.add_(0.01)  # a different agent (same base: the store's)
    _trainer([ram], 2).fit(module, _loader(ids, 4))
    folder = tmp_path / "merged" / "a" / "step-2"
    assert ram.saved == [str(folder)] and (folder / "config.json").exists()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder)
    s = SnapshotStore(store)
    want = merge({"a": s.open("a", 2), "b": s.open("b", 2)}, base=s.base_source())
    for k, v in loaded.state_dict().items():
        assert _same(v, want["model." + k]), k
    # the module itself was swapped back: it holds the agent's weights
    for k, v in _copy(module).items():
        assert _same(v, s.open("a", 2).get(k)), k


def test_state_key_ignores_how_the_store_is_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    assert RAMCallback("run/store", "a").state_key == RAMCallback(tmp_path / "run" / "store", "a").state_key
    assert RAMCallback("run/store", "a").state_key != RAMCallback("run/other", "a").state_key
    # a checkpoint whose state was saved under another spelling of the same store (as before the key was
    # resolved) is still found
    ram = RAMCallback("run/store", "a", snapshot_every=2, merge_every=2, evaluate=False, durable=False)
    trainer = _trainer([ram], 2)
    trainer.fit(Net(), _loader(_data("a")))
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    raw = torch.load(ckpt, weights_only=False)
    raw["callbacks"] = {"RAMCallback{'agent': 'a', 'store': 'run/store'}": raw["callbacks"][ram.state_key]}
    torch.save(raw, ckpt)
    ram2 = RAMCallback(tmp_path / "run" / "store", "a", snapshot_every=2, evaluate=False, durable=False)
    _trainer([ram2], 4).fit(Net(seed=4), _loader(_data("a")), ckpt_path=ckpt)
    assert ram2.state_dict()["snapshots"] == 2 and [h["step"] for h in ram2.history] == [2.0]


def test_a_merge_of_one_agent_warns(tmp_path):
    ram = RAMCallback(tmp_path / "store", "a", snapshot_every=2, merge_every=2, evaluate=False, durable=False)
    with pytest.warns(SingleAgentWarning, match="one agent only"):
        _trainer([ram], 2).fit(Net(), _loader(_data("a")))


def test_a_merged_dir_that_is_a_file_or_inside_the_store_is_refused_when_built(tmp_path):
    """A merged_dir that is a file used to fail with a raw NotADirectoryError at the first merge (hours into the
    run); one equal to the store wrote the generalists among the store's snapshots."""
    from ram_live.errors import ConfigError
    from ram_live.integrations._common import agent_folder

    store = tmp_path / "store"
    (tmp_path / "file").write_text("x")
    for merged_dir, message in (
        (tmp_path / "file", "exists and is not a folder"),
        (store, "is the snapshot store"),
        (store / "a", "is the snapshot store"),
    ):
        with pytest.raises(ConfigError, match=rf"^RAMCallback\('a'\): merged_dir='{merged_dir}' {message}"):
            RAMCallback(store, "a", merge_every=2, durable=False, merged_dir=merged_dir)
    with pytest.raises(ConfigError, match=rf"^merged_dir: {tmp_path / 'file'} exists and is not a folder"):
        agent_folder(tmp_path / "file", "a")  # the transformers callback's check at its save
    assert not store.exists()  # nothing written
    assert RAMCallback(store, "a", merge_every=2, durable=False, merged_dir=tmp_path / "m").merged_dir == tmp_path / "m"
