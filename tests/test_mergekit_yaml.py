"""mergekit YAML configs: the mapping to ram_live's options (by hand), the errors, and the merged tensors against
``mergekit``'s own output on tiny bf16 Llama folders.

mergekit is never a dependency: the comparison runs mergekit 0.1.5 in its own virtual environment
(``benchmarks/mergekit_env.sh``, which ``scripts/test.sh`` builds; ``RAM_LIVE_MERGEKIT_PYTHON`` names another
interpreter; without either, mergekit installed in this environment) as a subprocess, and is skipped when there
is none.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("yaml")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

import ram_live  # noqa: E402
from ram_live.cli import main as cli_main  # noqa: E402
from ram_live.errors import ConfigError  # noqa: E402
from ram_live.mergekit_yaml import from_mergekit_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# One merge per config, as `mergekit-yaml CONFIG OUT` does it (scripts/run_yaml.py), in one process.
WORKER = textwrap.dedent("""
    import json, sys
    try:
        import yaml
        from mergekit.config import MergeConfiguration
        from mergekit.merge import run_merge
        from mergekit.options import MergeOptions
    except ImportError as exc:  # a half-built environment: the test skips
        print(exc, file=sys.stderr)
        sys.exit(77)
    for config_file, out in json.loads(sys.argv[1]):
        source = open(config_file, encoding="utf-8").read()
        options = MergeOptions(copy_tokenizer=False, lazy_unpickle=False, quiet=True)
        options.apply_global_options()
        run_merge(MergeConfiguration.model_validate(yaml.safe_load(source)), out, options=options,
                  config_source=source)
