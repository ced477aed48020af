"""Bad input: clear errors from the library's hierarchy, raised before anything is written; inputs untouched."""

import copy

import pytest
import torch
from torch import nn

from ram_live import (
    ConfigError,
    InputMismatchError,
    MissingBaseError,
    NoAgentsError,
    NonFiniteError,
    RamLiveError,
    UnsupportedInputError,
    merge,
)
from ram_live.engine.plan import build_plan
from ram_live.io.sources import as_source
from tests.conftest import assert_bit_identical, make_agents, snapshot


def _expect(exc, match, agents, base, **kw):
    before = [snapshot(a) for a in agents] + [snapshot(base)]
    with pytest.raises(exc, match=match) as info:
        merge(agents, base=base, **kw)
    for obj, s in zip([*agents, base], before):
        assert_bit_identical(snapshot(obj), s)
    assert isinstance(info.value, RamLiveError)
    return info.value


def test_missing_and_extra_keys_name_agent_and_key(base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    del agents[1]["layers.1.w"]
    err = _expect(InputMismatchError, r"agent 'agent_1'.*missing 1 key.*layers\.1\.w", agents, base_sd)
    assert err.agent == "agent_1" and err.key == "layers.1.w"
    agents = make_agents(base_sd, [0.5])
    agents[0]["extra"] = torch.zeros(2)
    _expect(InputMismatchError, r"1 key\(s\) the base lacks.*extra", agents, base_sd)


def test_shape_mismatch(base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    agents[0]["layers.0.b"] = torch.zeros(17)
    err = _expect(InputMismatchError, r"'layers\.0\.b'.*agent_0.*\[17\].*\[16\]", agents, base_sd)
    assert isinstance(err, ValueError)


def test_non_float_tensors_must_match(base_sd):
    base = dict(base_sd, ids=torch.arange(4))
    agents = make_agents(base, [0.5, 0.5])
    agents[1]["ids"] = torch.arange(4).flip(0)
    _expect(InputMismatchError, r"non-floating tensor 'ids' of agent 'agent_1'", agents, base)
    agents[1]["ids"] = torch.arange(4, dtype=torch.int32)
    _expect(InputMismatchError, r"'ids'.*int32.*int64", agents, base)
    agents[1]["ids"] = torch.arange(4.0)
    _expect(InputMismatchError, r"'ids'.*float32", agents, base)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("who", ["agent", "base"])
def test_non_finite_inputs(base_sd, bad, who):
    agents = make_agents(base_sd, [0.5, 0.5])
    target = agents[1] if who == "agent" else base_sd
    target["layers.1.w"][3, 4] = bad
    name = "agent 'agent_1'" if who == "agent" else "the base"
    _expect(NonFiniteError, rf"'layers\.1\.w' of {name} holds .* at flat index 52", agents, base_sd)


def test_inplace_failure_leaves_base_untouched():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    agents = [nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)) for _ in range(2)]
    with torch.no_grad():
        agents[1][1].weight[0, 0] = float("nan")  # in the last tensor: the first ones would be merged already
    _expect(NonFiniteError, "agent_1", agents, base, inplace=True)


def test_no_agents_and_missing_base(base_sd):
    with pytest.raises(NoAgentsError):
        merge([], base=base_sd)
    with pytest.raises(NoAgentsError):
        merge({}, base=base_sd)
    with pytest.raises(MissingBaseError, match="base="):
        merge(make_agents(base_sd, [0.5]))


def test_unsupported_inputs(base_sd):
    with pytest.raises(UnsupportedInputError, match="agent_0: cannot merge a int"):
        merge([3], base=base_sd)
    with pytest.raises(UnsupportedInputError, match="single model"):
        merge(base_sd, base=base_sd)
    with pytest.raises(UnsupportedInputError, match="no such file"):
        merge(["/nonexistent/model"], base=base_sd)


def test_base_of_another_architecture():
    base = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    other = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 2))
    with pytest.raises(InputMismatchError, match=r"'0\.weight'.*\[6, 4\].*\[8, 4\]"):
        merge([other], base=base)


def test_bad_options(base_sd):
    agents = make_agents(base_sd, [0.5])
    for kwargs, match in [
        ({"method": "ram++"}, "unknown merge method"),
        ({"activity": "rel"}, "activity"),
        ({"rho_scope": "layer"}, "rho_scope"),
        ({"eps": -1.0}, "eps"),
        ({"r": -0.1}, "r must"),
    ]:
        with pytest.raises(RamLiveError, match=match):
            merge(agents, base=base_sd, **kwargs)
    with pytest.raises(RamLiveError, match="inplace"):
        merge(agents, base=base_sd, inplace=True)


