"""LoRA / PEFT adapters merged in ΔW space, with the real ``peft`` on tiny transformers models built from configs."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import warnings

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live import merge_task_vectors  # noqa: E402
from ram_live.errors import ConfigError, InputMismatchError, RamLiveError  # noqa: E402
from ram_live.peft import (  # noqa: E402
    DenseDeltaWarning,
    RelativeThreshold,
    TopK,
    UnsupportedAdapterError,
    lora_deltas,
    ram_merge_adapter_files,
    ram_merge_adapters,
    refactor,
)
from tests.reference import ref_ram  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning:peft",
    "ignore::FutureWarning",
    "ignore::RuntimeWarning:peft",
    "ignore::ram_live.peft.DenseDeltaWarning",
)

LLAMA = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
X = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()


def lora(**kw):
    cfg = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    cfg.update(kw)
    return LoraConfig(**cfg)


def peft_model(base, adapters: dict, seed: int = 0):
    """A PeftModel on a copy of ``base`` with one adapter per (name, LoraConfig), factors random (non-zero)."""
    torch.manual_seed(seed)
    names = list(adapters)
    model = get_peft_model(copy.deepcopy(base), adapters[names[0]], adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, adapters[name])
    with torch.no_grad():  # small, LoRA-like magnitudes
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.mul_(0.3)
    return model.eval()


def logits(model, adapter=None):
    if adapter is not None:
        model.set_adapter(adapter)
    with torch.no_grad():
        return model(X).logits


def delta_of(model, adapter):
    """ΔW per module of a live adapter, through PEFT's own get_delta_weight."""
    root = model.base_model.model
    return {
        name: mod.get_delta_weight(adapter).detach().float()
        for name, mod in root.named_modules()
        if hasattr(mod, "lora_A") and (adapter in mod.lora_A or adapter in getattr(mod, "lora_embedding_A", {}))
    }


def dense(deltas: list[dict]) -> list[dict]:
    """ΔW dicts completed with zeros for the modules an adapter does not target."""
    shapes = {k: v for d in deltas for k, v in d.items()}
    return [{k: d.get(k, torch.zeros_like(v)) for k, v in shapes.items()} for d in deltas]


def assert_close(a, b, rtol=2e-6):
    scale = max(float(b.abs().max()), 1e-30)
    assert float((a - b).abs().max()) <= rtol * scale, float((a - b).abs().max()) / scale


# ----------------------------------------------------------------------------------------------- ΔW extraction


@pytest.mark.parametrize(
    "cfg",
    [
        lora(),
        lora(use_rslora=True, r=8, lora_alpha=4),
        lora(rank_pattern={"model.layers.0.self_attn.q_proj": 2}, alpha_pattern={"v_proj": 3}),
        lora(target_modules=["embed_tokens", "down_proj"], r=3),
    ],
    ids=["plain", "rslora", "patterns", "embedding"],
)
def test_deltas_equal_peft_get_delta_weight(base, cfg, tmp_path):
    model = peft_model(base, {"code": cfg})
    expected = delta_of(model, "code")
    live = lora_deltas(model, "code")
    assert sorted(live) == sorted(expected)
    for k in expected:
        assert_close(live[k], expected[k])
    model.save_pretrained(tmp_path)
    from_disk = lora_deltas(tmp_path / "code")  # PEFT saves a non-default adapter in a subfolder
    assert sorted(from_disk) == sorted(expected)
    for k in expected:
        assert_close(from_disk[k], expected[k])


