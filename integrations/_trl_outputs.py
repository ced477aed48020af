"""What the transformers/TRL callback makes of a merge: the trainer's own evaluation of the generalist
(``evaluate="trainer"``) and the generalist's folder in ``merged_dir``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..training.schedule import MergeResult, RAMSchedule, metric_float
from ..training.search_record import save_next_to
from ._common import save_generalist
from ._peft_agent import LoraSchedule

__all__ = ["save_trl_generalist", "trainer_evaluation"]


def trainer_evaluation(trainer: Any) -> dict[str, float]:
    """``trainer.evaluate()`` of the swapped-in generalist, its metrics named ``eval_<name>``.

    Args:
        trainer: the bound ``transformers.Trainer`` (None: refused).

    Returns:
        Every numeric metric the trainer logged, as ``eval_<name>`` (TRL trainers add their own ``eval_*`` keys to
        the ``ram_eval_*`` ones).

    Raises:
        ConfigError: no trainer is bound.
    """
    if trainer is None:
        raise ConfigError("evaluate='trainer' needs the trainer: callback.bind(trainer)")
    out = {}
    for key, value in trainer.evaluate(metric_key_prefix="ram_eval").items():
        name = key.removeprefix("ram_eval_").removeprefix("eval_")
        if name != key and isinstance(value, (int, float)):
            out[f"eval_{name}"] = metric_float(value)
    return out


def save_trl_generalist(schedule: RAMSchedule, model: Any, result: MergeResult, folder: Path, processor: Any) -> str:
    """The generalist saved in ``folder`` (a PEFT folder for a LoRA schedule, else a model folder), the search's
    record (the chosen options) next to it.

    Args:
        schedule: the callback's schedule (a :class:`LoraSchedule` saves adapters).
        model: the trained module.
        result: the merge.
        folder: ``merged_dir/<agent>``.
        processor: the tokenizer or processor saved alongside (or None).

    Returns:
        The saved folder or file.
    """
    if isinstance(schedule, LoraSchedule):  # a PEFT folder (a model folder with into_base=True)
        saved = str(schedule.save(model, result, folder, processor))
    else:
        saved = str(save_generalist(schedule, model, result, folder, processor))
    if "search" in result.extra:
        save_next_to(saved, result.extra["search"], durable=schedule.durable)
    return saved
