"""The distinct values this process has seen committed to runs' results, so that a sink
batch sends PostgreSQL only the (key, value) pairs that may be new.

A sink batch's partials carry each key's whole set of distinct values in the batch
(about 200,000 pairs in a 160 MB batch of bench_peers.py's input), nearly all of them in
the result already after the first batches; sending them all cost a second of the
database's CPU per batch, taken from the Spark worker beside it on a small machine
(docs/benchmarks.md, "one partial per batch"), and a key that gets nothing new keeps
its stored set unwritten (ADR 0010).

Skipping a pair is safe only when it is in the result: a pair is remembered once the
transaction that inserted it has committed (``transaction.on_commit``), never before.
Another process's inserts are not known here and are simply sent again, which the
statement's union keeps once. Memory is bounded: at most ``MAX_PAIRS`` pairs over all
runs, the least recently merged runs forgotten first; a run with more than that
remembers what fits, and what it remembers still spares its probes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

# About 30 MB of sets and value strings shared between keys (a user in many keys' sets
# is one string here).
MAX_PAIRS = 1_000_000

Pair = tuple[str, str]


class KnownValues:
    def __init__(self, max_pairs: int = MAX_PAIRS) -> None:
        self.max_pairs = max_pairs
        self._runs: OrderedDict[int, _RunValues] = OrderedDict()
        self._pairs = 0
        self._lock = threading.Lock()

    def unknown(self, run_id: int, pairs: Iterable[Pair]) -> list[Pair]:
        """The pairs of ``pairs`` not known to be in the run's result."""
        with self._lock:
            known = self._runs.get(run_id)
            if known is None:
                return list(pairs)
            self._runs.move_to_end(run_id)
            return [(key, value) for key, value in pairs if value not in known.sets.get(key, ())]

    def remember(self, run_id: int, pairs: Iterable[Pair]) -> None:
        """``pairs`` are in the run's result (their transaction has committed)."""
        with self._lock:
            known = self._runs.setdefault(run_id, _RunValues())
            self._runs.move_to_end(run_id)
            for key, value in pairs:
                while self._pairs >= self.max_pairs and next(iter(self._runs)) != run_id:
                    _, oldest = self._runs.popitem(last=False)
                    self._pairs -= oldest.pairs
                if self._pairs >= self.max_pairs:
                    return  # this run alone fills the bound
                values = known.sets.setdefault(key, set())
                if value not in values:
                    values.add(known.values.setdefault(value, value))
                    known.pairs += 1
                    self._pairs += 1

    @property
    def pairs(self) -> int:
        return self._pairs


class _RunValues:
    def __init__(self) -> None:
        self.sets: dict[str, set[str]] = {}
        self.values: dict[str, str] = {}  # each value string once, shared by the keys
        self.pairs = 0


# The process's own: the control workers' threads share it.
KNOWN = KnownValues()
