"""How many instances each stage needs, in one step, from measured rates (DS2).

DS2 (Kalavri et al., OSDI 2018; the model behind Flink's autoscaler) sizes every
operator from its *true processing rate*, what it does per second of busy time
(balancer/capacity.py), instead of stepping one instance at a time and waiting to see.
With the source's arrival rate ``r`` and the backlog ``B`` to drain over the horizon
``H``, the source must send ``r + B / H`` bytes per second; each stage must take that
times the bytes it receives per source byte (the reductions before it,
``Topology.source_shares``), plus what already waits in its own pools over ``H``, and
needs

    p* = ceil(target / mean true rate of its instances)

instances, capped by the most a stage may have. Instances that share a resource (the
shared pool, one Spark worker) count once, at that resource's rate: a second instance
on the same cores adds nothing, so a stage's capacity is the sum over the resources it
runs on, and ``p*`` counts resources.

A stage with an instance whose rate is not known yet is not sized: every decision that
needs it says so rather than guessing (:attr:`StageSize.known`). Nor is a keyed stage
(not ``mergeable``): each of its instances reads all of its input and keeps only its
key groups' records, so another instance adds no capacity to read it; its hot key
groups are moved instead (balancer/key_moves.py).

:func:`scaling_step` is the policy's ``scale_out = measured`` trigger: a stage whose
target has exceeded its capacity for ``scale_out_ticks`` ticks in a row is asked
``p*`` minus its resources more instances in one request, each to run on a resource
the stage does not use yet. :func:`sized` gives a request from the flags trigger
(balancer/rate.py) the same count where the stage is measured. Neither sizes a stage on
the shared pool (pooled placement), where another instance adds no resource.

:func:`spare_without` is the way back: a stage whose other resources would still take
its target with ``SCALE_IN_HEADROOM`` to spare can give one back (the runtime removes
the instance on its newest worker after ``scale_in_after_s`` of it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from balancer.model import SHARED_POOL, Observation, ScaleOutRequest, SourceLoad
from balancer.policy import Policy
from balancer.rate import ONE_MORE
from balancer.units import MB

# The most instances one stage may have; the runtime refuses more
# (orchestrator/rescale/control.py).
MAX_INSTANCES_PER_STAGE = 8
# A measured scale-in leaves the stage at most 1/1.25 = 80% loaded: the scale-out
# trigger fires above 100%, so a resource given back is not asked for again at once.
SCALE_IN_HEADROOM = 1.25


@dataclass(frozen=True, slots=True)
class StageSize:
    """A stage as DS2 sees it: the input it must take per second, what its resources do,
    and how many it needs."""

    stage: str
    members: tuple[str, ...]
    resources: int  # distinct resources its members run on
    capacity_bps: float  # sum over its resources of their true rates; inf if unknown
    target_bps: float  # bytes per second of its input the source's target brings
    wanted: int  # p*, capped; 0 when not known
    # Each member's share of the stage's input in proportion to its resource's rate
    # (members sharing one resource split its share evenly).
    shares: Mapping[str, float] = field(default_factory=dict)
    # Each resource's true rate (``math.inf`` while not measured), and the resource
    # each member runs on: what the stage loses if one goes.
    rates: Mapping[str, float] = field(default_factory=dict)
    resource_of: Mapping[str, str] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return math.isfinite(self.capacity_bps) and self.capacity_bps > 0

    @property
    def mean_rate_bps(self) -> float:
        return self.capacity_bps / self.resources if self.known else math.inf

    @property
    def load(self) -> float:
        """Target over capacity: above 1 the stage falls behind."""
        return self.target_bps / self.capacity_bps if self.known else 0.0

    @property
    def overloaded(self) -> bool:
        return self.known and self.target_bps > self.capacity_bps

    @property
    def hold(self) -> float:
        """The rate coefficient that keeps the source within the stage's capacity until
        more instances run (1 when it keeps up)."""
        return min(1.0, self.capacity_bps / self.target_bps) if self.overloaded else 1.0

    def describe(self) -> str:
        if not self.known:
            return f"stage {self.stage}: capacity not measured yet"
        held = f"; until they run it keeps up with {self.hold:.2f} of it" if self.overloaded else ""
        return (
            f"stage {self.stage}: needs {self.target_bps / MB:.2f} MB/s, its "
            f"{self.resources} resource(s) do {self.capacity_bps / MB:.2f} MB/s "
            f"(load {self.load:.2f}): {self.wanted} wanted{held}"
        )


def source_target(source: SourceLoad, horizon_s: float) -> float | None:
    """What the source must send per second: its arrival rate plus its backlog drained
    over ``horizon_s``; None when its arrival rate is not known."""
    if source.arrival_bps is None:
        return None
    return source.arrival_bps + source.backlog_bytes / horizon_s


@dataclass(frozen=True, slots=True)
class StageCapacity:
    """What a stage's resources do together: the sum of their true rates (``math.inf``
    while an instance is not measured), how many resources, and each instance's."""

    bytes_per_s: float
    resources: int
    resource_of: Mapping[str, str]
    rate_of: Mapping[str, float]  # per resource

    @property
    def known(self) -> bool:
        return math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0


