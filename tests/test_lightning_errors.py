"""RAMCallback's ``on_error`` and pre-flight with the real Lightning Trainer (CPU, issue 44): an evaluation failing at
the second merge is a ``MergeFailedWarning`` and ``ram/errors`` in the logger, training reaches ``max_steps`` and
the next merge succeeds; ``on_error="raise"`` ends training there; a search setting the search refuses raises at
step 0, before any snapshot."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest

L = pytest.importorskip("lightning")

from ram_live.errors import ConfigError, MergeFailedWarning  # noqa: E402
from ram_live.integrations.lightning import RAMCallback  # noqa: E402
from ram_live.store import SnapshotStore  # noqa: E402
from ram_live.training.search import SearchSetting  # noqa: E402
from test_lightning import Net, _data, _loader, _trainer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class FailsAt:
    """An evaluation that raises while the trainer is at step ``step``; else a constant score."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer, self.seen = step, None, []

    def __call__(self, module: L.LightningModule) -> dict[str, float]:
        at = self.trainer.global_step
        self.seen.append(at)
        if at == self.step:
            raise RuntimeError(f"the judge model is down at step {at}")
        return {"judge": 1.0}


def _logged(tmp_path: Path) -> list[dict[str, str]]:
    with open(tmp_path / "logs" / "version_0" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_an_evaluation_failing_at_the_second_merge_is_a_warning_and_training_goes_on(tmp_path: Path) -> None:
    evaluate = FailsAt(4)
    cb = RAMCallback(tmp_path / "store", "a", snapshot_every=2, merge_every=2, evaluate=evaluate, importance=None)
    trainer = _trainer([cb], 6, tmp_path)
    evaluate.trainer = trainer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), _loader(_data("a")))
    assert trainer.global_step == 6 and evaluate.seen == [2, 4, 6]
    failed = [w.message for w in caught if isinstance(w.message, MergeFailedWarning)]
    assert len(failed) == 1 and (failed[0].step, failed[0].agent, failed[0].what) == (4, "a", "merge")
    assert failed[0].error == "RuntimeError: the judge model is down at step 4"
    assert [h["step"] for h in cb.history] == [2.0, 6.0] and cb.schedule.errors == 1
    rows = _logged(tmp_path)
    errors = {int(r["step"]): float(r["ram/errors"]) for r in rows if r.get("ram/errors")}
    judged = {int(r["step"]) for r in rows if r.get("ram/judge")}
    assert errors == {4: 1.0} and judged == {2, 6}
    assert SnapshotStore(tmp_path / "store").steps("a") == [2, 4, 6]


def test_on_error_raise_ends_training_at_the_failing_merge(tmp_path: Path) -> None:
    evaluate = FailsAt(4)
    cb = RAMCallback(
        tmp_path / "store", "a", snapshot_every=2, merge_every=2, evaluate=evaluate, importance=None, on_error="raise"
    )
    trainer = _trainer([cb], 6)
    evaluate.trainer = trainer
    with pytest.raises(RuntimeError, match="the judge model is down at step 4"):
        trainer.fit(Net(), _loader(_data("a")))
    assert trainer.global_step == 4


@pytest.mark.parametrize(
    ("search", "match"),
    [
        ({"space": ["bogus_family"]}, "unknown family 'bogus_family'"),
        ({"fidelity": "halving", "budget": "20x"}, "halving"),
    ],
)
def test_preflight_refuses_what_the_first_merge_would_at_step_0(tmp_path: Path, search: dict, match: str) -> None:
    setting = SearchSetting(metric="val_loss", mode="min", **search)  # the validation loop evaluates
    cb = RAMCallback(tmp_path / "store", "a", merge_every=2, search=setting, importance=None)  # accepted when built
    trainer = _trainer([cb], 4)
    with pytest.raises(ConfigError, match=match) as info:
        trainer.fit(Net(), _loader(_data("a")), val_dataloaders=_loader(_data("v", 16, 1)))
    assert "RAMCallback('a'): pre-flight" in str(info.value) and trainer.global_step == 0
    assert SnapshotStore(tmp_path / "store").steps("a") == []


def test_preflight_refuses_a_merged_dir_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("not a folder")
    cb = RAMCallback(tmp_path / "store", "a", merge_every=2, merged_dir=tmp_path / "a_file" / "m", importance=None)
    trainer = _trainer([cb], 4)
    with pytest.raises(ConfigError, match="pre-flight.*cannot be saved"):
        trainer.fit(Net(), _loader(_data("a")))
    assert trainer.global_step == 0
