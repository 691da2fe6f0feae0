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

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

# About 30 MB of sets and value strings shared between keys (a user in many keys' sets
# is one string here).
MAX_PAIRS = 1_000_000


class KnownValues:
    """Sets are kept and compared a key at a time: per pair in Python, remembering and
    filtering bench_peers.py's 243,000 pairs took 70 to 100 ms of each sink batch."""

    def __init__(self, max_pairs: int = MAX_PAIRS) -> None:
        self.max_pairs = max_pairs
        self._runs: OrderedDict[int, _RunValues] = OrderedDict()
        self._pairs = 0
        self._lock = threading.Lock()

    def unknown(
        self, run_id: int, sets: Iterable[tuple[str, Sequence[str]]]
    ) -> dict[str, Sequence[str]]:
        """Of each key's values, those not known to be in the run's result; a key with
        none is left out."""
        with self._lock:
            known = self._runs.get(run_id)
            if known is None:
                return {key: values for key, values in sets if values}
            self._runs.move_to_end(run_id)
            fresh: dict[str, Sequence[str]] = {}
            for key, values in sets:
                stored = known.sets.get(key)
                new = values if stored is None else [v for v in values if v not in stored]
                if new:
                    fresh[key] = new
            return fresh

    def remember(self, run_id: int, sets: Mapping[str, Sequence[str]]) -> None:
        """``sets`` are in the run's result (their transaction has committed)."""
        with self._lock:
            known = self._runs.setdefault(run_id, _RunValues())
            self._runs.move_to_end(run_id)
            for key, values in sets.items():
                while (
                    self._pairs + len(values) > self.max_pairs and next(iter(self._runs)) != run_id
                ):
                    _, oldest = self._runs.popitem(last=False)
                    self._pairs -= oldest.pairs
                room = self.max_pairs - self._pairs
                if room <= 0:
                    return  # this run alone fills the bound
                stored = known.sets.setdefault(key, set())
                before = len(stored)
                # Interned: a value in many keys' sets is one string.
                stored.update(map(sys.intern, values if len(values) <= room else values[:room]))
                added = len(stored) - before
                known.pairs += added
                self._pairs += added

    @property
    def pairs(self) -> int:
        return self._pairs


class _RunValues:
    def __init__(self) -> None:
        self.sets: dict[str, set[str]] = {}
        self.pairs = 0


# The process's own: the control workers' threads share it.
KNOWN = KnownValues()
