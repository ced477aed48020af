"""Held-out prompts as TRL's GRPOTrainer takes them: a ``prompt`` column, the other columns passed to the reward
functions as keyword lists.

Accepted: a list of strings; a list of dicts (or a ``datasets.Dataset``) with a ``prompt`` column; a JSONL file
(one JSON object a line, each with ``prompt``). A prompt is a string, or a conversation (a list of
``{"role": ..., "content": ...}`` messages, rendered through the tokenizer's chat template).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ConfigError

__all__ = ["Prompts", "load_prompts"]

#: Keyword arguments the reward functions get from the evaluation itself (a column of these names is refused).
RESERVED = frozenset({"prompts", "completions", "completion_ids"})


@dataclass(frozen=True)
class Prompts:
    """Loaded prompts: ``prompts[i]`` (a string or a list of messages) and ``columns[name][i]``."""

    prompts: list[Any]
    columns: dict[str, list[Any]]
    source: str

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def conversational(self) -> bool:
        """True when the prompts are conversations (lists of role/content messages), as TRL decides it."""
        return bool(self.prompts) and _is_conversation(self.prompts[0])


def load_prompts(prompts: Any) -> Prompts:
    """The prompts and their other columns, checked.

    Args:
        prompts: a list of strings, a list of dicts with ``prompt``, a ``datasets.Dataset``, a ``Prompts``, or
            the path of a JSONL file.

    Raises:
        ConfigError: an empty or malformed input (naming the file and line, or the row).

    >>> load_prompts([{"prompt": "2+2=", "answer": "4"}]).columns
    {'answer': ['4']}
    """
    if isinstance(prompts, Prompts):
        return prompts
    if isinstance(prompts, (str, os.PathLike)):
        return _from_rows(_read_jsonl(Path(prompts)), str(prompts))
    if hasattr(prompts, "column_names") and hasattr(prompts, "to_list"):  # a datasets.Dataset
        if "prompt" not in prompts.column_names:
            raise ConfigError(f"the prompts dataset has no 'prompt' column (its columns: {prompts.column_names})")
        return _from_rows(prompts.to_list(), "the prompts dataset")
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)):
        rows = list(prompts)
        if rows and all(isinstance(p, str) for p in rows):
            return _from_rows([{"prompt": p} for p in rows], "the prompts list")
        return _from_rows(rows, "the prompts list")
    raise ConfigError(f"prompts must be a list of strings, a list of dicts with 'prompt', a datasets.Dataset or a "
                      f"JSONL path; got {type(prompts).__name__}")


def _read_jsonl(path: Path) -> list[Any]:
    if not path.is_file():
        raise ConfigError(f"prompts file {path} does not exist (or is not a file)")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"prompts file {path}, line {number}: not JSON ({exc.msg}); one JSON object a "
                                  "line with a 'prompt' key is expected") from None
    if not rows:
        raise ConfigError(f"prompts file {path} is empty: one JSON object a line with a 'prompt' key is expected")
    return rows


def _from_rows(rows: list[Any], source: str) -> Prompts:
    if not rows:
        raise ConfigError(f"{source} is empty: at least one prompt is needed")
    where = (lambda i: f"{source}, line {i + 1}") if source not in ("the prompts list", "the prompts dataset") \
        else (lambda i: f"{source}, row {i}")
    keys: list[str] | None = None
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where(i)}: a prompt row must be a string or an object with 'prompt', "
                              f"got {type(row).__name__}")
        if "prompt" not in row:
            raise ConfigError(f"{where(i)}: no 'prompt' key (its keys: {sorted(row)})")
        prompt = row["prompt"]
        if not (isinstance(prompt, str) or _is_conversation(prompt)):
            raise ConfigError(f"{where(i)}: 'prompt' must be a string or a list of {{'role', 'content'}} messages, "
                              f"got {prompt!r:.80}")
        if keys is None:
            keys = sorted(row)
        elif sorted(row) != keys:
            raise ConfigError(f"{where(i)}: its keys {sorted(row)} differ from the first row's {keys} (every row "
                              "needs the same columns: they are passed to the reward functions as lists)")
    kinds = {isinstance(r["prompt"], str) for r in rows}
    if len(kinds) > 1:
        raise ConfigError(f"{source} mixes plain-text and conversational prompts; use one kind")
    taken = sorted(set(keys or []) & RESERVED)
    if taken:
        raise ConfigError(f"{source}: the column(s) {taken} would replace what the reward functions are given under "
                          f"that name (prompts, completions, completion_ids); rename them")
    columns = {k: [r[k] for r in rows] for k in (keys or []) if k != "prompt"}
    return Prompts([r["prompt"] for r in rows], columns, source)


def _is_conversation(prompt: Any) -> bool:
    return (isinstance(prompt, list) and bool(prompt)
            and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt))