def test_fan_in_fan_out_conv1d_gpt2(tmp_path):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=16)).eval()
    cfg = LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    model = peft_model(gpt2, {"code": cfg, "tool": cfg})
    for k, v in lora_deltas(model, "tool").items():
        assert_close(v, delta_of(model, "tool")[k])
    ram_merge_adapters(model, ["code"], "solo", method="linear", rank=4)
    assert torch.allclose(logits(model, "solo"), logits(model, "code"), atol=1e-5)
    plain = ram_merge_adapters(model, ["code", "tool"], method="linear", into_base=True)
    expected = merge_task_vectors([lora_deltas(model, "code"), lora_deltas(model, "tool")], method="linear")
    w0 = dict(gpt2.named_parameters())
    for k, d in expected.items():
        assert_close(plain.get_submodule(k).weight.detach() - w0[k + ".weight"].detach(), d, rtol=1e-5)
    model.save_pretrained(tmp_path, selected_adapters=["code", "tool"])
    out = ram_merge_adapter_files(
        {"code": tmp_path / "code", "tool": tmp_path / "tool"}, tmp_path / "merged", method="linear", rank=8
    )
    reloaded = PeftModel.from_pretrained(copy.deepcopy(gpt2), out).eval()
    ram_merge_adapters(model, ["code", "tool"], "both", method="linear", rank=8)
    assert torch.allclose(logits(reloaded), logits(model, "both"), atol=1e-5)


# ----------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "cfg",
    [
        lora(),
        lora(use_rslora=True, r=8, lora_alpha=16),
        lora(rank_pattern={"v_proj": 6}, alpha_pattern={"q_proj": 2}),
        lora(target_modules=["embed_tokens", "o_proj"]),
    ],
    ids=["plain", "rslora", "patterns", "embedding"],
)
@pytest.mark.parametrize("method", ["ram", "ram_plus", "linear"])
def test_one_adapter_alone_gives_itself_back(base, cfg, method):
    model = peft_model(base, {"code": cfg})
    rank = max([cfg.r, *cfg.rank_pattern.values()])
    # eps=0: the paper's eps=1e-5 would drop the (few) entries of ΔW smaller than 1e-5
    eps = {} if method == "linear" else {"eps": 0.0}
    _, report = ram_merge_adapters(
        model, ["code"], "solo", method=method, rank=rank, sparsify=None, return_info=True, **eps
    )
    original, merged = delta_of(model, "code"), delta_of(model, "solo")
    assert sorted(merged) == sorted(original)
    for k in original:
        assert_close(merged[k], original[k], rtol=1e-5)
    assert report.max_error < 1e-5
    assert torch.allclose(logits(model, "solo"), logits(model, "code"), atol=1e-5)
    if cfg.use_rslora:
        assert model.peft_config["solo"].use_rslora is False


def test_rank_above_the_adapters_and_randomized_svd_round_trip(base):
    model = peft_model(base, {"code": lora(r=4)})
    ram_merge_adapters(model, ["code"], "big", method="linear", rank=12, svd="exact")
    ram_merge_adapters(model, ["code"], "rand", method="linear", rank=4, svd="randomized", oversample=4)
    for name in ("big", "rand"):
        for k, v in delta_of(model, "code").items():
            assert_close(delta_of(model, name)[k], v, rtol=1e-5)


def test_save_and_reload_give_the_live_outputs(base, tmp_path):
    model = peft_model(
        base,
        {
            "code": lora(r=4),
            "tool": lora(r=8, use_rslora=True, target_modules=["q_proj", "o_proj"]),
            "memory": lora(rank_pattern={"model.layers.1.self_attn.v_proj": 2}),
        },
    )
    # energy picks a rank per module: the new adapter carries a rank_pattern, which must reload (PEFT #3737)
    _, report = ram_merge_adapters(model, None, "generalist", energy=0.9, rank=16, return_info=True)
    ranks = {m.rank for m in report.modules.values()}
    assert len(ranks) > 1, ranks
    assert model.peft_config["generalist"].rank_pattern
    live = logits(model, "generalist")
    model.save_pretrained(tmp_path, selected_adapters=["generalist"])
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "generalist").eval()
    assert torch.equal(logits(reloaded), live)
    for k, v in delta_of(model, "generalist").items():
        assert_close(delta_of(reloaded, "default")[k], v)


# ----------------------------------------------------------------------------------------------- ΔW-space correctness


