"""SvdOptions: one declaration of the re-factorisation's options, taken by refactor, ram_merge_adapters and
ram_merge_adapter_files as ``svd_options=``; the old keyword spellings give the same bits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from safetensors.torch import load_file  # noqa: E402

from ram_live.errors import ConfigError  # noqa: E402
from ram_live.peft import SvdOptions, ram_merge_adapter_files, ram_merge_adapters, refactor  # noqa: E402
from tests.test_peft import base, delta_of, lora, peft_model  # noqa: E402,F401 - base: the module's fixture

KEYWORDS = [
    {"rank": 6, "svd": "exact"},
    {"rank": 4, "svd": "randomized", "oversample": 3, "niter": 2, "seed": 11},
    {"energy": 0.9, "rank": 8},
    {"rank": 5, "svd": "auto", "seed": 3},
]
BAD = [
    ("rank", 0),
    ("rank", 2.0),
    ("rank", True),
    ("energy", 0.0),
    ("energy", 1.5),
    ("energy", "0.5"),
    ("svd", "lanczos"),
    ("oversample", -1),
    ("niter", -2),
    ("niter", 1.5),
    ("seed", "7"),
    ("seed", None),
]


def _matrix() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(96, 12, generator=g) @ torch.randn(12, 80, generator=g)


@pytest.mark.parametrize("kw", KEYWORDS)
def test_refactor_keywords_and_options_give_the_same_bits(kw):
    m = _matrix()
    a, b = refactor(m, **kw), refactor(m, svd_options=SvdOptions(**kw))
    assert torch.equal(a.A, b.A) and torch.equal(a.B, b.B) and (a.rank, a.svd, a.error) == (b.rank, b.svd, b.error)
    if "rank" in kw:  # the positional rank too
        rest = {k: v for k, v in kw.items() if k != "rank"}
        c = refactor(m, kw["rank"], **rest)
        assert torch.equal(c.A, a.A) and torch.equal(c.B, a.B)


@pytest.mark.parametrize("kw", KEYWORDS)
def test_adapter_merges_keywords_and_options_give_the_same_bits(base, tmp_path, kw):  # noqa: F811
    model = peft_model(base, {"code": lora(r=4), "tool": lora(r=8)})
    ram_merge_adapters(model, ["code", "tool"], "by_keywords", **kw)
    ram_merge_adapters(model, ["code", "tool"], "by_options", svd_options=SvdOptions(**kw))
    ours, theirs = delta_of(model, "by_keywords"), delta_of(model, "by_options")
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    model.save_pretrained(tmp_path / "ad", selected_adapters=["code", "tool"])
    folders = {n: tmp_path / "ad" / n for n in ("code", "tool")}
    p1 = ram_merge_adapter_files(folders, tmp_path / "kw", **kw)
    p2 = ram_merge_adapter_files(folders, tmp_path / "opts", svd_options=SvdOptions(**kw))
    t1, t2 = load_file(str(p1 / "adapter_model.safetensors")), load_file(str(p2 / "adapter_model.safetensors"))
    assert sorted(t1) == sorted(t2) and all(torch.equal(t1[k], t2[k]) for k in t1)
    assert (p1 / "adapter_config.json").read_text() == (p2 / "adapter_config.json").read_text()


@pytest.mark.parametrize("name, value", BAD)
def test_invalid_values_are_config_errors_naming_the_option(base, name, value):  # noqa: F811
    with pytest.raises(ConfigError, match=rf"^{name} must be") as direct:
        SvdOptions(**{name: value})
    model = peft_model(base, {"code": lora(r=4)})
    with pytest.raises(ConfigError) as live:
        ram_merge_adapters(model, ["code"], "x", **{name: value})
    with pytest.raises(ConfigError) as refactored:
        refactor(_matrix(), **({"rank": 3} if name != "rank" else {}), **{name: value})
    assert str(live.value) == str(refactored.value) == str(direct.value)
    assert "x" not in model.peft_config


def test_unknown_names_and_both_spellings_are_config_errors(base, tmp_path):  # noqa: F811
    with pytest.raises(
        ConfigError,
        match=r"refactor: unknown SVD option\(s\) 'rnak', 'sede'; the SVD options "
        r"are: rank, energy, svd, oversample, niter, seed",
    ):
        SvdOptions.of(None, where="refactor", rnak=3, sede=1)
    with pytest.raises(ConfigError, match="unknown SVD option"):
        refactor(_matrix(), rnak=3)
    with pytest.raises(ConfigError, match="svd_options must be an SvdOptions, got dict"):
        refactor(_matrix(), svd_options={"rank": 3})
    opts = SvdOptions(rank=4)
    model = peft_model(base, {"code": lora(r=4)})
    model.save_pretrained(tmp_path / "ad", selected_adapters=["code"])
    calls = {
        "refactor": lambda **kw: refactor(_matrix(), svd_options=opts, **kw),
        "ram_merge_adapters": lambda **kw: ram_merge_adapters(model, ["code"], "x", svd_options=opts, **kw),
        "ram_merge_adapter_files": lambda **kw: ram_merge_adapter_files(
            {"code": tmp_path / "ad" / "code"}, tmp_path / "out", svd_options=opts, **kw
        ),
    }
    for where, call in calls.items():
        for kw, names in (({"niter": 2}, "niter="), ({"rank": 4, "seed": 1}, "rank=, seed=")):
            with pytest.raises(ConfigError, match=rf"^{where}: svd_options= is given, and {names} too"):
                call(**kw)
    with pytest.raises(ConfigError, match="svd_options= is given, and rank= too"):  # PEFT's svd_rank= is rank=
        calls["ram_merge_adapters"](svd_rank=4)
    assert "x" not in model.peft_config and not (tmp_path / "out").exists()
    assert SvdOptions.of(opts) is opts and SvdOptions.of(None, rank=4) == opts and hash(opts) == hash(SvdOptions(4))
