"""Observations in, actions out: the vocabulary between the balancer and its callers.

The live loop (orchestrator/) and the simulator (balancer/sim/) build the same
observations and apply the same actions, so a benchmark says something about
production. Every action carries a human-readable ``reason`` that becomes an Event.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict

from balancer.topology import Topology

# The resource of every node whose batches any Spark worker of a shared pool may run.
SHARED_POOL = "spark pool"


@dataclass(frozen=True)
class NodeObservation:
    """What was measured at one node over the last interval."""

    node: str
    level: float  # queued bytes / capacity, in [0, 1]
    buffered_bytes: float
    in_rate: float  # bytes per second into the node's pool
    out_rate: float  # bytes per second processed and sent on
    flagged: bool
    # The task state the node last wrote (stepwise-backpressure.md): speed as a
    # fraction of its maximum, the speed it had before backpressure, and whether it is
    # in backpressure. The balancer reads it back to know which slow-downs took effect;
    # no default, so a runtime that forgets to report it fails at once (a driver that
    # did never restored a slowed upstream).
    speed: float
    origin_speed: float
    in_backpressure: bool
    # Per downstream that the default routing names (the data's tag): bytes at the head
    # of the node's queue (what it sends next, at most one buffer capacity of it), and
    # bytes per second that entered the node over the interval. Proportional migration
    # plans from them: the ledger knows the tags of queued and arriving segments, so the
    # coming mix is measured, not guessed.
    head_by_route: Mapping[str, float]
    in_rate_by_route: Mapping[str, float]
    # The node's true processing rate, bytes per second of busy time as measured from its
    # batches (balancer/capacity.py); ``math.inf`` while unknown. A declared emulation
    # limit (``max_rate_mbps``), where set, stands in for it (balancer/pressure.py).
    capacity_bps: float
    # What the node's work runs on: the Spark worker it is placed on, one name for the
    # shared pool, or the node itself for a runtime where each node is its own resource.
    # Nodes with one resource share its capacity: moving data between them changes
    # nothing.
    resource: str
    # Of ``buffered_bytes``, those arrived and not taken by a batch yet: what may still
    # move to a sibling (balancer/queued.py).
    waiting_bytes: float = 0.0


class NodeState(TypedDict):
    """What a node shows after a tick, in the console and in ZooKeeper: its last
    observation (rates in bytes per second), the watermarks it is judged by, and the
    pacing the balancer set for it."""

    level: float
    buffered_bytes: int
    in_rate: float
    out_rate: float
    high_water: float
    low_water: float
    flagged: bool
    rate_coefficient: float
    speed: float
    origin_speed: float
    in_backpressure: bool
    # Seconds until the pool reaches its high water at the rate it fills (forecast.py);
    # 0 at or past it, None when not filling (and for a source).
    full_in_s: float | None
    # The measured capacity (bytes per second of busy time; None while unknown), the
    # resource the node runs on (NodeObservation), and the share of the last half
    # minute its batches kept that resource busy (None before its first batch).
    capacity_bps: float | None
    resource: str
    busy: float | None
    # Records per second of busy time over the same batches (None while unknown or
    # where its batches count no records: the source, the sink).
    capacity_rps: float | None


@dataclass(frozen=True)
class KeyLoad:
    """A keyed stage's key space as measured: each member's contiguous key slots
    ``(low, high)`` in declaration order, and the records each slot took (from the
    stage's state, so it counts records, not the bytes every member reads)."""

    groups: Mapping[str, tuple[int, int]]
    records: tuple[float, ...]  # per key slot

    def shares(self) -> dict[str, float]:
        """Each member's share of the records (even shares before any record)."""
        total = sum(self.records)
        if total <= 0:
            return {m: 1 / len(self.groups) for m in self.groups}
        return {m: sum(self.records[low:high]) / total for m, (low, high) in self.groups.items()}


@dataclass(frozen=True)
class SourceLoad:
    """What waits to enter a run and how fast more comes: the bytes not yet read into
    it (files or stream entries waiting outside, and the source's read-ahead), and the
    bytes per second arriving from outside (None where the runtime cannot tell, as for
    a bounded input, all there from the start)."""

    backlog_bytes: float
    arrival_bps: float | None


@dataclass(frozen=True)
class Observation:
    """One tick's view of a whole run. ``time_s`` is the only clock decisions use."""

    time_s: float
    interval_s: float
    topology: Topology
    nodes: Mapping[str, NodeObservation]
    # Nodes a hot scale-in is emptying: their traffic share may go to zero.
    draining: frozenset[str] = frozenset()
    # Per keyed stage of two instances or more whose load was measured this tick.
    key_loads: Mapping[str, KeyLoad] = field(default_factory=dict)
    # The source's backlog and arrival rate, where the runtime measures them
    # (balancer/sizing.py sizes stages from them).
    source: SourceLoad | None = None

    def level(self, node: str) -> float:
        return self.nodes[node].level


@dataclass(frozen=True)
class Action:
    """Base of every decision; ``kind`` names it in JSON and in the event timeline."""

    kind: ClassVar[str] = "action"
    reason: str

    @property
    def subject(self) -> str:
        """The node the action concerns, as the event timeline shows it."""
        return ""

    def to_json(self) -> dict[str, Any]:
        payload = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            payload[f.name] = _jsonable(value)
        return payload


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list | frozenset | set):
        items = sorted(value) if isinstance(value, frozenset | set) else value
        return [_jsonable(v) for v in items]
    return value


