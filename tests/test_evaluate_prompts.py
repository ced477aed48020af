"""Hostile prompt files and rows (``ram_live/evaluate/prompts.py``): every refusal is a ConfigError naming the file
and line (or the row), never a raw decode, recursion or encode error."""

from __future__ import annotations

import pytest

from ram_live.errors import ConfigError
from ram_live.evaluate import load_prompts


def write(tmp_path, data: bytes, name: str = "p.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_bytes_that_are_not_utf8_name_the_line(tmp_path):
    path = write(tmp_path, b'{"prompt": "a"}\n\n{"prompt": "caf\xe9"}\n')  # latin-1, line 3
    with pytest.raises(ConfigError, match=r"p.jsonl, line 3: not UTF-8 \(an undecodable byte at column 16\)"):
        load_prompts(path)
    utf16 = write(tmp_path, '{"prompt": "a"}\n'.encode("utf-16"), "u16.jsonl")
    with pytest.raises(ConfigError, match=r"u16.jsonl, line 1: not UTF-8"):
        load_prompts(utf16)
    late = write(tmp_path, b'{"prompt": "a"}\n' * 5000 + b'{"prompt": "\xff"}\n', "late.jsonl")  # past a read chunk
    with pytest.raises(ConfigError, match=r"late.jsonl, line 5001: not UTF-8"):
        load_prompts(late)


def test_a_byte_order_mark_is_accepted(tmp_path):
    plain = load_prompts(write(tmp_path, '{"prompt": "é", "answer": 1}\n{"prompt": "b", "answer": 2}\n'.encode()))
    bom = load_prompts(
        write(tmp_path, '\ufeff{"prompt": "é", "answer": 1}\r\n{"prompt": "b", "answer": 2}\r\n'.encode(), "bom.jsonl")
    )
    assert bom.prompts == plain.prompts == ["é", "b"] and bom.columns == plain.columns == {"answer": [1, 2]}


@pytest.mark.parametrize(
    "line, message",
    [
        ("[" * 100_000, "nested too deeply for the JSON parser"),
        ('{"prompt": "a", "n": ' + "1" * 5000 + "}", r"unreadable JSON \(Exceeds the limit"),
        ("[1, 2]", "a prompt row must be a JSON object with a 'prompt' key, got list"),
        ('"just text"', "a prompt row must be a JSON object with a 'prompt' key, got str"),
        ("null", "a prompt row must be a JSON object .* got NoneType None"),
        ("3", "a prompt row must be .* got int 3"),
        ('{"prompt": ""}', "the prompt is an empty string"),
        ('{"prompt": "a\\ud800b"}', r"the prompt holds '\\ud800' at character 1, an unpaired surrogate"),
        ('{"prompt": [{"role": "user", "content": "\\udfff"}]}', r"the prompt holds '\\udfff' .* unpaired surrogate"),
    ],
)
def test_a_bad_line_names_its_line_after_blank_lines(tmp_path, line, message):
    path = write(tmp_path, ('{"prompt": "a"}\n\n   \n' + line + "\n").encode())  # the bad row is on line 4
    with pytest.raises(ConfigError, match=rf"p.jsonl, line 4: {message}"):
        load_prompts(path)


def test_where_names_the_file_line_or_the_row(tmp_path):
    p = load_prompts(write(tmp_path, b'\n{"prompt": "a"}\n\n{"prompt": "b"}\n'))
    assert p.lines == [2, 4] and p.where(1) == f"{tmp_path / 'p.jsonl'}, line 4"
    assert load_prompts(["a", "b"]).where(1) == "the prompts list, row 1"


@pytest.mark.parametrize(
    "rows, message",
    [
        (["a", ""], "row 1: the prompt is an empty string"),
        ([{"prompt": "a"}, {"prompt": ""}], "row 1: the prompt is an empty string"),
        (["a\ud800"], r"row 0: the prompt holds '\\ud800'"),
        ([{"prompt": "a", 1: "x"}], "row 0: column names must be strings .* got 1"),
        ([{"prompt": "a", ("k",): "x"}], r"row 0: column names must be strings .* got \('k',\)"),
        (["a", {"prompt": "b", "answer": "x"}], r"row 1: its keys \['answer', 'prompt'\] differ"),
    ],
)
def test_bad_rows_in_memory(rows, message):
    with pytest.raises(ConfigError, match=rf"the prompts list, {message}"):
        load_prompts(rows)


def test_a_deeply_nested_prompt_in_memory_is_refused_without_recursing():
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(ConfigError, match=r"row 0: 'prompt' must be a string or a list of .* got \[\[\[.*\]\]\]"):
        load_prompts([{"prompt": nested}])


def test_strings_and_prompt_only_dicts_mix():
    p = load_prompts(["a", {"prompt": "b"}, "c"])
    assert p.prompts == ["a", "b", "c"] and p.columns == {} and p.lines is None


def chat(*messages):
    return {"prompt": [dict(m) for m in messages]}


USER = {"role": "user", "content": "2+2="}


@pytest.mark.parametrize(
    "bad, message",
    [
        (
            chat({"role": "system", "content": None}, USER),
            r"message 0 \(system\) has null content, which would be generated from as an empty turn",
        ),
        (chat(USER, {"role": "user", "content": None}), r"message 1 \(user\) has null content"),
        (chat({"role": None, "content": "hi"}), r"message 0 has the role None; a role is a non-empty string"),
        (chat({"role": "", "content": "hi"}), r"message 0 has the role ''"),
        (
            chat({"role": "user", "content": 4}),
            r"message 0 \(user\) has the content 4; a message's content is a string",
        ),
        (chat({"role": "user", "content": {"text": "a"}}), r"message 0 \(user\) has the content \{'text': 'a'\}"),
        (
            chat({"role": "system", "content": ""}, {"role": "user", "content": ""}),
            "every message's content is an empty string",
        ),
        (chat({"role": "user", "content": [None]}), r"message 0 \(user\) has the content part 0 None; a content part"),
        (chat({"role": "user", "content": [{"text": "a"}]}), r"message 0 \(user\) has the content part 0 \{'text'"),
        (
            chat({"role": "user", "content": [{"type": "text", "text": None}]}),
            r"message 0 \(user\) has the text part 0 with the text None; a text part's 'text' is a string",
        ),
        (chat({"role": "user", "content": []}), "every message's content is an empty string"),
        (
            chat({"role": "user", "content": [{"type": "text", "text": ""}]}),
            "every message's content is an empty string",
        ),
    ],
)
def test_a_chat_message_with_null_content_is_refused_naming_the_row(bad, message):
    with pytest.raises(ConfigError, match=rf"^the prompts list, row 1: {message}"):
        load_prompts([chat(USER), bad])


def test_a_chat_message_with_null_content_in_a_file_names_the_file(tmp_path):
    path = write(
        tmp_path, b'{"prompt": [{"role": "user", "content": "a"}]}\n{"prompt": [{"role": "user", "content": null}]}\n'
    )
    with pytest.raises(ConfigError, match=rf"^{path}, line 2: message 0 \(user\) has null content"):
        load_prompts(path)
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "val.parquet"
    rows = [chat(USER), chat({"role": "system", "content": "be brief"}, {"role": "user", "content": None})]
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    with pytest.raises(ConfigError, match=rf"^prompts file {parquet}, row 1: message 1 \(user\) has null content"):
        load_prompts(parquet)


def test_chat_messages_that_are_fine():
    """An empty system message beside a real turn, content given as a list of parts, and null content beside an
    assistant's tool calls load as they are."""
    parts = [{"type": "text", "text": "2+2="}]
    call = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]}
    given = [
        chat({"role": "system", "content": ""}, USER),
        chat({"role": "user", "content": parts}),
        chat(USER, call, {"role": "tool", "content": "4"}),
    ]
    loaded = load_prompts(given)
    assert loaded.prompts == [g["prompt"] for g in given] and loaded.conversational
    with pytest.raises(ConfigError, match=r"row 0: message 1 \(assistant\) has null content"):
        load_prompts([chat(USER, {**call, "tool_calls": []})])


def test_content_parts_with_text_are_taken():
    parts = [{"type": "text", "text": "2+2="}, {"type": "image", "text": None}]
    loaded = load_prompts([chat({"role": "user", "content": parts})])
    assert loaded.prompts == [[{"role": "user", "content": parts}]]