def stage_capacity(observation: Observation, members: Sequence[str]) -> StageCapacity:
    """``members``' capacity as the observation measured it: each resource they run on
    counted once, at its rate (a fused batch shows the resource's rate at each member
    it ran)."""
    rates: dict[str, float] = {}
    resource_of: dict[str, str] = {}
    for member in members:
        seen = observation.nodes.get(member)
        if seen is None:
            return StageCapacity(math.inf, 0, {}, {})
        resource_of[member] = seen.resource
        rates[seen.resource] = max(rates.get(seen.resource, 0.0), seen.capacity_bps)
    total = sum(rates.values()) if rates else math.inf
    return StageCapacity(total, len(rates), resource_of, rates)


def size_stage(
    observation: Observation,
    stage: str,
    target_bps: float,
    *,
    horizon_s: float,
    maximum: int = MAX_INSTANCES_PER_STAGE,
) -> StageSize:
    """``stage``'s size for a source sending ``target_bps`` (from the observation's
    measured capacities, resources and the topology's reductions), its pools' queued
    bytes drained over ``horizon_s`` too."""
    topology = observation.topology
    members = topology.stage_members(stage)
    shares_in, _ = topology.source_shares
    # What already waits in the stage's pools is backlog it must drain too.
    queued = sum(observation.nodes[m].buffered_bytes for m in members if m in observation.nodes)
    target = target_bps * min((shares_in[m] for m in members), default=1.0) + queued / horizon_s
    found = stage_capacity(observation, members)
    if not found.known:
        return StageSize(
            stage,
            members,
            found.resources,
            math.inf,
            target,
            0,
            rates=found.rate_of,
            resource_of=found.resource_of,
        )
    capacity = found.bytes_per_s
    mean = capacity / found.resources
    wanted = min(maximum, max(1, math.ceil(target / mean - 1e-9)))
    of = found.resource_of
    together = {r: sum(1 for m in members if of[m] == r) for r in found.rate_of}
    shares = {m: found.rate_of[of[m]] / capacity / together[of[m]] for m in members}
    return StageSize(
        stage, members, found.resources, capacity, target, wanted, shares, found.rate_of, of
    )


def size_stages(observation: Observation, horizon_s: float) -> dict[str, StageSize]:
    """Every operator stage's size for the observation's source load (none when the
    observation has no source load or its arrival rate is not known)."""
    if observation.source is None:
        return {}
    target = source_target(observation.source, horizon_s)
    if target is None:
        return {}
    topology = observation.topology
    return {
        stage: size_stage(observation, stage, target, horizon_s=horizon_s)
        for stage, members in topology.stages.items()
        if all(topology.node(m).kind == "operator" and topology.node(m).mergeable for m in members)
    }


def sized(request: ScaleOutRequest, observation: Observation, policy: Policy) -> ScaleOutRequest:
    """A scale-out request for one instance, given DS2's count where its stage is
    measured and every instance runs on a resource of its own."""
    sizes = size_stages(observation, policy.scale_out_horizon_s)
    size = sizes.get(request.stage)
    if size is None or not size.known or _pooled(observation, size):
        return request
    more = max(1, size.wanted - size.resources)
    reason = request.reason.replace(ONE_MORE, f"{more} more instance(s) requested")
    return replace(
        request,
        reason=f"{reason} ({size.describe()})",
        instances=more,
        capacity_bps=size.capacity_bps,
        target_bps=size.target_bps,
    )


