"""Held-out prompts as TRL's GRPOTrainer takes them: a ``prompt`` column, the other columns passed to the reward
functions as keyword lists.

Accepted: a list of strings; a list of dicts (or a ``datasets.Dataset``) with a ``prompt`` column; a JSONL file
(UTF-8, a byte-order mark allowed; one JSON object a line, each with ``prompt``); a parquet file (``*.parquet``,
verl's ``data.val_files``: ``prompt`` a list of chat messages, ``data_source``, ``reward_model: {"ground_truth":
...}``, ``extra_info``), read with ``pyarrow``. A prompt is a non-empty string, or a conversation (a list of
``{"role": ..., "content": ...}`` messages, rendered through the tokenizer's chat template): each role a non-empty
string, each content a string (or a list of content parts, each an object with a ``type``, a text part's ``text`` a
string; null only in a message with ``tool_calls``), not every one empty.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import ConfigError
from .checks import one_line, short

__all__ = ["Prompts", "load_prompts"]

#: Keyword arguments the reward functions get from the evaluation itself, as TRL passes them (a column of these
#: names is refused).
RESERVED = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"})


@dataclass(frozen=True)
class Prompts:
    """Loaded, checked prompts, as :func:`load_prompts` returns them (``len()``: the number of prompts).

    Attributes:
        prompts: ``prompts[i]``, a non-empty string or a list of ``{"role", "content"}`` messages.
        columns: the other columns, ``columns[name][i]`` (passed to the reward functions as keyword lists).
        source: what they were read from, for messages (a file's path, ``"the prompts list"``, ...).
        lines: ``lines[i]``, the file line prompt ``i`` came from (None when not from a JSONL file).

    >>> load_prompts(["2+2=", "3+3="]).where(1)
    'the prompts list, row 1'
    """

    prompts: list[Any]
    columns: dict[str, list[Any]]
    source: str
    lines: list[int] | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def where(self, i: int) -> str:
        """Where prompt ``i`` came from, for messages.

        Args:
            i: the prompt's index.

        Returns:
            ``"<file>, line 5"`` (from a JSONL file) or ``"<source>, row 4"``.
        """
        return _where(self.source, self.lines)(i)

    @property
    def conversational(self) -> bool:
        """True when the prompts are conversations (lists of role/content messages), as TRL decides it."""
        return bool(self.prompts) and _is_conversation(self.prompts[0])


def load_prompts(prompts: Any) -> Prompts:
    """The prompts and their other columns, checked.

    Args:
        prompts: a list of strings, a list of dicts with ``prompt``, a ``datasets.Dataset``, a ``Prompts``, or
            the path of a JSONL file or of a parquet file (``*.parquet``, verl's layout).

    Returns:
        The :class:`Prompts` (``prompts`` itself when it is one already).

    Raises:
        ConfigError: an empty or malformed input (naming the file and line, or the row): a missing file, bad JSON
            or UTF-8, a row without ``prompt`` or with other keys than the first row's, an empty prompt (a chat
            message with null content or no role, every content empty), mixed
            plain-text and conversational prompts, or a column named as a reward function's own keyword.

    >>> load_prompts([{"prompt": "2+2=", "answer": "4"}]).columns
    {'answer': ['4']}
    """
    if isinstance(prompts, Prompts):
        return prompts
    if isinstance(prompts, (str, os.PathLike)):
        if Path(prompts).suffix.lower() == ".parquet":
            return _from_rows(_read_parquet(Path(prompts)), f"prompts file {prompts}")
        rows, lines = _read_jsonl(Path(prompts))
        return _from_rows(rows, str(prompts), lines)
    if hasattr(prompts, "column_names") and hasattr(prompts, "to_list"):  # a datasets.Dataset
        if "prompt" not in prompts.column_names:
            raise ConfigError(f"the prompts dataset has no 'prompt' column (its columns: {prompts.column_names})")
        return _from_rows(prompts.to_list(), "the prompts dataset")
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)):
        return _from_rows([{"prompt": p} if isinstance(p, str) else p for p in prompts], "the prompts list")
    raise ConfigError(
        f"prompts must be a list of strings, a list of dicts with 'prompt', a datasets.Dataset or a "
        f"JSONL or parquet path; got {type(prompts).__name__}"
    )


def _read_parquet(path: Path) -> list[Any]:
    """The rows of a parquet file, as plain Python values (structs as dicts, lists as lists)."""
    if not path.is_file():
        raise ConfigError(f"prompts file {path} does not exist (or is not a file)")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f"prompts file {path}: reading parquet needs pyarrow (it comes with datasets): pip install pyarrow"
        ) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow's ArrowInvalid / OSError on a file that is not parquet
        raise ConfigError(
            f"prompts file {path}: not a readable parquet file ({type(exc).__name__}: {one_line(exc, 160)})"
        ) from None
    if not rows:
        raise ConfigError(f"prompts file {path} is empty: at least one row with a 'prompt' column is expected")
    return rows


def _read_jsonl(path: Path) -> tuple[list[Any], list[int]]:
    """The file's rows and the line each came from (blank lines skipped)."""
    if not path.is_file():
        raise ConfigError(f"prompts file {path} does not exist (or is not a file)")
    rows, lines = [], []
    expected = "one JSON object a line with a 'prompt' key is expected"
    try:
        with open(path, encoding="utf-8-sig") as fh:  # a byte-order mark at the start is skipped
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"prompts file {path}, line {number}: not JSON ({exc.msg}); {expected}") from None
                except RecursionError:
                    raise ConfigError(
                        f"prompts file {path}, line {number}: nested too deeply for the JSON parser; {expected}"
                    ) from None
                except ValueError as exc:  # e.g. an integer beyond Python's digit limit
                    raise ConfigError(
                        f"prompts file {path}, line {number}: unreadable JSON ({one_line(exc, 120)}); {expected}"
                    ) from None
                lines.append(number)
    except UnicodeDecodeError:
        number, column = _bad_utf8(path)
        raise ConfigError(
            f"prompts file {path}, line {number}: not UTF-8 (an undecodable byte at column {column}); "
            "save the file as UTF-8"
        ) from None
    if not rows:
        raise ConfigError(f"prompts file {path} is empty: {expected}")
    return rows, lines