@dataclass(frozen=True)
class SetFlag(Action):
    kind: ClassVar[str] = "set_flag"
    node: str = ""

    @property
    def subject(self) -> str:
        return self.node


@dataclass(frozen=True)
class ClearFlag(Action):
    kind: ClassVar[str] = "clear_flag"
    node: str = ""

    @property
    def subject(self) -> str:
        return self.node


@dataclass(frozen=True)
class SetThresholds(Action):
    kind: ClassVar[str] = "set_thresholds"
    node: str = ""
    high_water: float = 0.0
    low_water: float = 0.0

    @property
    def subject(self) -> str:
        return self.node


@dataclass(frozen=True)
class SetRate(Action):
    """Upstream ``node`` now sends at ``coefficient`` times its maximum rate."""

    kind: ClassVar[str] = "set_rate"
    node: str = ""
    coefficient: float = 1.0

    @property
    def subject(self) -> str:
        return self.node


@dataclass(frozen=True)
class StepwiseSignal(Action):
    """A message for the ZooKeeper task-message queue (stepwise-backpressure.md)."""

    kind: ClassVar[str] = "stepwise_signal"
    signal: Literal["slow", "restore"] = "slow"
    target: str = ""
    origin: str = ""

    @property
    def subject(self) -> str:
        return self.target


@dataclass(frozen=True)
class SetSpeed(Action):
    """A task's speed after a stepwise signal was applied."""

    kind: ClassVar[str] = "set_speed"
    node: str = ""
    speed: float = 1.0
    origin_speed: float = 1.0
    in_backpressure: bool = False

    @property
    def subject(self) -> str:
        return self.node


@dataclass(frozen=True)
class SetShares(Action):
    """Traffic shares of ``upstream`` per downstream node; they sum to 1."""

    kind: ClassVar[str] = "set_shares"
    upstream: str = ""
    shares: Mapping[str, float] = field(default_factory=dict)
    # The interchangeable group (stage) the shares split; an upstream feeding several
    # stages has one set of shares per stage.
    stage: str = ""

    @property
    def subject(self) -> str:
        return self.upstream


@dataclass(frozen=True)
class SetCredits(Action):
    """Bytes ``upstream`` may send to each downstream until the next grant (credit-based)."""

    kind: ClassVar[str] = "set_credits"
    upstream: str = ""
    credits: Mapping[str, float] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.upstream


@dataclass(frozen=True)
class StartMigration(Action):
    """Send ``share`` of what ``branch_node`` routes into ``heavy`` through ``light``."""

    kind: ClassVar[str] = "start_migration"
    branch_node: str = ""
    heavy: tuple[str, ...] = ()
    light: tuple[str, ...] = ()
    share: float = 1.0
    backpressure_node: str = ""
    scores: Mapping[str, float] = field(default_factory=dict)
    # Split of the migrated data among several light branches, keyed by each light
    # branch's first node, fractions summing to 1; empty means all of it goes to light[0].
    targets: Mapping[str, float] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.branch_node


@dataclass(frozen=True)
class StopMigration(Action):
    kind: ClassVar[str] = "stop_migration"
    branch_node: str = ""
    heavy: tuple[str, ...] = ()
    backpressure_node: str = ""

    @property
    def subject(self) -> str:
        return self.branch_node


@dataclass(frozen=True)
class MoveQueued(Action):
    """Move up to ``moves[to]`` bytes of the data waiting in ``node``'s pool (arrived,
    not taken by a batch) into the pool of each sibling ``to`` of its stage."""

    kind: ClassVar[str] = "move_queued"
    stage: str = ""
    node: str = ""
    moves: Mapping[str, float] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.node


@dataclass(frozen=True)
class BoundBatches(Action):
    """Until the next one for ``stage``: each of ``members`` claims at most
    ``bounds[member]`` bytes in a batch (the segment that crosses it included), and a
    member not in ``bounds`` as much as its pool holds."""

    kind: ClassVar[str] = "bound_batches"
    stage: str = ""
    members: tuple[str, ...] = ()
    bounds: Mapping[str, float] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.stage


@dataclass(frozen=True)
class MoveKeyGroups(Action):
    """Give keyed ``stage``'s members these key slots, state with them (hot rescale)."""

    kind: ClassVar[str] = "move_key_groups"
    stage: str = ""
    groups: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    backpressure_node: str = ""
    # Each member's share of the records before and (as measured so far) after.
    shares_before: Mapping[str, float] = field(default_factory=dict)
    shares_after: Mapping[str, float] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        return self.backpressure_node


@dataclass(frozen=True)
class ScaleOutRequest(Action):
    """Ask the management side for ``instances`` more parallel instances of ``stage``;
    with the stage's measured capacity and the input it must take (bytes per second;
    0 where it is not measured) that sized the request (balancer/sizing.py)."""

    kind: ClassVar[str] = "scale_out_request"
    stage: str = ""
    upstream: str = ""
    instances: int = 1
    capacity_bps: float = 0.0
    target_bps: float = 0.0

    @property
    def subject(self) -> str:
        return self.upstream