def test_plan_buffers_aliases_and_non_float():
    m = nn.Sequential(nn.Embedding(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 4, bias=False))
    m[2].weight = m[0].weight
    plan = build_plan(as_source(m, "base"), [as_source(m, "a")])
    assert plan.merge == ("0.weight", "1.weight", "1.bias")
    assert set(plan.copy) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert plan.alias == {"2.weight": "0.weight"} and plan.check_equal == ()


def test_failed_merge_of_every_method_leaves_inputs_untouched(base_sd):
    agents = make_agents(base_sd, [0.5, 0.5])
    agents[0]["head.weight"][0, 0] = float("nan")
    before = [snapshot(a) for a in agents] + [snapshot(base_sd)]
    for method in ("linear", "task_arithmetic", "ties", "dare_linear", "dare_ties", "ram", "ram_plus"):
        with pytest.raises(NonFiniteError):
            merge(agents, base=base_sd, method=method)
    for obj, s in zip([*agents, base_sd], before):
        assert_bit_identical(snapshot(obj), s)


def _merge_in_child(queue):
    from tests.conftest import make_agents as _make

    torch.set_num_threads(1)  # torch's own OpenMP threads are not fork-safe; ours are what is tested
    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(300_000, generator=g)}
    merged = merge(_make(base, [0.3, 0.5]), base=base, workers=2)
    queue.put(int(merged["w"].view(torch.int32).long().sum()))  # a checksum of the bits


def test_a_forked_child_merges_after_the_parent_did(base_sd):
    """The engine's shared thread pool is forgotten in a forked child (its threads do not exist there)."""
    import multiprocessing as mp

    g = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(300_000, generator=g)}
    merged = merge(make_agents(base, [0.3, 0.5]), base=base, workers=2)  # the shared pool exists now
    want = int(merged["w"].view(torch.int32).long().sum())
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_merge_in_child, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the child hung or failed"
    assert queue.get(timeout=5) == want


def _overflowing(dtype):
    """A two-layer module and two agents whose inputs are finite but whose RAM+ merge (λ_agent_0 = 1.2 on the
    entry it alone moved, 0.9 × the dtype's largest value away from a base near it) does not fit ``dtype``."""
    big = torch.finfo(dtype).max
    base = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)).to(dtype)
    with torch.no_grad():
        for p in base.parameters():
            p.zero_()
        base[1].weight[0, 0] = 0.9 * big
    agents = [copy.deepcopy(base), copy.deepcopy(base)]
    with torch.no_grad():
        agents[0][1].weight[0, 0] = big  # alone: λ = 1 + 0.1 · min(ρ, 2) = 1.2
        for a, step in zip(agents, (1.0, 2.0)):
            a[0].weight.add_(step)  # shared: ρ_agent_0 = 16
    return base, agents


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_in_place_merge_that_overflows_leaves_the_base_untouched(dtype):
    """Finite inputs whose merged value leaves the dtype's range: NonFiniteError naming the tensor, before the first
    write into the base (the first layer, merged first, fits: it must not be written either)."""
    base, agents = _overflowing(dtype)
    err = _expect(
        NonFiniteError, r"tensor '1\.weight': the merged value at flat index 0 overflows", agents, base, inplace=True
    )
    assert err.key == "1.weight"
    _expect(NonFiniteError, "merged value at flat index 0 overflows", agents, base)  # a new module
    merged, info = merge(agents, base=base, inplace=True, method="ram", return_info=True)  # λ = 1: fits
    assert merged is base and float(base[1].weight[0, 0].detach()) == torch.finfo(dtype).max
    # only the tensor whose magnitudes the validation pass could not clear was merged twice
    assert info.extra["dry_run"] == 1 and info.passes == 3


@pytest.mark.parametrize("method", ["task_arithmetic", "linear", "ties", "dare_linear"])
def test_other_methods_check_what_they_write(base_sd, method):
    """A float16 output past 65504 raises, on the torch path of every method (it used to be written as Inf)."""
    base = {k: v.half() for k, v in base_sd.items()}
    agents = make_agents(base, [1.0, 1.0], scale=0.05)
    for a in agents:
        a["layers.1.w"][0, 0] = 6e4
    options = {
        "task_arithmetic": dict(scale=2.0),
        "linear": dict(weights=[1.5, 1.5], normalize=False),
        "ties": dict(density=1.0, scale=2.0),
        "dare_linear": dict(density=0.999, scale=2.0),
    }[method]
    before = [snapshot(a) for a in (*agents, base)]
    with pytest.raises(NonFiniteError, match=r"tensor 'layers\.1\.w': the merged value at flat index 0 overflows"):
        merge(agents, base=base, method=method, **options)
    for obj, snap in zip((*agents, base), before):
        assert_bit_identical(obj, snap)


