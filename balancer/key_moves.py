"""Key-group moves: a keyed stage's hot key groups go, with their state, to its peers.

A keyed (stateful) stage splits its input by key: every record of a key goes to the
one instance whose key group holds the key's slot, so traffic cannot be shifted between
its instances the way a stateless stage's can, and a hot key group keeps its instance
backpressured however the upstreams are paced. What can move is the key groups
themselves: the slot space is cut again so that each instance takes as many records as
its peers, and the hot-rescale protocol (docs/spec/hot-rescale.md section 3) hands
each moved slot's state to its new owner exactly.

The decision, for each keyed stage of two instances or more (``Observation.key_loads``):

- the member holding the largest share of the stage's records is backpressured: flagged,
  or its pool above ``bp_threshold``;
- the members run on resources of their own (``NodeObservation.resource``): between
  instances that share one, moving keys moves work from a core to the same core;
- the stage has taken at least :data:`MIN_RECORDS` records, so the shares mean
  something;
- the best cut (:func:`balanced_cut`: contiguous ranges in declaration order minimising
  the largest share) lowers the largest share by at least :data:`MIN_GAIN` of it. A cut
  the loop itself made is then close to the best one, so the decision does not come back
  until the keys' weights change.

The cut cannot split a slot: a single key holding more than an even share stays where
it is, alone or nearly, with every other slot on its peers.
"""

from __future__ import annotations

from collections.abc import Sequence

from balancer.model import KeyLoad, MoveKeyGroups, Observation
from balancer.policy import Policy

MIN_RECORDS = 1000.0
MIN_GAIN = 0.2
_BISECTIONS = 60


def key_move_step(observation: Observation, policy: Policy) -> list[MoveKeyGroups]:
    """The key-group moves this tick's observation calls for (at most one per stage)."""
    moves: list[MoveKeyGroups] = []
    for stage, load in sorted(observation.key_loads.items()):
        members = list(load.groups)
        nodes = [observation.nodes.get(m) for m in members]
        if len(members) < 2 or any(n is None for n in nodes):
            continue
        if len({n.resource for n in nodes if n is not None}) < len(members):
            continue
        if sum(load.records) < MIN_RECORDS:
            continue
        before = load.shares()
        heaviest = max(members, key=lambda m: (before[m], m))
        hot = observation.nodes[heaviest]
        if not (hot.flagged or hot.level > policy.bp_threshold):
            continue
        cut = balanced_cut(load.records, len(members))
        after_load = KeyLoad(dict(zip(members, cut, strict=True)), load.records)
        after = after_load.shares()
        if max(after.values()) > before[heaviest] * (1 - MIN_GAIN):
            continue
        moves.append(
            MoveKeyGroups(
                reason=(
                    f"{heaviest} is backpressured holding {before[heaviest]:.0%} of {stage}'s "
                    f"records; key groups cut again so that none holds more than "
                    f"{max(after.values()):.0%}"
                ),
                stage=stage,
                groups=after_load.groups,
                backpressure_node=heaviest,
                shares_before={m: round(v, 4) for m, v in before.items()},
                shares_after={m: round(v, 4) for m, v in after.items()},
            )
        )
    return moves


def balanced_cut(weights: Sequence[float], parts: int) -> list[tuple[int, int]]:
    """``parts`` non-empty contiguous ranges covering ``weights`` whose largest sum is as
    small as a cut can make it (within 2**-60 of the total), ranges in order."""
    if not 0 < parts <= len(weights):
        raise ValueError(f"cannot cut {len(weights)} slots into {parts} non-empty ranges")
    low, high = max(weights, default=0.0), float(sum(weights))
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        if len(_greedy(weights, middle)) <= parts:
            high = middle
        else:
            low = middle
    ranges = _greedy(weights, high)
    while len(ranges) < parts:
        # Splitting the widest range in two never raises the largest sum.
        widest = max(range(len(ranges)), key=lambda i: (ranges[i][1] - ranges[i][0], -i))
        start, end = ranges[widest]
        half = start + (end - start) // 2
        ranges[widest : widest + 1] = [(start, half), (half, end)]
    return ranges


def _greedy(weights: Sequence[float], limit: float) -> list[tuple[int, int]]:
    """Ranges filled left to right up to ``limit`` each (a slot heavier than ``limit``
    alone in its range)."""
    ranges: list[tuple[int, int]] = []
    start, total = 0, 0.0
    for i, weight in enumerate(weights):
        if i > start and total + weight > limit:
            ranges.append((start, i))
            start, total = i, 0.0
        total += weight
    ranges.append((start, len(weights)))
    return ranges