def test_linear_with_weights_equals_peft_cat(base):
    model = peft_model(
        base,
        {
            "code": lora(r=4),
            "tool": lora(r=8, lora_alpha=4),
            "memory": lora(r=2, lora_alpha=16, rank_pattern={"q_proj": 3}),
        },
    )
    weights = [0.5, 1.5, -0.7]
    model.add_weighted_adapter(["code", "tool", "memory"], weights, "peft_cat", combination_type="cat")
    ram_merge_adapters(
        model, ["code", "tool", "memory"], "ours", method="linear", weights=weights, normalize=False, rank=4 + 8 + 3
    )
    total = sum(weights)
    model.add_weighted_adapter(
        ["code", "tool", "memory"], [w / total for w in weights], "peft_cat_n", combination_type="cat"
    )
    ram_merge_adapters(model, ["code", "tool", "memory"], "ours_n", method="linear", weights=weights, rank=15)
    cat, ours = delta_of(model, "peft_cat"), delta_of(model, "ours")
    cat_n, ours_n = delta_of(model, "peft_cat_n"), delta_of(model, "ours_n")
    assert sorted(cat) == sorted(ours)
    for k in cat:
        assert_close(ours[k], cat[k], rtol=1e-5)
        assert_close(ours_n[k], cat_n[k], rtol=1e-5)
    assert torch.allclose(logits(model, "ours"), logits(model, "peft_cat"), atol=1e-5)


def test_rslora_scaled_once(base):
    """rsLoRA: s = alpha/sqrt(r). The merged adapter has scaling 1 and carries s in its factors."""
    model = peft_model(
        base, {"code": lora(r=16, lora_alpha=8, use_rslora=True), "tool": lora(r=4, lora_alpha=8, use_rslora=True)}
    )
    ram_merge_adapters(model, ["code", "tool"], "sum", method="task_arithmetic", rank=20)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["sum"] == 1.0
    for name in ("code", "tool"):
        a = layer.lora_A[name].weight
        assert layer.scaling[name] == pytest.approx(8 / math.sqrt(a.shape[0]))
    expected = sum(
        layer.lora_B[n].weight @ layer.lora_A[n].weight * 8 / math.sqrt(layer.r[n]) for n in ("code", "tool")
    )
    assert_close(layer.get_delta_weight("sum"), expected.detach(), rtol=1e-5)


def test_modules_missing_from_an_adapter_count_as_zero(base):
    model = peft_model(
        base, {"code": lora(target_modules=["q_proj", "v_proj"]), "tool": lora(target_modules=["q_proj", "o_proj"])}
    )
    code, tool = lora_deltas(model, "code"), lora_deltas(model, "tool")
    v, o, q = "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj"
    plain = ram_merge_adapters(model, ["code", "tool"], method="linear", into_base=True)
    w0 = dict(base.named_parameters())

    def merged(model_, k):
        return model_.get_submodule(k).weight.detach() - w0[k + ".weight"].detach()

    assert_close(merged(plain, v), code[v] / 2, rtol=1e-5)  # the mean counts tool's ΔW = 0
    assert_close(merged(plain, o), tool[o] / 2, rtol=1e-5)
    assert_close(merged(plain, q), (code[q] + tool[q]) / 2, rtol=1e-5)
    ram = ram_merge_adapters(model, ["code", "tool"], method="ram", sparsify=None, into_base=True, eps=0.0)
    assert_close(merged(ram, v), code[v], rtol=1e-5)  # RAM: a module one adapter targets is unique to it
    assert_close(merged(ram, o), tool[o], rtol=1e-5)
    ram_merge_adapters(model, ["code", "tool"], "ram_adapter", method="ram", sparsify=None, eps=0.0)
    assert model.peft_config["ram_adapter"].target_modules == {q, v, o} | {
        k.replace("layers.0", "layers.1") for k in (q, v, o)
    }
    assert_close(delta_of(model, "ram_adapter")[o], tool[o], rtol=1e-5)


