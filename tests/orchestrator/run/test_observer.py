"""What the live run observes of its source (orchestrator/run/observer.py): the backlog is
what has not entered the ledger, the source's read-ahead counted once, so the arrival
rate is what arrived, however the read-ahead fills and drains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from balancer.sizing import ArrivalMeter
from balancer.topology import LinkSpec, NodeSpec, Topology
from balancer.units import MB
from orchestrator.run import observer
from orchestrator.source.base import SourceLag

TOPOLOGY = Topology.build(
    [NodeSpec("source", "source"), NodeSpec("agg", "operator"), NodeSpec("out", "sink")],
    [LinkSpec("source", "agg"), LinkSpec("agg", "out")],
)


@dataclass
class Input:
    unbounded: bool = True


@dataclass
class SourceFigures:
    """A source's figures as its pacer gives them: what it read ahead (per route), what it
    sent on since last asked, and its lag (everything not in the ledger yet)."""

    ahead: float = 0.0
    sent: float = 0.0
    outside: float = 0.0
    input: Input = field(default_factory=Input)

    def take_blocked(self) -> dict[str, int]:
        return {}

    def head_by_route(self) -> dict[str, float]:
        return {"agg": self.ahead} if self.ahead else {}

    def take_sent_by_route(self) -> dict[str, int]:
        sent, self.sent = self.sent, 0.0
        return {"agg": int(sent)} if sent else {}

    def lag(self) -> SourceLag:
        return SourceLag(entries=1, bytes=int(self.outside + self.ahead))


def measure(source: SourceFigures, arrivals: ArrivalMeter, time_s: float) -> Any:
    return observer.measure(
        TOPOLOGY,
        {},
        source,  # type: ignore[arg-type]
        time_s=time_s,
        interval_s=1.0,
        capacities={},
        resources={},
        key_loads={},
        arrivals=arrivals,
    ).source


def test_the_read_ahead_is_backlog_once_and_draining_it_is_not_an_arrival() -> None:
    arrivals = ArrivalMeter(window_s=10.0)
    source = SourceFigures(ahead=32 * MB)
    assert measure(source, arrivals, 0.0).backlog_bytes == 32 * MB
    # Over ten seconds 2 MB/s arrive and are read at once, while the source sends 5 MB/s
    # from its read-ahead: the read-ahead drains by 3 MB/s.
    for second in range(1, 11):
        source.ahead -= 3 * MB
        source.sent = 5 * MB
        load = measure(source, arrivals, float(second))
    assert load.backlog_bytes == 2 * MB
    assert abs(load.arrival_bps - 2 * MB) < 0.01 * MB
