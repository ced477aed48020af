"""The options of :func:`ram_live.evaluate.rewards`, declared once: ``ram-live search``'s ``--reward`` flags are
built from :data:`REWARD_OPTIONS` (``ram_live/cli/parser.py``), and ``tests/test_search_cli.py`` keeps it equal to
``rewards()``' signature (every keyword has its flag, with the signature's default).

Torch-free (the parser imports it, and ``ram-live --help`` imports no torch); it lives beside, not inside,
:mod:`ram_live.evaluate`, whose package imports torch.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["RewardOption", "REWARD_OPTIONS", "SHARED_FLAGS", "DTYPE_NAMES", "task_weight"]

#: ``--dtype`` / ``--eval-dtype`` spellings -> the torch dtype's name (what ``rewards(dtype=)`` takes).
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}

#: Options whose flag the command already has for another use too (declared by ``common_options``).
SHARED_FLAGS = frozenset({"device"})


@dataclass(frozen=True)
class RewardOption:
    """One keyword of ``rewards()`` and its command-line flag.

    Attributes:
        name: the keyword (``pass_threshold``).
        flag: its flag (``--pass-threshold``); another spelling where ``search`` already uses the name (``seed``
            is ``--eval-seed``: ``--seed`` seeds the search).
        default: ``rewards()``' default (shown in the help; a flag not given passes nothing, so this applies).
        help: the flag's help.
        argparse: ``add_argument`` keywords (``type``, ``action``, ``nargs``, ``choices``, ``metavar``).
        load: ``"callable"``: the value is ``MODULE:FUNCTION`` (a list of them with ``action="append"``), imported
            from the current folder by the command; None: passed as parsed (after ``convert``).
        convert: the parsed value -> the keyword's value (``--task none`` -> None)."""

    name: str
    flag: str
    default: Any
    help: str
    argparse: dict[str, Any] = field(default_factory=dict)
    load: str | None = None
    convert: Callable[[Any], Any] | None = None

    @property
    def dest(self) -> str:
        """The flag's attribute in the parsed namespace (``--eval-seed``: ``eval_seed``)."""
        return self.flag.removeprefix("--").replace("-", "_")


def task_weight(text: str) -> tuple[str, float]:
    """``--task-weights``' ``TASK=W`` as ``(task, w)``; ``W`` a finite number >= 0.

    Args:
        text: one ``TASK=W`` item.

    Returns:
        ``(task, weight)``.

    Raises:
        argparse.ArgumentTypeError: not ``TASK=W``, or ``W`` not a finite number >= 0."""
    task, sep, value = text.rpartition("=")
    if not sep or not task:
        raise argparse.ArgumentTypeError(f"{text!r} is not TASK=WEIGHT (e.g. gsm8k=2)")
    try:
        weight = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the weight {value!r} is not a number") from None
    if not math.isfinite(weight) or weight < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the weight must be a finite number >= 0")
    return task, weight