def _bad_utf8(path: Path) -> tuple[int, int]:
    """The line and column (1-based, in bytes) of the file's first byte that is not UTF-8."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):  # a UTF-8 sequence never holds the byte of "\n"
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return number, exc.start + 1
    return 0, 0


def _where(source: str, lines: list[int] | None) -> Callable[[int], str]:
    if lines is not None:
        return lambda i: f"{source}, line {lines[i]}"
    return lambda i: f"{source}, row {i}"


def _from_rows(rows: list[Any], source: str, lines: list[int] | None = None) -> Prompts:
    if not rows:
        raise ConfigError(f"{source} is empty: at least one prompt is needed")
    where = _where(source, lines)
    keys: list[str] | None = None
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            kind = "a JSON object with a 'prompt' key" if lines is not None else "a string or a dict with 'prompt'"
            raise ConfigError(f"{where(i)}: a prompt row must be {kind}, got {type(row).__name__} {short(row)}")
        odd = [k for k in row if not isinstance(k, str)]
        if odd:
            raise ConfigError(
                f"{where(i)}: column names must be strings (they become keyword arguments of the "
                f"reward functions), got {short(odd[0])}"
            )
        if "prompt" not in row:
            raise ConfigError(f"{where(i)}: no 'prompt' key (its keys: {short(sorted(row))})")
        prompt = row["prompt"]
        if not (isinstance(prompt, str) or _is_conversation(prompt)):
            raise ConfigError(
                f"{where(i)}: 'prompt' must be a string or a list of {{'role', 'content'}} messages, "
                f"got {short(prompt)}"
            )
        _check_text(prompt, where(i))
        if keys is None:
            keys = sorted(row)
        elif sorted(row) != keys:
            raise ConfigError(
                f"{where(i)}: its keys {short(sorted(row))} differ from the first row's {short(keys)} "
                "(every row needs the same columns: they are passed to the reward functions as lists)"
            )
    kinds = {isinstance(r["prompt"], str) for r in rows}
    if len(kinds) > 1:
        raise ConfigError(f"{source} mixes plain-text and conversational prompts; use one kind")
    taken = sorted(set(keys or []) & RESERVED)
    if taken:
        raise ConfigError(
            f"{source}: the column(s) {taken} would replace what the reward functions are given under "
            f"that name ({', '.join(sorted(RESERVED))}); rename them"
        )
    columns = {k: [r[k] for r in rows] for k in (keys or []) if k != "prompt"}
    return Prompts([r["prompt"] for r in rows], columns, source, lines)


def _check_text(prompt: Any, where: str) -> None:
    """Refuse an empty prompt string (zero tokens with a tokenizer that adds no BOS), a conversation with a message
    whose role is not a name or whose content is null or not text (or every content empty), and text the tokenizer
    cannot encode (an unpaired surrogate, as a JSON ``\\ud800`` escape gives)."""
    if isinstance(prompt, str) and not prompt:
        raise ConfigError(f"{where}: the prompt is an empty string; generation needs a prompt to continue")
    if not isinstance(prompt, str):
        _check_messages(prompt, where)
    texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt if isinstance(m["content"], str)]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"{where}: the prompt holds {text[exc.start]!r} at character {exc.start}, an unpaired "
                "surrogate that no tokenizer encodes (UTF-8 text is expected)"
            ) from None


def _check_messages(messages: list[Any], where: str) -> None:
    """A conversation's messages: each role a non-empty string, each content a string or a list of content parts
    (multimodal chat templates take those; null only beside ``tool_calls``), not all of them empty."""
    for m, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not role:
            raise ConfigError(
                f"{where}: message {m} has the role {short(role)}; a role is a non-empty string ('system', 'user', "
                "'assistant', ...)"
            )
        if content is None and not message.get("tool_calls"):  # an assistant's tool call has no text
            raise ConfigError(
                f"{where}: message {m} ({role}) has null content, which would be generated from as an empty turn; "
                "give it its text (or drop the message)"
            )
        if content is not None and not isinstance(content, (str, list)):
            raise ConfigError(
                f"{where}: message {m} ({role}) has the content {short(content)}; a message's content is a string "
                "(or a list of content parts)"
            )
        if isinstance(content, list):
            _check_parts(content, f"{where}: message {m} ({role})")
    if all(_empty(message["content"]) for message in messages):
        raise ConfigError(
            f"{where}: every message's content is an empty string (or empty text parts); generation needs a prompt "
            "to continue"
        )


def _check_parts(parts: list[Any], where: str) -> None:
    """A message's content parts, as multimodal chat templates read them: each an object with a string ``type``; a
    ``"text"`` part's ``text`` a string (a null one would be rendered as ``None`` or dropped)."""
    for p, part in enumerate(parts):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str) or not part["type"]:
            raise ConfigError(
                f"{where} has the content part {p} {short(part)}; a content part is an object with a 'type' "
                "('text', 'image', ...)"
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise ConfigError(
                f"{where} has the text part {p} with the text {short(part.get('text'))}; a text part's 'text' is a "
                "string"
            )


def _empty(content: Any) -> bool:
    """An empty string, or a list of content parts that are all empty text (no text, no other part)."""
    if isinstance(content, str):
        return not content
    return isinstance(content, list) and all(p.get("type") == "text" and not p.get("text") for p in content)


def _is_conversation(prompt: Any) -> bool:
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)
    )
