"""Damaged PEFT adapter folders (ram_live.peft.folders, ram_live.peft.configs): a malformed ``adapter_config.json``
or a truncated / garbage ``adapter_model.safetensors`` is the library's own error naming the file and the key,
through every door that reads adapter folders (``ram_merge_adapter_files``, ``search`` over adapters,
``ram-live merge-adapters``), raised before anything is written. The folders are saved by the real ``peft`` from
a tiny Llama built offline, then damaged."""

from __future__ import annotations

import copy
import json
import shutil
import struct

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live import search  # noqa: E402
from ram_live.cli import main  # noqa: E402
from ram_live.errors import ConfigError, NonFiniteError, RamLiveError, UnsupportedInputError  # noqa: E402
from ram_live.peft import ram_merge_adapter_files  # noqa: E402
from ram_live.peft.folders import read_folder  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::FutureWarning", "ignore::ram_live.peft.DenseDeltaWarning"
)
LLAMA = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama and two LoRA adapters on it, saved by PEFT: "code" with a rank pattern (q_proj at rank 2),
    "tool" plain."""
    root = tmp_path_factory.mktemp("peft_folders")
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    code = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        rank_pattern={"q_proj": 2},
        alpha_pattern={"q_proj": 4},
        init_lora_weights=False,
    )
    model = get_peft_model(copy.deepcopy(base), code, adapter_name="code")
    model.add_adapter("tool", LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))
    model.save_pretrained(root, selected_adapters=["code", "tool"])
    return base, root


def _damaged(saved, tmp_path, damage) -> tuple[dict, object]:
    """Copies of the two folders, "code" damaged by ``damage(folder)``; (the folders by name, the damaged file)."""
    _, root = saved
    folders = {name: shutil.copytree(root / name, tmp_path / "in" / name) for name in ("code", "tool")}
    return folders, damage(folders["code"])


def _config(edit):
    """A damage that rewrites the config through ``edit(config) -> bytes``."""

    def damage(folder):
        path = folder / CONFIG
        path.write_bytes(edit(json.loads(path.read_text())))
        return path

    return damage


def _field(key, value):
    def edit(cfg):
        cfg[key] = value
        return json.dumps(cfg).encode()

    return _config(edit)


def _weights(edit):
    """A damage that rewrites the weights through ``edit(bytes) -> bytes``."""

    def damage(folder):
        path = folder / WEIGHTS
        path.write_bytes(edit(path.read_bytes()))
        return path

    return damage


def _retyped(dtype=None, fill=None):
    """A well-formed file whose tensors are of ``dtype`` or filled with ``fill``."""

    def damage(folder):
        path = folder / WEIGHTS
        tensors = load_file(path)
        for key, t in tensors.items():
            tensors[key] = t.to(dtype) if dtype is not None else torch.full_like(t, fill)
        path.unlink()
        save_file(tensors, path)
        return path

    return damage


def _garbage(_data: bytes) -> bytes:
    return bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(7)).tolist())


def _huge_header(data: bytes) -> bytes:
    return struct.pack("<Q", len(data) * 4) + data[8:]


#: (id, damage, error class, what the message names besides the file)
CONFIG_CASES = [
    ("not_json", _config(lambda cfg: b'{"r": 4, "lora_alpha": '), UnsupportedInputError, "unreadable JSON"),
    ("a_list", _config(lambda cfg: json.dumps([cfg]).encode()), UnsupportedInputError, "array"),
    ("null", _config(lambda cfg: b"null"), UnsupportedInputError, "null"),
    (
        "not_utf8",
        _config(lambda cfg: json.dumps(cfg)[:-1].encode() + ', "note": "\xe9"}'.encode("latin-1")),
        UnsupportedInputError,
        "not UTF-8",
    ),
    ("r_string", _field("r", "4"), ConfigError, "'r'"),
    ("r_bool", _field("r", True), ConfigError, "'r'"),
    ("r_float", _field("r", 4.0), ConfigError, "'r'"),
    ("r_negative", _field("r", -4), ConfigError, "'r'"),
    ("r_zero", _field("r", 0), ConfigError, "'r'"),
    ("r_null", _field("r", None), ConfigError, "'r'"),
    ("alpha_string", _field("lora_alpha", "8"), ConfigError, "'lora_alpha'"),
    ("alpha_bool", _field("lora_alpha", False), ConfigError, "'lora_alpha'"),
    ("alpha_null", _field("lora_alpha", None), ConfigError, "'lora_alpha'"),
    ("alpha_negative", _field("lora_alpha", -8), ConfigError, "'lora_alpha'"),
    ("alpha_zero", _field("lora_alpha", 0), ConfigError, "'lora_alpha'"),
    ("alpha_pattern_list", _field("alpha_pattern", ["q_proj", 4]), ConfigError, "'alpha_pattern'"),
    ("alpha_pattern_string", _field("alpha_pattern", "q_proj"), ConfigError, "'alpha_pattern'"),
    ("alpha_pattern_value", _field("alpha_pattern", {"q_proj": "4"}), ConfigError, "alpha_pattern['q_proj']"),
    ("alpha_pattern_regex", _field("alpha_pattern", {"q_proj[": 4}), ConfigError, "'alpha_pattern'"),
    ("rank_pattern_list", _field("rank_pattern", [2]), ConfigError, "'rank_pattern'"),
    ("rank_pattern_value", _field("rank_pattern", {"q_proj": 2.0}), ConfigError, "rank_pattern['q_proj']"),
    ("rank_pattern_zero", _field("rank_pattern", {"q_proj": 0}), ConfigError, "rank_pattern['q_proj']"),
    ("rank_pattern_regex", _field("rank_pattern", {"(q_proj": 2}), ConfigError, "'rank_pattern'"),
    ("rslora_string", _field("use_rslora", "false"), ConfigError, "'use_rslora'"),
    ("fan_in_fan_out_number", _field("fan_in_fan_out", 1), ConfigError, "'fan_in_fan_out'"),
    ("peft_type_list", _field("peft_type", ["LORA"]), ConfigError, "'peft_type'"),
]
WEIGHT_CASES = [
    ("truncated", _weights(lambda data: data[: len(data) // 2]), UnsupportedInputError, "truncated"),
    ("empty", _weights(lambda data: b""), UnsupportedInputError, "too short"),
    ("garbage", _weights(_garbage), UnsupportedInputError, "not a safetensors file"),
    ("header_past_the_end", _weights(_huge_header), UnsupportedInputError, "header length"),
    ("trailing_bytes", _weights(lambda data: data + b"\0" * 16), UnsupportedInputError, "trailing"),
    ("bad_header_json", _weights(lambda data: data[:8] + b"[" + data[9:]), UnsupportedInputError, "JSON"),
    ("integer_factors", _retyped(dtype=torch.int32), UnsupportedInputError, "int32"),
    ("nan_factors", _retyped(fill=float("nan")), NonFiniteError, "NaN"),
]
CASES = CONFIG_CASES + WEIGHT_CASES
IDS = [c[0] for c in CASES]


def _message(exc: BaseException, path, names: str) -> str:
    text = str(exc)
    assert isinstance(exc, RamLiveError) and "\n" not in text
    assert str(path) in text and "'code'" in text and names in text, text
    return text


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_ram_merge_adapter_files_refuses_before_writing(saved, tmp_path, case):
    _, damage, error, names = case
    folders, path = _damaged(saved, tmp_path, damage)
    before = path.read_bytes()
    for into_base in (False, True):
        out = tmp_path / ("model" if into_base else "adapter")
        extra = dict(base=saved[0].state_dict(), into_base=True) if into_base else {}
        with pytest.raises(error) as info:
            ram_merge_adapter_files(folders, out, **extra)
        _message(info.value, path, names)
        assert not out.exists()
    assert path.read_bytes() == before  # the input is never changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_search_over_adapters_refuses_before_scoring(saved, tmp_path, case):
    _, damage, error, names = case
    folders, path = _damaged(saved, tmp_path, damage)
    scored = []
    with pytest.raises(error) as info:
        search(folders, base=saved[0], evaluate=lambda merged: scored.append(1) or 0.0, budget=2)
    _message(info.value, path, names)
    assert scored == []


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_merge_adapters_command_prints_one_line(saved, tmp_path, capsys, case):
    _, damage, error, names = case
    folders, path = _damaged(saved, tmp_path, damage)
    out = tmp_path / "out"
    specs = [f"{name}={folder}" for name, folder in folders.items()]
    assert main(["merge-adapters", *specs, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("ram-live: error: ") and str(path) in captured.err and names in captured.err
    assert not out.exists()
    # --force over an existing output: the old output is put back untouched
    out.mkdir()
    (out / "keep.txt").write_text("old")
    assert main(["merge-adapters", *specs, "--out", str(out), "--force"]) == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "old"
    with pytest.raises(error):  # --debug shows the library's error itself
        main(["merge-adapters", *specs, "--out", str(tmp_path / "debug"), "--debug"])
    assert not (tmp_path / "debug").exists()


def test_the_undamaged_folders_are_read_as_peft_reads_them_and_merge(saved, tmp_path):
    """The damage is what the cases above refuse: the same folders, undamaged, are read with PEFT's ranks and
    scalings (rank and alpha patterns included), and merge into an adapter PEFT reloads."""
    base, _ = saved
    folders, _ = _damaged(saved, tmp_path, lambda folder: None)
    for name, folder in folders.items():
        live = PeftModel.from_pretrained(copy.deepcopy(base), folder, adapter_name=name)
        factors, _, _, _ = read_folder(folder, name)
        for module, factor in factors.items():
            layer = live.base_model.model.get_submodule(module)
            assert (factor.rank, factor.scaling) == (layer.r[name], layer.scaling[name])
            assert torch.equal(factor.A, layer.lora_A[name].weight) and torch.equal(factor.B, layer.lora_B[name].weight)
    assert {m: (f.rank, f.scaling) for m, f in read_folder(folders["code"], "code")[0].items()} == {
        "model.layers.0.self_attn.q_proj": (2, 2.0),
        "model.layers.0.self_attn.v_proj": (4, 2.0),
    }
    out = ram_merge_adapter_files(folders, tmp_path / "merged")
    assert sorted(p.name for p in out.iterdir()) == [CONFIG, WEIGHTS]
    PeftModel.from_pretrained(copy.deepcopy(base), out)


@pytest.mark.parametrize(
    "edit",
    [
        lambda cfg: cfg.update(lora_alpha=16, rank_pattern=None, alpha_pattern=None, use_rslora=None),
        lambda cfg: [cfg.pop(key) for key in ("r", "lora_alpha", "peft_type", "rank_pattern", "alpha_pattern")],
        lambda cfg: cfg.update(lora_alpha=8.5),  # PEFT declares an int and scales by a float alike
    ],
    ids=["nulls", "absent", "float_alpha"],
)
def test_absent_and_null_fields_take_peft_defaults(saved, tmp_path, edit):
    """Null patterns and flags, and absent fields, are read as PEFT reads them (the weights' rank, alpha 8)."""
    _, root = saved
    folder = shutil.copytree(root / "tool", tmp_path / "tool")
    cfg = json.loads((folder / CONFIG).read_text())
    edit(cfg)
    (folder / CONFIG).write_text(json.dumps(cfg))
    factors, _, _, _ = read_folder(folder, "tool")
    alpha = cfg.get("lora_alpha", 8)
    assert {m: f.scaling for m, f in factors.items()} == {"model.layers.0.self_attn.q_proj": alpha / 2}