""")


def _mergekit_python() -> str | None:
    given = os.environ.get("RAM_LIVE_MERGEKIT_PYTHON")
    if given:
        return given
    venv = Path(os.environ.get("MERGEKIT_VENV", ROOT / "benchmarks" / ".venv-mergekit"))
    python = venv / "bin" / "python"
    if python.exists():
        return str(python)
    return sys.executable if importlib.util.find_spec("mergekit") is not None else None  # installed here


def _tiny_folders(root: Path, agents: int = 3, keep_ties: bool = False) -> tuple[str, list[str]]:
    """A tiny bf16 Llama base and agents that each change a random ~40 % of every tensor (overlapping).

    Unless ``keep_ties``, a change whose magnitude another change of the same tensor has too is left out: TIES
    keeps every entry tied with the k-th magnitude, mergekit an arbitrary k of them (docs/methods.md, "TIES' tie
    rule"; with bf16's 8 bits ties are common in small tensors, and one of them moves a 1024-entry tensor by
    1.6 %); :func:`test_ties_on_bf16_ties_differs_from_exactly_k_only_at_the_tied_entries` keeps them."""
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    base = root / "base"
    model.save_pretrained(base)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    paths = []
    for i in range(agents):
        gen = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                mask = torch.rand(p.shape, generator=gen) < 0.4
                value = (state[name] + mask * torch.randn(p.shape, generator=gen).to(p.dtype) * 0.02).flatten()
                size = (value.float() - state[name].float().flatten()).abs()
                _, inverse, counts = torch.unique(size, return_inverse=True, return_counts=True)
                tied = (counts[inverse] > 1) & (size > 0) & (not keep_ties)
                value[tied] = state[name].flatten()[tied]
                p.copy_(value.view_as(p))
        path = root / f"agent{i}"
        model.save_pretrained(path)
        paths.append(str(path))
    return str(base), paths


def _yaml(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def _tensors(folder: str) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


CONFIGS = {
    "linear": """
        merge_method: linear
        models:
          - model: {a0}
            parameters: {{weight: 1.0}}
          - model: {a1}
            parameters: {{weight: 0.5}}
          - model: {a2}
            parameters: {{weight: 0.25}}
        dtype: bfloat16
    """,
    "task_arithmetic": """
        merge_method: task_arithmetic
        base_model: {base}
        parameters: {{normalize: true, lambda: 0.8}}
        models:
          - model: {a0}
            parameters: {{weight: 1.0}}
          - model: {a1}
            parameters: {{weight: 0.3}}
          - model: {a2}
            parameters: {{weight: 0.6}}
        dtype: bfloat16
    """,
    "ties": """
        merge_method: ties
        base_model: {base}
        parameters: {{int8_mask: true}}
        models:
          - model: {base}
          - model: {a0}
            parameters: {{weight: 1.0, density: 0.5}}
          - model: {a1}
            parameters: {{weight: 0.5, density: 0.3}}
          - model: {a2}
            parameters: {{weight: 0.8, density: 0.7}}
        dtype: float32
        out_dtype: bfloat16
    """,
    "ties_unnormalized": """
        merge_method: ties
        base_model: {base}
        parameters: {{normalize: false, density: 0.4, weight: 0.5}}
        models:
          - model: {a0}
          - model: {a1}
          - model: {a2}
            parameters: {{weight: 0.9}}
        dtype: float32
        out_dtype: bfloat16
    """,
    "dare_ties": """
        merge_method: dare_ties
        base_model: {base}
        parameters: {{density: 1.0}}
        models:
          - model: {a0}
            parameters: {{weight: 0.7}}
          - model: {a1}
            parameters: {{weight: 0.4}}
        dtype: float32
        out_dtype: bfloat16
    """,
    "dare_linear": """
        merge_method: dare_linear
        base_model: {base}
        parameters: {{normalize: true}}
        models:
          - model: {a0}
            parameters: {{weight: 0.7, density: 1.0}}
          - model: {a1}
            parameters: {{weight: 0.4, density: 1.0}}
        dtype: bfloat16
    """,
    "ram": """
        merge_method: ram
        base_model: {base}
        models:
          - model: {a0}
          - model: {a1}
          - model: {a2}
        dtype: bfloat16
    """,
    "ramplus_tl": """
        merge_method: ramplus_tl
        base_model: {base}
        parameters: {{r: 0.3}}
        models:
          - model: {a0}
          - model: {a1}
          - model: {a2}
        dtype: bfloat16
        out_dtype: bfloat16  # mergekit 0.1.5 writes ramplus_tl in float32 otherwise (its λ is float32)
    """,
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mk")
    base, agents = _tiny_folders(root)
    return {"root": str(root), "base": base, **{f"a{i}": a for i, a in enumerate(agents)}}


def _config(folders: dict[str, str], name: str) -> str:
    return _yaml(Path(folders["root"]) / f"{name}.yml", CONFIGS[name].format(**folders))


# ----------------------------------------------------------------------------------------------- the mapping


def test_mapping_follows_mergekits_defaults_and_semantics(folders: dict[str, str]) -> None:
    plan = from_mergekit_yaml(_config(folders, "ties"))
    models, base, kwargs = plan
    assert base == folders["base"] and list(models.values()) == [folders["a0"], folders["a1"], folders["a2"]]
    assert kwargs == {
        "method": "ties",
        "dtype": torch.bfloat16,
        "weights": [1.0, 0.5, 0.8],
        "scale": 1.0,
        "densities": [0.5, 0.3, 0.7],
        "elect_on": "weighted",
        "majority_sign": "total",
        "divide_by": "weights",
    }
    # the base listed among the models, spelled differently, is still the base
    text = (
        Path(_config(folders, "ties"))
        .read_text()
        .replace(f"- model: {folders['base']}\n", f"- model: {folders['base']}/\n")
    )
    again = from_mergekit_yaml(_yaml(Path(folders["root"]) / "ties_slash.yml", text))
    assert list(again.models.values()) == list(plan.models.values()) and f"{folders['base']}/" in text
    # top-level weight/density are every model's default; normalize: false is no division at all
    _, _, kw = from_mergekit_yaml(_config(folders, "ties_unnormalized"))
    assert kw["weights"] == [0.5, 0.5, 0.9] and kw["density"] == 0.4 and kw["divide_by"] == "none"
    # task arithmetic: normalize divides the weights by their sum, lambda scales
    _, _, kw = from_mergekit_yaml(_config(folders, "task_arithmetic"))
    assert kw["weights"] == pytest.approx([1.0 / 1.9, 0.3 / 1.9, 0.6 / 1.9]) and kw["scale"] == 0.8
    # linear without base_model: the first model is the reference (a normalized average is base-independent)
    models, base, kw = from_mergekit_yaml(_config(folders, "linear"))
    assert base == folders["a0"] and kw["weights"] == [1.0, 0.5, 0.25] and kw["normalize"] is True
    _, _, kw = from_mergekit_yaml(_config(folders, "ramplus_tl"))
    assert kw == {
        "method": "ram_plus",
        "dtype": torch.bfloat16,
        "eps": 1e-5,
        "activity": "abs",
        "r": 0.3,
        "alpha": 0.2,
        "rho_scope": "tensor",
    }


def test_per_model_density_merges_as_hand_computed(folders: dict[str, str], tmp_path: Path) -> None:
    """TIES with per-model density and mergekit's normalize (÷ Σ of the agreeing weights), by hand in float64."""
    plan = from_mergekit_yaml(_config(folders, "ties"))
    merged = plan.merge(dtype=torch.float32)
    base = _tensors(folders["base"])
    key = "model.layers.0.mlp.up_proj.weight"
    deltas = torch.stack([_tensors(folders[a])[key].double() - base[key].double() for a in ("a0", "a1", "a2")])
    for row, d in zip(deltas, (0.5, 0.3, 0.7)):
        k = int(d * row.numel())
        cut = row.abs().flatten().kthvalue(row.numel() - k + 1).values
        row[row.abs() < cut] = 0
    w = torch.tensor([1.0, 0.5, 0.8], dtype=torch.float64).view(-1, 1, 1)
    sign = torch.where((deltas * w).sum(0) >= 0, 1.0, -1.0)
    agree = deltas.sign() == sign
    norm = (agree * w).sum(0)
    want = base[key].double() + torch.where(norm != 0, (deltas * w * agree).sum(0) / norm.clamp(min=1e-30), 0.0)
    torch.testing.assert_close(merged[key].double(), want, rtol=0, atol=1e-6)


