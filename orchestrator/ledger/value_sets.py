"""A sink batch's distinct-value sets, sent to PostgreSQL one text per set and split
there (docs/adr/0010-a-keys-distinct-set-in-one-row.md).

A set kept as an array on its key's row is merged by one statement per batch, and it
travels best as one string per set: on bench_peers.py's shape (243 keys of 1,000 values)
the sets as ``SEPARATOR``-joined strings took 0.13 to 0.19 s to insert, against 0.42 to
0.60 s as a flat array of values with their rows' indexes, however the array was sent
(docs/benchmarks.md, "a key's distinct set as one row").

A value is any string a record carried: one that contains the separator, or is empty
(an empty string joined alone reads back as no value), travels apart as an *odd* value
with its set's index, and the statement adds it back. Nothing is escaped, so nothing has
to be unescaped per value on the server. A statement takes the sets as

    WITH odd AS (SELECT i, array_agg(v) AS vals
                 FROM unnest(<odd_sets>::int[], <odd_values>::text[]) AS x(i, v) GROUP BY i)
    ... string_to_array(<text>, chr(31)) || odd.vals ... LEFT JOIN odd ON odd.i = <index>

which is NULL for a set of no values, and unites it with a kept one, rewriting the kept
array only when the batch brought it values, as

    CASE WHEN new IS NULL THEN kept
    ELSE ARRAY(SELECT DISTINCT v FROM unnest(kept || new) AS v) END
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# ASCII's unit separator, chr(31) in the statements: records' values almost never hold it.
SEPARATOR = "\x1f"


@dataclass
class PackedSets:
    """Sets as statement parameters: ``texts[i]`` holds set i's values joined by the
    separator (None when it has none but odd ones); ``odd_sets`` and ``odd_values`` the
    odd values and the 1-based indexes of their sets."""

    texts: list[str | None] = field(default_factory=list)
    odd_sets: list[int] = field(default_factory=list)
    odd_values: list[str] = field(default_factory=list)


def pack(sets: Sequence[Sequence[str]]) -> PackedSets:
    """``sets``, each of distinct values, as parameters of one statement."""
    packed = PackedSets()
    for index, values in enumerate(sets, start=1):
        text = SEPARATOR.join(values)
        # Joining n values puts n - 1 separators between them: more means a value held
        # one. The count and the search for "" run in C, not per value in Python.
        if text.count(SEPARATOR) == len(values) - 1 and "" not in values:
            packed.texts.append(text or None)
            continue
        plain = [v for v in values if v and SEPARATOR not in v]
        packed.texts.append(SEPARATOR.join(plain) if plain else None)
        odd = [v for v in values if not v or SEPARATOR in v]
        packed.odd_sets.extend([index] * len(odd))
        packed.odd_values.extend(odd)
    return packed
