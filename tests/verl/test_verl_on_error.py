"""verl's ``ram.on_error`` and pre-flight (issue 44), on checkpoints written here in verl's file layout (one rank,
plain tensors; no verl, no process group): an evaluation failing at the second merge is a ``MergeFailedWarning`` and
``ram/errors`` in the save's metrics, and the next merge succeeds; ``ram.on_error=raise`` raises; an unknown search
family or a ``merged_dir`` that cannot be written is refused when the callback is built, before training."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ram_live.errors import ConfigError, EvaluationError, MergeFailedWarning
from ram_live.integrations.verl import RAMVerl, options_from_mapping

BASE = {"w": torch.linspace(-1.0, 1.0, 24).reshape(4, 6), "b": torch.zeros(6)}
CALLS: list[int] = []


def flaky_score(merged_dir: str, step: int) -> dict[str, float]:
    """Fails at step 2; else the merged folder's step."""
    CALLS.append(step)
    if step == 2:
        raise RuntimeError("evaluation cluster unreachable")
    return {"acc": float(step)}


def _ram(tmp_path: Path, **keys: object) -> RAMVerl:
    folder = tmp_path / "base"
    folder.mkdir(parents=True, exist_ok=True)
    save_file(BASE, str(folder / "model.safetensors"))
    values = {
        "store": str(tmp_path / "store"),
        "agent": "coder",
        "base": str(folder),
        "weights": "fp32",
        "importance": None,
        "merged_dir": str(tmp_path / "merged"),
        "durable": False,
        "merge_every": 1,
        "evaluate": "test_verl_on_error:flaky_score",
        **keys,
    }
    return RAMVerl(options_from_mapping(values))


def _checkpoint(tmp_path: Path, step: int) -> Path:
    g = torch.Generator().manual_seed(step)
    weights = {k: v + torch.randn(v.shape, generator=g) for k, v in BASE.items()}
    actor = tmp_path / "ckpt" / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    torch.save(weights, actor / "model_world_size_1_rank_0.pt")
    return actor.parent


def test_an_evaluation_failing_at_one_save_is_a_warning_and_the_next_merge_succeeds(tmp_path: Path) -> None:
    CALLS.clear()
    ram = _ram(tmp_path)
    logged: list[tuple[int, dict[str, float]]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2, 3):
            ram.on_save(step, _checkpoint(tmp_path, step), last=step == 3, log_fn=lambda m, s: logged.append((s, m)))
    failed = [w.message for w in caught if isinstance(w.message, MergeFailedWarning)]
    assert len(failed) == 1 and (failed[0].step, failed[0].agent, failed[0].what) == (2, "coder", "merge")
    assert failed[0].error.startswith("EvaluationError:") and "evaluation cluster unreachable" in failed[0].error
    by_step = dict(logged)
    assert by_step[2]["ram/errors"] == 1.0 and "ram/acc" not in by_step[2]
    assert by_step[1]["ram/acc"] == 1.0 and by_step[3]["ram/acc"] == 3.0 and "ram/errors" not in by_step[3]
    assert CALLS == [1, 2, 3] and ram.errors == 1 and ram.last_merge_step == 3
    # the failed merge left its folder (the evaluation runs on the saved folder); the next merges' are there
    assert {"global_step_1", "global_step_3"} <= {p.name for p in (tmp_path / "merged" / "coder").iterdir()}


def test_on_error_raise_raises_at_the_failing_save(tmp_path: Path) -> None:
    ram = _ram(tmp_path, on_error="raise")
    ram.on_save(1, _checkpoint(tmp_path, 1))
    with pytest.raises(EvaluationError, match="evaluation cluster unreachable"):
        ram.on_save(2, _checkpoint(tmp_path, 2))


def test_on_error_is_checked_with_the_ram_group(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ram.on_error must be 'warn'"):
        _ram(tmp_path, on_error="ignore")


def test_preflight_refuses_an_unknown_search_family_before_training(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pre-flight.*unknown family 'bogus_family'"):
        _ram(tmp_path, search={"budget": 2, "space": ["bogus_family"]})
    with pytest.raises(ConfigError, match="pre-flight.*halving"):
        _ram(tmp_path, search={"budget": "20x", "fidelity": "halving"})


def test_preflight_refuses_a_merged_dir_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(ConfigError, match="pre-flight.*cannot be saved"):
        _ram(tmp_path, merged_dir=str(tmp_path / "a_file" / "merged"))