@pytest.mark.parametrize("rule", [TopK(0.3), RelativeThreshold(1.0), None])
@pytest.mark.parametrize("variant", ["ram", "ram_plus", "ram_plus_soft"])
def test_into_base_equals_base_plus_merged_delta(base, rule, variant):
    """ΔW-space correctness against the naive reference RAM (float64, dense) on independently sparsified ΔW."""
    model = peft_model(
        base,
        {
            "code": lora(r=4),
            "tool": lora(r=8, target_modules=["q_proj", "o_proj"]),
            "memory": lora(r=2, use_rslora=True),
        },
    )
    names = ["code", "tool", "memory"]
    deltas = [lora_deltas(model, n) for n in names]
    keys = sorted(set().union(*deltas))
    sparse = []
    for d in deltas:
        out = {}
        for k in keys:
            x = d.get(k, torch.zeros_like(next(dd[k] for dd in deltas if k in dd))).clone()
            if rule is not None and k in d:
                if isinstance(rule, TopK):
                    n_keep = int(rule.density * x.numel())
                    cut = x.abs().flatten().sort(descending=True).values[n_keep - 1]
                    x[x.abs() < cut] = 0
                else:
                    x[x.abs() <= rule.threshold * x.pow(2).mean().sqrt()] = 0
            out[k] = x
        sparse.append(out)
    zero = {k: torch.zeros_like(v) for k, v in sparse[0].items()}
    expected, lambdas = ref_ram(zero, sparse, variant=variant, eps=0.0 if rule is not None else 1e-5)
    plain, report = ram_merge_adapters(
        model, names, method=variant, sparsify=rule, into_base=True, warn_dense=False, return_info=True
    )
    w0 = dict(base.named_parameters())
    for k in keys:
        got = plain.get_submodule(k).weight.detach().double() - w0[k + ".weight"].detach().double()
        assert_close(got.float(), expected[k], rtol=1e-5)
    if variant != "ram":
        assert [report.lambdas[n] for n in names] == pytest.approx(lambdas)
    # the adapter path gives the same ΔW* (full rank: no truncation)
    ram_merge_adapters(model, names, "adapter", method=variant, sparsify=rule, rank=32, warn_dense=False)
    for k, v in delta_of(model, "adapter").items():
        assert_close(v, expected[k], rtol=1e-5)
    # the untouched parameters keep their exact bits
    for name, p in plain.named_parameters():
        if name[: -len(".weight")] not in keys:
            assert torch.equal(p, w0[name]), name
    if rule is not None:
        for n in names:
            assert report.density[n] > 0.99
            assert report.active[n] == pytest.approx(0.3 if isinstance(rule, TopK) else 0.32, abs=0.08)


def test_into_base_device_dtype_and_inplace(base):
    bf16 = copy.deepcopy(base).to(torch.bfloat16)
    model = peft_model(bf16, {"code": lora(), "tool": lora(target_modules=["o_proj"])})
    before = {n: p.detach().clone() for n, p in bf16.named_parameters()}
    plain = ram_merge_adapters(model, ["code", "tool"], method="linear", into_base=True)
    assert type(plain) is LlamaForCausalLM and not any("lora" in n for n, _ in plain.named_parameters())
    assert all(p.dtype == torch.bfloat16 for p in plain.parameters())
    expected = merge_task_vectors(dense([lora_deltas(model, "code"), lora_deltas(model, "tool")]), method="linear")
    for k, d in expected.items():
        w = before[k + ".weight"]
        assert torch.equal(plain.get_submodule(k).weight, (w.float() + d).to(torch.bfloat16))
    assert "code" in model.peft_config and any("lora_A" in n for n, _ in model.named_parameters())  # untouched
    inplace = ram_merge_adapters(model, ["code", "tool"], method="linear", into_base=True, inplace=True)
    assert inplace is model.base_model.model
    for n, p in inplace.named_parameters():
        assert torch.equal(p, plain.get_parameter(n)), n


# ----------------------------------------------------------------------------------------------- adapter folders