def test_meta_tensors_device_and_dtype_options_are_library_errors(base_sd):
    agents = make_agents(base_sd, [0.5])
    with torch.device("meta"):
        meta = nn.Linear(4, 4)
    with pytest.raises(UnsupportedInputError, match=r"'weight' is on the meta device"):
        merge([meta], base=meta)
    for device in ("nope", "meta"):
        with pytest.raises(ConfigError, match="device="):
            merge(agents, base=base_sd, device=device)
    for dtype in (torch.int32, torch.bool, torch.complex64, "bfloat16"):
        with pytest.raises(ConfigError, match="dtype= must be one of"):
            merge(agents, base=base_sd, dtype=dtype)


class _WithExtraState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.note = {"steps": 3}

    def get_extra_state(self):
        return self.note

    def set_extra_state(self, state) -> None:
        self.note = state


def test_a_module_with_extra_state_merges_and_keeps_the_bases():
    torch.manual_seed(0)
    base = _WithExtraState()
    agent = copy.deepcopy(base)
    agent.note = {"steps": 9}
    with torch.no_grad():
        agent.lin.weight.add_(1.0)
    merged = merge([agent], base=base, method="ram")
    assert merged.note == {"steps": 3} and torch.equal(merged.lin.weight, agent.lin.weight)


def test_an_agent_that_unties_what_the_base_ties_is_an_error():
    """The merge keeps the base's tie (one tensor): an agent whose head differs from its embedding would lose its
    head silently; one that holds the same values under both names merges."""
    base = nn.Sequential(nn.Embedding(4, 3), nn.Linear(3, 4, bias=False))
    base[1].weight = base[0].weight
    agent = copy.deepcopy(base)
    agent[1].weight = nn.Parameter(agent[0].weight.detach() + 1.0)
    err = _expect(
        InputMismatchError,
        r"tensor '1\.weight': agent 'agent_0' holds other values there than under "
        r"'0\.weight'",
        [agent],
        base,
    )
    assert err.agent == "agent_0" and err.key == "1.weight"
    same = {k: v.clone() for k, v in agent.state_dict().items()}  # untied copies, equal values: fine
    same["1.weight"] = same["0.weight"].clone()
    merged = merge([same], base=base, method="ram")
    assert merged[1].weight is merged[0].weight and torch.equal(merged[0].weight, same["0.weight"])


def test_a_non_finite_buffer_of_the_base_is_an_error():
    base = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    agent = copy.deepcopy(base)
    with torch.no_grad():
        base[1].running_mean[2] = float("nan")
    err = _expect(
        NonFiniteError, r"tensor '1\.running_mean' of the base \(a buffer.*nan at flat index 2", [agent], base
    )
    assert err.agent == "base"


def test_tied_module_with_folders_that_leave_the_tied_name_out(tmp_path):
    """save_pretrained leaves a tied head out of the folder: a tied module base with folder agents, and a folder
    base with tied module agents, merge as the modules do."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config)
    agents = []
    for i in range(2):
        agent = copy.deepcopy(base)
        with torch.no_grad():
            for p in agent.parameters():
                p.add_((torch.rand_like(p) < 0.3) * 0.01)
        agent.save_pretrained(tmp_path / f"a{i}")
        agents.append(agent)
    base.save_pretrained(tmp_path / "base")
    assert "lm_head.weight" not in load_keys(tmp_path / "a0")
    want = merge(agents, base=base)
    got = merge([tmp_path / "a0", tmp_path / "a1"], base=base)
    assert got.lm_head.weight is got.model.embed_tokens.weight
    assert_bit_identical(got.state_dict(), want.state_dict())
    from_folder = merge(agents, base=tmp_path / "base")
    assert "lm_head.weight" not in from_folder
    assert torch.equal(from_folder["model.embed_tokens.weight"], want.model.embed_tokens.weight)


def load_keys(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_an_index_whose_weight_map_is_not_a_mapping(tmp_path, base_sd):
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ["model.safetensors"]}')
    with pytest.raises(UnsupportedInputError, match="weight_map is not a mapping"):
        merge([tmp_path], base=base_sd)


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("eps", [1e-3, 0.1, 3e-4, 1e-5])
def test_the_eps_rule_is_strict_for_every_float32_delta(monkeypatch, eps, native):
    """|τ| > eps exactly: a float32 τ equal to eps rounded to float32 is active where that rounding went up
    (1e-3, 0.1, 3e-4), inactive where it went down (1e-5), on the native and the torch path."""
    monkeypatch.setenv("RAM_LIVE_NATIVE", native)
    import ram_live.methods.ram.native as native_mod

    monkeypatch.setattr(native_mod, "_KERNELS", False if native == "1" else None)
    tau = torch.tensor(eps, dtype=torch.float32)
    merged = merge([{"w": tau.repeat(40)}], base={"w": torch.zeros(40)}, method="ram", eps=eps)["w"]
    want = tau if float(tau) > eps else torch.tensor(0.0)
    assert torch.equal(merged, want.repeat(40)), (eps, float(tau))