def _weights(pairs: list[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for task, weight in pairs:
        if task in out:
            raise argparse.ArgumentTypeError(f"--task-weights names task {task!r} twice")
        out[task] = weight
    return out


def _task(column: str) -> str | None:
    return None if column.lower() == "none" else column


_FN = "MODULE:FUNCTION"

#: ``rewards()``' keywords, in its signature's order, each with its ``ram-live search`` flag.
REWARD_OPTIONS: tuple[RewardOption, ...] = (
    RewardOption(
        "prompts",
        "--prompts",
        None,
        "held-out prompts for --reward: JSONL (one object a line with 'prompt' + reward columns) or parquet in "
        "verl's layout",
        {"metavar": "FILE"},
    ),
    RewardOption(
        "reward_funcs",
        "--reward",
        None,
        "instead of --eval: a TRL-style reward function (repeatable), scored on --prompts",
        {"action": "append", "metavar": _FN},
        load="callable",
    ),
    RewardOption(
        "tokenizer",
        "--tokenizer",
        None,
        "the tokenizer's folder (default: the --model folder's)",
        {"metavar": "FOLDER"},
    ),
    RewardOption("max_new_tokens", "--max-new-tokens", 64, "completion length", {"type": int, "metavar": "N"}),
    RewardOption("batch_size", "--batch-size", 16, "completions per generate call", {"type": int, "metavar": "N"}),
    RewardOption(
        "reward_weights",
        "--reward-weights",
        None,
        "one weight per --reward, in their order (TRL's reward_weights; default 1 each)",
        {"type": float, "nargs": "+", "metavar": "W"},
    ),
    RewardOption(
        "model",
        "--model",
        None,
        "the Hugging Face folder each candidate is loaded into and generated with (default: --base)",
        {"metavar": "FOLDER"},
    ),
    RewardOption(
        "do_sample",
        "--do-sample",
        None,
        "sample (--do-sample) or decode greedily (--no-do-sample); default: greedy with --samples 1, else sample",
        {"action": argparse.BooleanOptionalAction},
    ),
    RewardOption("temperature", "--temperature", 1.0, "sampling temperature", {"type": float, "metavar": "T"}),
    RewardOption("top_p", "--top-p", 1.0, "nucleus sampling's probability mass", {"type": float, "metavar": "P"}),
    RewardOption("top_k", "--top-k", 0, "sample from the K likeliest tokens (0: all)", {"type": int, "metavar": "K"}),
    RewardOption(
        "seed",
        "--eval-seed",
        0,
        "rewards(seed=): seeds the sampling, per prompt (--seed seeds the search)",
        {"type": int, "metavar": "N"},
    ),
    RewardOption(
        "task",
        "--task",
        "data_source",
        "the column that groups prompts into tasks (default: data_source when present; 'none': one group)",
        {"metavar": "COLUMN"},
        convert=_task,
    ),
    RewardOption(
        "objective",
        "--objective",
        None,
        "the mean over tasks (default) or the worst task",
        {"choices": ("mean", "min")},
    ),
    RewardOption(
        "weights",
        "--task-weights",
        None,
        "a weighted mean over tasks: every task's weight (0 leaves one out)",
        {"type": task_weight, "nargs": "+", "metavar": "TASK=W"},
        convert=_weights,
    ),
    RewardOption(
        "samples",
        "--samples",
        1,
        "completions per prompt (K > 1 samples)",
        {"type": int, "metavar": "K"},
    ),
    RewardOption(
        "metric",
        "--metric",
        None,
        "a prompt's score over its --samples: mean@k (default) or pass@K (K <= k)",
        {"metavar": "mean@k|pass@K"},
    ),
    RewardOption(
        "pass_threshold",
        "--pass-threshold",
        1.0,
        "pass@K: a completion passes when its reward is >= this",
        {"type": float, "metavar": "R"},
    ),
    RewardOption("device", "--device", None, "compute device (default: cpu)"),
    RewardOption(
        "dtype",
        "--eval-dtype",
        None,
        "the dtype the --model folder is loaded in for generation (default: its config's)",
        {"choices": tuple(sorted(DTYPE_NAMES))},
        convert=DTYPE_NAMES.__getitem__,
    ),
    RewardOption(
        "stop",
        "--stop",
        None,
        "a stop string (repeatable): completions are cut before it",
        {"action": "append", "metavar": "TEXT"},
    ),
    RewardOption(
        "include_stop",
        "--include-stop",
        False,
        "keep the stop string at the end of the completion",
        {"action": "store_true"},
    ),
    RewardOption(
        "eos_token_id",
        "--eos-token-id",
        None,
        "a token id that ends a completion (repeatable; default: the tokenizer's and model's EOS)",
        {"type": int, "action": "append", "metavar": "ID"},
    ),
    RewardOption(
        "generate",
        "--generate",
        None,
        "your engine (vLLM, SGLang, a server) in place of Hugging Face generate: fn(merged, prompts, settings, "
        "seeds) -> completions, or 'vllm': vLLM started from the --model folder (docs/evaluate.md)",
        {"metavar": _FN},
        load="callable",
    ),
)