def test_folders_merge_like_the_live_model(base, tmp_path):
    model = peft_model(
        base,
        {
            "code": lora(r=4),
            "tool": lora(r=8, use_rslora=True, target_modules=["q_proj", "o_proj"]),
            "memory": lora(rank_pattern={"v_proj": 2}, alpha_pattern={"q_proj": 5}),
        },
    )
    names = ["code", "tool", "memory"]
    model.save_pretrained(tmp_path / "ad", selected_adapters=names)
    folders = {"code": tmp_path / "ad" / "code", "tool": tmp_path / "ad" / "tool", "memory": tmp_path / "ad" / "memory"}
    path, report = ram_merge_adapter_files(folders, tmp_path / "merged", rank=8, return_info=True)
    ram_merge_adapters(model, names, "merged", rank=8)
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base), path).eval()
    assert torch.allclose(logits(reloaded), logits(model, "merged"), atol=1e-6)
    assert json.loads((path / "adapter_config.json").read_text())["use_rslora"] is False
    json.dumps(report.to_dict())
    # into the base: a module, a state dict, a Hugging Face folder (written as safetensors)
    live = ram_merge_adapters(model, names, into_base=True)
    base.save_pretrained(tmp_path / "base")
    as_module = ram_merge_adapter_files(folders, base=base, into_base=True)
    as_sd = ram_merge_adapter_files(folders, base=base.state_dict(), into_base=True)
    written = ram_merge_adapter_files(folders, tmp_path / "merged_model", base=tmp_path / "base", into_base=True)
    from_disk = LlamaForCausalLM.from_pretrained(written).eval()
    for n, p in live.named_parameters():
        assert torch.allclose(as_module.get_parameter(n), p, atol=1e-7), n
        assert torch.allclose(as_sd[n], p, atol=1e-7), n
        assert torch.allclose(from_disk.get_parameter(n), p, atol=1e-7), n
    assert (written / "config.json").is_file()


def test_folder_errors(base, tmp_path):
    model = peft_model(base, {"code": lora()})
    model.save_pretrained(tmp_path)
    (tmp_path / "code").rename(tmp_path / "a")
    with pytest.raises(ConfigError, match="out="):
        ram_merge_adapter_files([tmp_path / "a"])
    with pytest.raises(ConfigError, match="base="):
        ram_merge_adapter_files([tmp_path / "a"], into_base=True)
    other = LlamaForCausalLM(LlamaConfig(**{**LLAMA, "hidden_size": 64})).state_dict()
    with pytest.raises(InputMismatchError, match="q_proj"):
        ram_merge_adapter_files([tmp_path / "a"], into_base=True, base=other)
    with pytest.raises(RamLiveError, match="adapter_config.json"):
        ram_merge_adapter_files([tmp_path], tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match="not empty"):
        ram_merge_adapter_files([tmp_path / "a"], tmp_path / "full")


# ----------------------------------------------------------------------------------------------- unsupported


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("case", ["dora", "lora_bias", "conv", "modules_to_save", "pissa"])
def test_unsupported_adapters_raise_naming_the_module(base, case, tmp_path):
    if case == "conv":
        model = get_peft_model(Conv(), LoraConfig(r=2, target_modules=["conv", "lin"]), adapter_name="code")
        match = "conv"
    else:
        kw = {
            "dora": dict(use_dora=True),
            "lora_bias": dict(lora_bias=True),
            "modules_to_save": dict(modules_to_save=["lm_head"]),
            "pissa": dict(init_lora_weights="pissa"),
        }[case]
        model = peft_model(base, {"code": lora(), "tool": lora(**kw)})
        match = {"dora": "DoRA", "lora_bias": "lora_bias", "modules_to_save": "modules_to_save", "pissa": "pissa"}[case]
    names = list(model.peft_config)
    with pytest.raises(UnsupportedAdapterError, match=match) as err:
        ram_merge_adapters(model, names, "merged")
    assert isinstance(err.value, RamLiveError)
    assert "merged" not in model.peft_config  # nothing was written
    if case in ("dora", "lora_bias", "conv"):
        model.save_pretrained(tmp_path)
        folder = tmp_path / names[-1]
        with pytest.raises(UnsupportedAdapterError, match=match):
            ram_merge_adapter_files([folder], tmp_path / "out")


def test_layer_level_variant_is_refused_even_if_config_looks_plain(base):
    model = peft_model(base, {"code": lora(), "tool": lora(use_dora=True)})
    model.peft_config["tool"].use_dora = False  # a stale config must not hide DoRA layers
    with pytest.raises(UnsupportedAdapterError, match="model.layers.0.self_attn.q_proj"):
        ram_merge_adapters(model, ["code", "tool"], "merged")