def others_measured(size: StageSize, member: str) -> bool:
    """Whether every resource of the stage but ``member``'s has a measured rate: what
    :func:`spare_without` needs to say anything."""
    gone = size.resource_of.get(member)
    others = [rate for r, rate in size.rates.items() if r != gone]
    return gone is not None and bool(others) and all(math.isfinite(r) for r in others)


def spare_without(size: StageSize, member: str, headroom: float = SCALE_IN_HEADROOM) -> str | None:
    """Why ``member``'s resource may go back to the pool: without it the stage's other
    resources, every one measured, still take its target ``headroom`` times over (None
    when they do not, or are not all measured). DS2's scale-in: the same measured rates
    as its scale-out, so a resource given back is not asked for again at the next tick.
    The resource that goes need not be measured: an instance that never got data says
    nothing about the others."""
    if not others_measured(size, member):
        return None
    gone = size.resource_of[member]
    left = sum(rate for r, rate in size.rates.items() if r != gone)
    if left <= 0 or left < size.target_bps * headroom:
        return None
    rate = size.rates[gone]
    said = f"{rate / MB:.2f} MB/s" if math.isfinite(rate) else "not measured"
    return (
        f"stage {size.stage} needs {size.target_bps / MB:.2f} MB/s and does "
        f"{left / MB:.2f} MB/s without {member}'s resource ({said}): at least {headroom:g}x"
    )


def _pooled(observation: Observation, size: StageSize) -> bool:
    """The stage runs on the shared pool, where another instance adds no resource."""
    return any(observation.nodes[m].resource == SHARED_POOL for m in size.members)


@dataclass(frozen=True)
class ScalingState:
    """Per stage, the consecutive ticks it was found overloaded."""

    overloaded: Mapping[str, int] = field(default_factory=dict)


def scaling_step(
    observation: Observation, state: ScalingState, policy: Policy
) -> tuple[list[ScaleOutRequest], ScalingState]:
    """The ``measured`` trigger: a stage overloaded ``scale_out_ticks`` ticks in a row,
    its instances each on a resource of its own, is asked its missing instances at
    once; its count then starts again."""
    requests: list[ScaleOutRequest] = []
    counts: dict[str, int] = {}
    sources = observation.topology.sources()
    for stage, size in sorted(size_stages(observation, policy.scale_out_horizon_s).items()):
        if not size.overloaded or _pooled(observation, size):
            continue
        ticks = state.overloaded.get(stage, 0) + 1
        if ticks < policy.scale_out_ticks or size.wanted <= size.resources:
            counts[stage] = ticks
            continue
        upstreams = {u for m in size.members for u in observation.topology.upstreams(m)}
        requests.append(
            ScaleOutRequest(
                reason=(
                    f"overloaded {ticks} ticks in a row: {size.describe()}; "
                    f"{size.wanted - size.resources} more instance(s) requested"
                ),
                stage=stage,
                upstream=min(upstreams) if upstreams else (sources[0] if sources else ""),
                instances=size.wanted - size.resources,
                capacity_bps=size.capacity_bps,
                target_bps=size.target_bps,
            )
        )
    return requests, ScalingState(counts)


@dataclass
class ArrivalMeter:
    """The source's arrival rate from outside the run: what it sent on plus how much
    its backlog grew, over the last ``window_s`` seconds.

    Neither figure alone says it: a source held back by backpressure sends less than
    arrives (its backlog grows), one draining a backlog sends more.
    """

    window_s: float = 10.0
    _points: list[tuple[float, float, float]] = field(default_factory=list)

    def add(self, time_s: float, sent_bytes: float, backlog_bytes: float) -> float | None:
        """Note ``sent_bytes`` sent since the last call and the backlog now; the arrival
        rate over the window (None until two points span some time)."""
        total = (self._points[-1][1] if self._points else 0.0) + max(0.0, sent_bytes)
        self._points.append((time_s, total, max(0.0, backlog_bytes)))
        while len(self._points) > 2 and time_s - self._points[1][0] >= self.window_s:
            self._points.pop(0)
        first, last = self._points[0], self._points[-1]
        span = last[0] - first[0]
        if span <= 0:
            return None
        return max(0.0, ((last[1] - first[1]) + (last[2] - first[2])) / span)
