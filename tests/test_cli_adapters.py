"""``ram-live merge-adapters`` on tiny PEFT adapter folders, and the hint when adapter folders reach ``merge``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ram_live import TopK, ram_merge_adapter_files  # noqa: E402
from ram_live.cli import main  # noqa: E402

from tests.conftest import assert_bit_identical  # noqa: E402

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


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A tiny Llama saved as a HF folder and two LoRA adapter folders trained (randomly) on it."""
    tmp = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    base.save_pretrained(tmp / "base")
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(copy.deepcopy(base), cfg, adapter_name="code")
    model.add_adapter("tool", LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.mul_(0.3)
    model.save_pretrained(tmp / "ad", selected_adapters=["code", "tool"])
    return tmp, base, {"code": tmp / "ad" / "code", "tool": tmp / "ad" / "tool"}


def test_merge_adapters_writes_what_the_api_writes(adapters, tmp_path, capsys):
    tmp, base, folders = adapters
    argv = ["merge-adapters", *(f"{n}={p}" for n, p in folders.items()), "--rank", "4", "--sparsify", "topk:0.5"]
    assert main([*argv, "--out", str(tmp_path / "cli"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    path, report = ram_merge_adapter_files(folders, tmp_path / "api", rank=4, sparsify=TopK(0.5), return_info=True)
    assert_bit_identical(
        load_file(tmp_path / "cli" / "adapter_model.safetensors"), load_file(path / "adapter_model.safetensors")
    )
    assert json.loads((tmp_path / "cli" / "adapter_config.json").read_text()) == json.loads(
        (path / "adapter_config.json").read_text()
    )
    assert data["out"] == str(tmp_path / "cli") and data["adapters"] == ["code", "tool"]
    assert data["lambdas"] == report.lambdas and set(report.lambdas) == {"code", "tool"}
    PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "cli")  # loadable by PEFT
    # without --force an existing output is refused; with it, replaced
    assert main([*argv, "--out", str(tmp_path / "cli"), "-q"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "cli"), "-q", "--force", "--method", "linear"]) == 0
    linear = ram_merge_adapter_files(folders, tmp_path / "api_linear", method="linear", rank=4, sparsify=TopK(0.5))
    assert_bit_identical(
        load_file(tmp_path / "cli" / "adapter_model.safetensors"), load_file(linear / "adapter_model.safetensors")
    )


def test_merge_adapters_into_the_base(adapters, tmp_path, capsys):
    tmp, base, folders = adapters
    out = tmp_path / "model.safetensors"
    assert (
        main(
            [
                "merge-adapters",
                *map(str, folders.values()),
                "--into-base",
                "--base",
                str(tmp / "base"),
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    expected = ram_merge_adapter_files(list(folders.values()), base=base.state_dict(), into_base=True)
    written = load_file(out)
    assert set(written) <= set(expected)
    for k, v in written.items():
        assert torch.equal(v, expected[k]), k
    code = main(["merge-adapters", str(folders["code"]), "--base", str(tmp / "base"), "--out", str(tmp_path / "x")])
    assert code == 2
    assert "--into-base" in capsys.readouterr().err
    assert main(["merge-adapters", str(folders["code"]), "--sparsify", "top", "--out", str(tmp_path / "y")]) == 2
    assert "--sparsify" in capsys.readouterr().err


def test_merge_of_adapter_folders_points_to_merge_adapters(adapters, tmp_path, capsys):
    tmp, base, folders = adapters
    code = main(["merge", *map(str, folders.values()), "--base", str(tmp / "base"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "PEFT adapter folders" in err and "ram-live merge-adapters" in err
    assert str(folders["code"]) in err and not (tmp_path / "o").exists()
