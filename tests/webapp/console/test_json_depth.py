"""The JSON depth check (webapp/console/topology_io.py ``check_json_depth``): it refuses
exactly the documents json.loads would nest deeper than ``MAX_DEPTH``, names where, and
takes time linear in the text whatever its strings hold."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webapp.console.topology_io import MAX_DEPTH, check_json_depth
from webapp.console.validation import TopologyError

# Strings full of what the scan must read right: quotes, backslashes, brackets.
TRICKY_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ab\n\u00e9'), max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY_TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=12,
)


def depth_of(value: Any) -> int:
    """How many lists and mappings deep json.loads nests to build ``value``."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


def located(text: str) -> tuple[int, int] | None:
    try:
        check_json_depth(text)
    except TopologyError as exc:
        [problem] = exc.problems
        assert problem.message == f"nested more than {MAX_DEPTH} levels deep"
        line, column = str(problem.location).removeprefix("line ").split(", column ")
        return int(line), int(column)
    return None


@settings(max_examples=300, deadline=None)
@given(
    VALUES,
    st.lists(st.sampled_from(["list", "dict"]), max_size=40),
    st.sampled_from([None, 0, 2]),
    st.booleans(),
)
def test_the_check_refuses_exactly_what_json_nests_too_deep(
    inner: Any, wrappers: list[str], indent: int | None, ascii_only: bool
) -> None:
    # Given a valid document, wrapped in up to 40 lists and mappings
    value = inner
    for kind in wrappers:
        value = [value] if kind == "list" else {'k[\\"': value}
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    # When its text is checked
    where = located(text)
    # Then it is refused exactly when json.loads would nest deeper than MAX_DEPTH
    assert (where is not None) == (depth_of(json.loads(text)) > MAX_DEPTH)
    if where is not None:
        # naming the bracket that opens level MAX_DEPTH + 1
        line, column = where
        lines = text.split("\n")
        assert lines[line - 1][column - 1] in "[{", (line, column)
        offset = sum(len(x) + 1 for x in lines[: line - 1]) + column - 1
        assert depth_of_prefix(text[: offset + 1]) == MAX_DEPTH + 1


def depth_of_prefix(text: str) -> int:
    """How many brackets are open at the end of a prefix of a valid document, read one
    character at a time (a second, plainer reading than the check's)."""
    opened: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            opened.append(char)
        elif char in "]}":
            opened.pop()
    return len(opened)


BODY = 512 * 1024

WORST_CASES = {
    "backslash-quote pairs": '\\"' * (BODY // 2),
    "one string of backslash-quote pairs": '"' + '\\"' * (BODY // 2 - 1) + '"',
    "an unterminated string": '"' + "a" * (BODY - 1),
    "deep brackets": "[" * BODY,
    "a mix": ('[{"a\\"[": "\\\\\\"' + "]" * 3) * (BODY // 18),
}


@pytest.mark.parametrize("text", WORST_CASES.values(), ids=WORST_CASES.keys())
def test_the_check_takes_linear_time_on_the_largest_documents(text: str) -> None:
    # Given a document as large as the cap allows, built to make a scan backtrack
    assert len(text) <= BODY
    # When it is checked
    started = time.monotonic()
    located(text)
    # Then the answer comes in a small fraction of a second
    assert time.monotonic() - started < 0.5