def _ties_by_hand(deltas: torch.Tensor, weights: list[float], exactly_k: bool) -> torch.Tensor:
    """mergekit's TIES (÷ Σ of the agreeing weights) in float64 on trimmed ``deltas`` [K, ...]: trimmed to every
    entry tied with the k-th magnitude (ram_live), or to exactly k (mergekit's count; lowest index first among
    the tied, one of the choices mergekit may make)."""
    deltas = deltas.clone()
    for row, d in zip(deltas, DENSITIES):
        k = int(d * row.numel())
        flat = row.view(-1)
        if exactly_k:
            keep = torch.zeros(flat.numel(), dtype=torch.bool)
            keep[torch.sort(flat.abs(), descending=True, stable=True).indices[:k]] = True
            flat[~keep] = 0
        else:
            flat[flat.abs() < flat.abs().kthvalue(flat.numel() - k + 1).values] = 0
    w = torch.tensor(weights, dtype=torch.float64).view(-1, *[1] * (deltas.dim() - 1))
    sign = torch.where((deltas * w).sum(0) >= 0, 1.0, -1.0)
    agree = deltas.sign() == sign
    norm = (agree * w).sum(0)
    return torch.where(norm != 0, (deltas * w * agree).sum(0) / norm.clamp(min=1e-30), 0.0)


DENSITIES = (0.5, 0.3, 0.7)