def test_bad_arguments(base):
    model = peft_model(base, {"code": lora(), "tool": lora()})
    with pytest.raises(ConfigError, match="no adapter named 'nope'"):
        ram_merge_adapters(model, ["code", "nope"])
    ram_merge_adapters(model, ["code", "tool"], "merged")
    with pytest.raises(ConfigError, match="already has an adapter named 'merged'"):
        ram_merge_adapters(model, ["code", "tool"], "merged")
    with pytest.raises(ConfigError, match="unknown option"):
        ram_merge_adapters(model, ["code", "tool"], "x", densityy=0.3)
    with pytest.raises(ConfigError, match="sparsify"):
        ram_merge_adapters(model, ["code", "tool"], "x", sparsify="sometimes")
    with pytest.raises(ConfigError, match="rank"):
        ram_merge_adapters(model, ["code", "tool"], "x", rank=0)
    with pytest.raises(ConfigError, match="inplace"):
        ram_merge_adapters(model, ["code", "tool"], "x", inplace=True)
    with pytest.raises(UnsupportedAdapterError, match="LoRA"):
        ram_merge_adapters(base, ["code"])
    model.base_model.model.model.layers[0].self_attn.q_proj.merge(adapter_names=["code"])
    with pytest.raises(ConfigError, match="unmerge"):
        ram_merge_adapters(model, ["code", "tool"], into_base=True)


# ----------------------------------------------------------------------------------------------- activity rules


def test_dense_deltas_warn_with_the_measured_density(base):
    model = peft_model(base, {"code": lora(), "tool": lora()})
    with pytest.warns(DenseDeltaWarning, match=r"'code' 100\.0 %.*plain mean"):
        ram_merge_adapters(model, ["code", "tool"], "dense", method="ram_plus", sparsify=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DenseDeltaWarning)
        ram_merge_adapters(model, ["code", "tool"], "auto", method="ram_plus")  # recommended rule
        ram_merge_adapters(model, ["code", "tool"], "mean", method="linear")  # not RAM
    _, report = ram_merge_adapters(model, ["code", "tool"], "rel", sparsify=("relative", 2.0), return_info=True)
    assert report.sparsify.startswith("relative") and 0.01 < report.active["code"] < 0.1


def test_sparsify_rules_keep_what_they_say():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g)
    cut = TopK(0.25).cut(x)
    assert int((x.abs() >= cut).sum()) == 1024
    cut = RelativeThreshold(1.0).cut(x)
    rms = float(x.pow(2).mean().sqrt())
    assert torch.equal(x.abs() >= cut, x.abs() > rms)
    with pytest.raises(ConfigError):
        TopK(0.0)
    with pytest.raises(ConfigError):
        RelativeThreshold(-1)


# ----------------------------------------------------------------------------------------------- re-factorisation


def test_refactor_exact_randomized_energy():
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(96, 96, generator=g))
    v, _ = torch.linalg.qr(torch.randn(80, 80, generator=g))
    s = torch.logspace(0, -4, 80)
    m = (u[:, :80] * s) @ v.T
    exact = refactor(m, 10, svd="exact")
    tail = float(s[10:].double().pow(2).sum().sqrt() / s.double().pow(2).sum().sqrt())
    assert exact.rank == 10 and exact.error == pytest.approx(tail, rel=1e-3)
    assert exact.A.shape == (10, 80) and exact.B.shape == (96, 10)
    state = torch.random.get_rng_state()
    rand = refactor(m, 10, svd="randomized", niter=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    assert rand.svd == "randomized" and rand.error <= exact.error + 1e-3
    again = refactor(m, 10, svd="randomized", niter=4)
    assert torch.equal(again.A, rand.A)  # seeded: deterministic
    by_energy = refactor(m, energy=0.999)
    captured = torch.cumsum(s.double().pow(2), 0) / s.double().pow(2).sum()
    assert by_energy.rank == int((captured < 0.999).sum()) + 1
    assert refactor(torch.zeros(5, 7), 3).error == 0.0
    assert refactor(m, 10).svd == "exact"  # q = 10 + 16 > 80 / 4
    assert refactor(torch.randn(400, 300, generator=g), 8).svd == "randomized"


def test_report(base):
    model = peft_model(base, {"code": lora(), "tool": lora(r=8)})
    _, report = ram_merge_adapters(model, ["code", "tool"], "m", return_info=True, rank=4)
    d = report.to_dict()
    json.dumps(d)
    assert set(d["modules"]) == {f"model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")}
    assert all(m["rank"] == 4 and 0 < m["error"] < 1 for m in d["modules"].values())
    assert d["lambdas"] and d["rho"] and d["sparsify"].startswith("topk")
    assert "rel. error" in report.table() and report.error <= report.max_error


