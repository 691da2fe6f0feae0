"""Where a pipeline's Redis streams live: the console's Redis is also Celery's broker and
the live view's channel layer, so the streams runs read from it (and the producer writes
to it) are keys under one prefix, never a key the broker or the console uses.

A stream's name on the console's Redis is a plain name: letters, digits and ``._-``,
starting with a letter or a digit, with no ``:``; its key is ``bpconsole:stream:<name>``,
and the partitions of a partitioned stream are ``bpconsole:stream:<name>:<i>``. With no
``:`` in a name, no partition of one stream is another stream. On a server an
administrator listed (``BPCONSOLE_STREAM_URLS``), which is not the broker, a stream is
the key its name says, ``:`` allowed.

The prefix is applied when a key is needed, never stored: a run keeps the name it was
given, so a run stored before the prefix reads its stream under the prefix too.
"""

from __future__ import annotations

import re

STREAM_PREFIX = "bpconsole:stream:"
MAX_NAME_CHARS = 200
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
LISTED_NAME = re.compile(r"[A-Za-z0-9:._-]{1,200}")
MAX_PARTITIONS = 16  # each partition is read into a buffer of up to a segment


def stream_keys(name: str, partitions: int, *, own: bool) -> list[str]:
    """The Redis key of each partition of stream ``name``, in partition order; ``own``:
    on the console's Redis (under the prefix), else on a listed server (as named)."""
    base = STREAM_PREFIX + name if own else name
    if partitions == 1:
        return [base]
    return [f"{base}:{i}" for i in range(partitions)]


def name_problem(name: object, *, own: bool) -> str:
    """Why ``name`` is not a stream name (on the console's Redis when ``own``), or ""."""
    if own:
        if isinstance(name, str) and PLAIN_NAME.fullmatch(name):
            return ""
        return (
            f"a stream name is 1 to {MAX_NAME_CHARS} letters, digits and '._-', starting "
            "with a letter or a digit (no ':'; a partitioned stream's partitions are "
            "<name>:0 and on)"
        )
    if isinstance(name, str) and LISTED_NAME.fullmatch(name):
        return ""
    return f"a stream name is 1 to {MAX_NAME_CHARS} characters of letters, digits and ':._-'"