def test_ties_on_bf16_ties_differs_from_exactly_k_only_at_the_tied_entries(tmp_path: Path) -> None:
    """On bf16 agents whose changes tie at TIES' k-th magnitude, the YAML's TIES merge keeps every tied entry:
    it is the by-hand merge with that rule everywhere, equals an exactly-k merge (mergekit's count) at every
    entry where no agent has a change tied at its threshold, and differs from it by the measured share."""
    base_dir, agent_dirs = _tiny_folders(tmp_path, keep_ties=True)
    folders = {"root": str(tmp_path), "base": base_dir, **{f"a{i}": a for i, a in enumerate(agent_dirs)}}
    merged = from_mergekit_yaml(_config(folders, "ties")).merge(dtype=torch.float32)
    base = _tensors(base_dir)
    agents = [_tensors(a) for a in agent_dirs]
    num = den = 0.0
    tied_tensors = 0
    for key, b in base.items():
        deltas = torch.stack([a[key].double() - b.double() for a in agents])
        ours, exact = _ties_by_hand(deltas, [1.0, 0.5, 0.8], False), _ties_by_hand(deltas, [1.0, 0.5, 0.8], True)
        got = merged[key].double() - b.double()
        torch.testing.assert_close(got, ours, rtol=0, atol=1e-6)
        tied = torch.zeros(b.shape, dtype=torch.bool)
        for row, d in zip(deltas, DENSITIES):
            k = int(d * row.numel())
            tied |= row.abs() == row.abs().flatten().kthvalue(row.numel() - k + 1).values
        torch.testing.assert_close(got[~tied], exact[~tied], rtol=0, atol=1e-6)  # away from the thresholds
        if bool((ours != exact).any()):
            tied_tensors += 1
            assert bool(((ours - exact).abs() > 1e-6)[~tied].sum() == 0), key  # the difference is at tied entries
        num += float((ours - exact).norm() ** 2)
        den += float(exact.norm() ** 2)
    share = (num / den) ** 0.5
    print(f"TIES on tied bf16 agents, keep-ties vs exactly-k: {share:.4%} of θ* − θ₀, {tied_tensors} tensors")
    assert tied_tensors > 0 and 0.003 < share < 0.012, (tied_tensors, share)  # measured: 0.63 %, 7 tensors


def test_unsupported_keys_are_one_error_naming_them(folders: dict[str, str], tmp_path: Path) -> None:
    path = _yaml(
        tmp_path / "bad.yml",
        f"""
        merge_method: ties
        base_model: {folders["base"]}
        chat_template: chatml
        parameters: {{gamma: 0.1}}
        models:
          - model: {folders["a0"]}
            parameters: {{weight: 1.0, epsilon: 0.2, lambda: 2}}
    """,
    )
    with pytest.raises(ConfigError) as err:
        from_mergekit_yaml(path)
    message = str(err.value)
    for part in (
        "chat_template (top level)",
        "parameters.gamma",
        "models[0].parameters.epsilon",
        "models[0].parameters.lambda",
    ):
        assert part in message
    with pytest.raises(ConfigError, match="interpolates lists over the layers"):
        from_mergekit_yaml(
            _yaml(
                tmp_path / "grad.yml",
                f"""
            merge_method: ties
            base_model: {folders["base"]}
            models:
              - model: {folders["a0"]}
                parameters: {{weight: 1.0, density: [0.2, 0.8]}}
        """,
            )
        )
    with pytest.raises(ConfigError, match="slerp"):
        from_mergekit_yaml(_yaml(tmp_path / "slerp.yml", "merge_method: slerp\nmodels: []\n"))
    with pytest.raises(ConfigError, match="needs a weight for every model"):
        from_mergekit_yaml(
            _yaml(
                tmp_path / "now.yml",
                f"""
            merge_method: task_arithmetic
            base_model: {folders["base"]}
            models:
              - model: {folders["a0"]}
        """,
            )
        )
    with pytest.raises(ConfigError, match="not a local folder"):
        from_mergekit_yaml(
            _yaml(
                tmp_path / "hub.yml",
                f"merge_method: ram\nbase_model: org/some-model\nmodels:\n  - model: {folders['a0']}\n",
            )
        )