def test_importing_ram_live_peft_imports_no_peft():
    code = (
        "import sys, ram_live, ram_live.peft\n"
        "assert 'peft' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_merge_stays_on_the_device(base, tmp_path):
    model = peft_model(base, {"code": lora(), "tool": lora(r=8)}).to("cuda")
    _, report = ram_merge_adapters(model, ["code", "tool"], "merged", return_info=True)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.lora_A["merged"].weight.is_cuda
    plain = ram_merge_adapters(model, ["code", "tool"], into_base=True)
    assert all(p.is_cuda for p in plain.parameters())
    cpu = peft_model(base, {"code": lora(), "tool": lora(r=8)})
    cpu_plain = ram_merge_adapters(cpu, ["code", "tool"], into_base=True)
    for n, p in plain.named_parameters():
        assert torch.allclose(p.cpu(), cpu_plain.get_parameter(n), atol=1e-6), n
    m = torch.randn(512, 384, device="cuda")
    state = torch.cuda.get_rng_state()
    a = refactor(m, 8, svd="randomized")
    assert torch.equal(torch.cuda.get_rng_state(), state)
    assert torch.equal(refactor(m, 8, svd="randomized").A, a.A) and a.A.is_cuda


# ----------------------------------------------------------------------------------------------- PEFT's spellings


@pytest.mark.parametrize(
    "kind, extra",
    [("svd", {}), ("ties_svd", {"density": 0.3}), ("ties_svd", {"density": 0.5, "majority_sign_method": "frequency"})],
)
def test_peft_combination_types_that_mean_the_same_are_taken(base, kind, extra):
    """combination_type=/svd_rank=/majority_sign_method=/adapter_name= as PEFT's add_weighted_adapter takes them
    give PEFT's own merged ΔW."""
    model = peft_model(base, {"code": lora(r=4), "tool": lora(r=8, lora_alpha=4)})
    weights = [0.7, 1.3]
    model.add_weighted_adapter(["code", "tool"], weights, "peft", combination_type=kind, svd_rank=6, **extra)
    ram_merge_adapters(
        model,
        ["code", "tool"],
        weights=weights,
        combination_type=kind,
        svd_rank=6,
        adapter_name="ours",
        svd="exact",
        **extra,
    )
    theirs, ours = delta_of(model, "peft"), delta_of(model, "ours")
    assert sorted(theirs) == sorted(ours)
    for k in theirs:
        assert_close(ours[k], theirs[k], rtol=1e-4)
    assert model.peft_config["ours"].r == 6


def test_peft_spellings_that_differ_name_the_right_option(base, tmp_path):
    model = peft_model(base, {"code": lora(), "tool": lora()})
    cases = [
        ({"combination_type": "ties"}, "method='ties' is TIES on the ΔW"),
        ({"combination_type": "linear"}, "method='task_arithmetic'"),
        ({"combination_type": "cat"}, "rank= the sum of the adapters' ranks"),
        ({"combination_type": "magnitude_prune_svd"}, r"sparsify=TopK\(density\)"),
        ({"combination_type": "svd", "method": "ties"}, "pass one of them"),
        ({"density": 0.3}, r"sparsify=TopK\(0.3\)"),
        ({"svd_driver": "gesvd", "svd_clamp": 0.99}, r"svd_clamp, svd_driver: .*svd='exact'\|'randomized'"),
        ({"svd_rank": 4, "rank": 8}, "svd_rank=4 is PEFT's name of rank="),
        ({"combination_type": "bogus"}, "not one of PEFT's"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            ram_merge_adapters(model, ["code", "tool"], "x", **kwargs)
    assert "x" not in model.peft_config
    # the file version: same spellings, adapter_name= has no meaning there (out= names the folder)
    folders = {}
    for name in ("code", "tool"):
        model.save_pretrained(tmp_path / "saved", selected_adapters=[name])
        folders[name] = tmp_path / "saved" / (name if name != "default" else "")
    with pytest.raises(ConfigError, match="adapter_name= .* does not apply here"):
        ram_merge_adapter_files(folders, out=tmp_path / "out", adapter_name="x")
    with pytest.raises(ConfigError, match=r"sparsify=TopK\(0.2\)"):
        ram_merge_adapter_files(folders, out=tmp_path / "out", density=0.2)
    # density= is TIES'/DARE's own option, as in PEFT
    path = ram_merge_adapter_files(folders, out=tmp_path / "out", combination_type="ties_svd", density=0.2, svd_rank=4)
    with open(f"{path}/adapter_config.json") as f:
        assert json.load(f)["r"] == 4


def test_adapter_runs_check_their_options_and_never_replace_a_new_output(base, tmp_path, monkeypatch):
    model = peft_model(base, {"code": lora(), "tool": lora(r=8)})
    for bad in ({"chunk_numel": 0}, {"chunk_numel": -5}, {"device": "cpu:3"}):
        with pytest.raises(ConfigError):
            ram_merge_adapters(model, ["code", "tool"], "m", rank=4, **bad)
    model.save_pretrained(tmp_path / "ad", selected_adapters=["code", "tool"])
    folders = {n: tmp_path / "ad" / n for n in ("code", "tool")}
    out = tmp_path / "merged"
    import ram_live.peft.merge_files as mf

    real = mf.rename_noreplace

    def racing(src, dst):  # another process creates the output while the merge runs
        (dst).mkdir()
        (dst / "theirs.txt").write_text("mine")
        return real(src, dst)

    monkeypatch.setattr(mf, "rename_noreplace", racing)
    from ram_live.errors import OutputExistsError

    with pytest.raises(OutputExistsError):
        ram_merge_adapter_files(folders, out, rank=4)
    assert (out / "theirs.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ad", "merged"]  # no temp folder left


def test_density_counts_entries_at_eps_as_the_merge_does(base):
    """ΔW entries of exactly float32(eps) (above eps) count as active in the report's density, as the merge
    counts them (a comparison with the Python float eps would not)."""
    eps = 1e-3
    at = float(torch.tensor(eps))
    below = float(torch.nextafter(torch.tensor(at), torch.tensor(0.0)))
    cfg = lora(r=1, lora_alpha=1, target_modules=["q_proj"])
    model = peft_model(base, {"a": cfg, "b": cfg})
    with torch.no_grad():  # ΔW_a = B A (scaling 1): row 0 of A; ΔW_b = 0
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.zero_()
            if "lora_A.a" in name:
                p[0, :5] = torch.tensor([at, -at, 2e-3, below, 5e-4])
            if "lora_B.a" in name:
                p[0, 0] = 1.0
    deltas = [lora_deltas(model, "a"), lora_deltas(model, "b")]
    merged = merge_task_vectors(deltas, method="ram", eps=eps)
    # b changes nothing: τ* = τ_a where the merge counts a active, 0 elsewhere
    merge_active = sum(int(torch.count_nonzero(v)) for v in merged.values())
    numel = sum(v.numel() for v in deltas[0].values())
    assert merge_active == 3 * LLAMA["num_hidden_layers"]
    _, report = ram_merge_adapters(model, ["a", "b"], method="ram", sparsify=None, eps=eps, return_info=True)
    assert report.density["a"] == merge_active / numel
    assert report.density["b"] == 0.0
    assert sum(int((v.abs() > eps).sum()) for v in deltas[0].values()) != merge_active  # the boundary case
