"""What each operator sends on per byte it takes in, as a run shows it.

An aggregation sends on a few per cent of the bytes it reads; a filter some share; a
map about all. The balancer's capacities after a node count in the node's input bytes
(``balancer.pressure.branch_capacity``), so it needs these ratios, and no document can
say them: they depend on the data. The driver adds, every tick, the bytes each operator
finished taking in and the bytes it sent on over the same interval; the estimate is
the ratio of the totals, given once a node has taken in enough to mean something, and
handed to the balancer's topology when it has moved enough to matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from balancer.units import MB

ENOUGH_BYTES = 1 * MB  # taken in before a node's ratio is given
MOVED = 0.05  # relative change of a ratio that is worth a new topology


@dataclass
class Reductions:
    operators: frozenset[str]
    taken: dict[str, float] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)
    given: dict[str, float] = field(default_factory=dict)  # what the balancer has now

    @classmethod
    def of(cls, operators: Iterable[str]) -> Reductions:
        return cls(frozenset(operators))

    def add(self, taken: Mapping[str, float], sent: Mapping[str, float]) -> bool:
        """Add one interval's bytes; True when the ratios to give have moved (see
        :meth:`to_give`)."""
        for node in self.operators:
            self.taken[node] = self.taken.get(node, 0.0) + max(0.0, taken.get(node, 0.0))
            self.sent[node] = self.sent.get(node, 0.0) + max(0.0, sent.get(node, 0.0))
        return self.to_give() != self.given

    def to_give(self) -> dict[str, float]:
        """The ratios the balancer should have: a node's current one once it has taken in
        ``ENOUGH_BYTES``, unless it is within ``MOVED`` of what it has already."""
        found = dict(self.given)
        for node in self.operators:
            taken = self.taken.get(node, 0.0)
            if taken < ENOUGH_BYTES:
                continue
            ratio = self.sent.get(node, 0.0) / taken
            old = self.given.get(node)
            if old is None or abs(ratio - old) > MOVED * max(old, 1e-6):
                found[node] = ratio
        return found

    def give(self) -> dict[str, float]:
        """Take the ratios to give as given, and return them."""
        self.given = self.to_give()
        return dict(self.given)

    def keep_only(self, operators: Iterable[str]) -> None:
        """After a hot rescale: the operators there are now (a new instance starts with
        nothing measured; a retired one is forgotten)."""
        self.operators = frozenset(operators)
        for table in (self.taken, self.sent, self.given):
            for node in set(table) - self.operators:
                del table[node]