def test_cli_merge_config(folders: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged"
    assert cli_main(["merge", "--config", _config(folders, "ram"), "--out", str(out), "-q"]) == 0
    want = from_mergekit_yaml(_config(folders, "ram")).merge()
    got = _tensors(str(out))
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert cli_main(["merge", "--config", _config(folders, "ram"), folders["a0"], "--out", str(tmp_path / "x")]) == 2
    assert "--config" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- against mergekit


def test_matches_mergekit_output(folders: dict[str, str], tmp_path: Path) -> None:
    python = _mergekit_python()
    if python is None:
        pytest.skip("no mergekit environment (bash benchmarks/mergekit_env.sh builds it)")
    jobs = [(_config(folders, name), str(tmp_path / f"mk_{name}")) for name in CONFIGS]
    run = subprocess.run(
        [python, "-c", WORKER, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""},
    )
    if run.returncode == 77:
        pytest.skip(f"mergekit cannot be imported in {python}: {run.stderr.strip()[-300:]}")
    if run.returncode != 0:
        pytest.fail(f"mergekit failed:\n{run.stderr[-4000:]}")
    base = _tensors(folders["base"])
    errors: dict[str, float] = {}
    deltas: dict[str, float] = {}
    for (config, mk_out), name in zip(jobs, CONFIGS):
        theirs = _tensors(mk_out)
        ours = from_mergekit_yaml(config).merge(out=str(tmp_path / f"ours_{name}"))
        mine = _tensors(ours)
        assert set(mine) == set(theirs), name
        for key, t in theirs.items():
            assert mine[key].dtype == t.dtype == torch.bfloat16, (name, key)
            err = float((mine[key].float() - t.float()).norm() / t.float().norm())
            # the merged change θ* − θ₀ alone, a stricter measure (bf16 inputs tie at TIES' k-th magnitude,
            # where mergekit keeps k entries and ram_live every tied one)
            ref = base[key].float() if name != "linear" else _tensors(folders["a0"])[key].float()
            want = t.float() - ref
            err_delta = float((mine[key].float() - ref - want).norm() / want.norm().clamp(min=1e-12))
            errors[name] = max(errors.get(name, 0.0), err)
            deltas[name] = max(deltas.get(name, 0.0), err_delta)
    print("relative error per method (max over tensors), of θ*:", errors, "of θ* − θ₀:", deltas)
    assert max(errors.values()) <= 1e-2, errors
    assert max(deltas.values()) <= 3e-2, deltas


# ----------------------------------------------------------------------------------------------- per-agent densities


def test_per_agent_densities_in_the_ties_and_dare_configs() -> None:
    """densities=[d]*n is density=d bit for bit; each agent is trimmed/dropped with its own density (DARE's mask
    of an agent depends on (seed, agent, tensor) only, so one agent merged alone gives the same drop)."""
    gen = torch.Generator().manual_seed(3)
    base = {"w": torch.randn(40, 30, generator=gen)}
    agents = {f"a{i}": {"w": base["w"] + 0.1 * torch.randn(40, 30, generator=gen)} for i in range(3)}
    for method in ("ties", "dare_linear", "dare_ties"):
        one = ram_live.merge(agents, base=base, method=method, density=0.4)
        each = ram_live.merge(agents, base=base, method=method, densities=[0.4, 0.4, 0.4])
        assert torch.equal(one["w"], each["w"]), method
    two = {"a0": agents["a0"], "a1": agents["a1"]}
    mixed = ram_live.merge(two, base=base, method="dare_linear", densities=[1.0, 0.5])
    alone = ram_live.merge({"a1": agents["a1"]}, base=base, method="dare_linear", density=0.5)
    torch.testing.assert_close(
        mixed["w"] - base["w"], (agents["a0"]["w"] - base["w"]) + (alone["w"] - base["w"]), rtol=0, atol=1e-6
    )
    # TIES with densities: agent t keeps int(d_t · n) entries before the election
    tau = agents["a2"]["w"] - base["w"]
    kept = ram_live.merge({"a2": agents["a2"]}, base=base, method="ties", densities=[0.25])["w"] - base["w"]
    assert int((kept != 0).sum()) == int(0.25 * tau.numel())
    with pytest.raises(ConfigError, match="densities has 2 entries for 3 agents"):
        ram_live.merge(agents, base=base, method="ties", densities=[0.4, 0.4])
    with pytest.raises(ConfigError, match=r"densities\[1\] must be > 0 for DARE"):
        ram_live.merge(agents, base=base, method="dare_ties", densities=[0.4, 0.0, 0.4])
    with pytest.raises(ConfigError, match="divide_by must be one of"):
        ram_live.merge(agents, base=base, method="ties", divide_by="sum")
