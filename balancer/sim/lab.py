"""The policy lab: every policy simulated on one workload, each with its completion curve,
against the live fluid bound.

The console's lab (docs/console.md, "Policy lab") runs :func:`run_lab` in a process of
its own: ``python -m balancer.sim.lab`` reads a :class:`LabRequest` as JSON on stdin and
writes the :class:`LabOutcome` as JSON on stdout. A simulation is CPU-bound Python, and
the worker that asks for it drives live runs on threads that must keep their tick.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from balancer.policy import Policy, PolicyError
from balancer.sim.replay import Replay

CURVE_POINTS = 120  # samples of each completion curve: enough for a chart, small to store
MAX_REQUEST_BYTES = 256 * 2**20  # a replay of a million chunks is about 40 MB of JSON


@dataclass(frozen=True)
class Arm:
    """One policy of the lab: a name (the live run's ``lab_arm``), what to call it, and
    its values."""

    name: str
    label: str
    policy: Policy


class ArmJson(TypedDict):
    name: str
    label: str
    completion_s: float | None  # None: it did not finish (see ``problem``)
    ratio_to_bound: float | None
    migrated_share: float
    curve: list[tuple[float, float]]  # (seconds, completed fraction)
    problem: str


class LabJson(TypedDict):
    bound_s: float
    arms: list[ArmJson]


@dataclass(frozen=True)
class ArmOutcome:
    name: str
    label: str
    completion_s: float | None
    migrated_share: float
    curve: list[tuple[float, float]]
    problem: str = ""

    def to_json(self, bound_s: float) -> ArmJson:
        ratio = None
        if self.completion_s is not None and bound_s > 0:
            ratio = round(self.completion_s / bound_s, 4)
        return {
            "name": self.name,
            "label": self.label,
            "completion_s": None if self.completion_s is None else round(self.completion_s, 3),
            "ratio_to_bound": ratio,
            "migrated_share": round(self.migrated_share, 4),
            "curve": [(round(t, 3), round(f, 4)) for t, f in self.curve],
            "problem": self.problem,
        }


@dataclass(frozen=True)
class LabOutcome:
    bound_s: float
    arms: list[ArmOutcome]

    def to_json(self) -> LabJson:
        return {
            "bound_s": round(self.bound_s, 3),
            "arms": [arm.to_json(self.bound_s) for arm in self.arms],
        }


def run_lab(replay: Replay, arms: Sequence[Arm]) -> LabOutcome:
    """Each arm on the same replay; an arm that deadlocks or never finishes is reported
    with its problem, and the others still run."""
    outcomes = []
    for arm in arms:
        try:
            result = replay.run_policy(arm.policy)
        except RuntimeError as stuck:
            outcomes.append(ArmOutcome(arm.name, arm.label, None, 0.0, [], str(stuck)))
            continue
        every = max(result.completion_s / CURVE_POINTS, 1e-3)
        outcomes.append(
            ArmOutcome(
                arm.name,
                arm.label,
                result.completion_s,
                result.migrated_share,
                result.completed_fraction(every),
            )
        )
    return LabOutcome(replay.live_bound_s(), outcomes)


class LabRequest(TypedDict):
    replay: dict[str, Any]
    arms: list[dict[str, Any]]  # {"name", "label", "policy": Policy values}


def request_of(replay: Replay, arms: Sequence[Arm]) -> LabRequest:
    return {
        "replay": replay.to_json(),
        "arms": [{"name": a.name, "label": a.label, "policy": a.policy.to_dict()} for a in arms],
    }


def read_request(data: Any) -> tuple[Replay, list[Arm]]:
    """Raises ValueError (or KeyError, TypeError, PolicyError) on what is not a request."""
    replay = Replay.from_json(data["replay"])
    arms = [
        Arm(str(raw["name"]), str(raw["label"]), Policy.from_mapping(raw["policy"]))
        for raw in data["arms"]
    ]
    if not arms:
        raise ValueError("a lab runs at least one policy")
    return replay, arms


def main(argv: Sequence[str]) -> int:
    """``[--nice N] [--memory-mb M]``: lowers this process's priority and caps its
    address space before reading the request (the caller's limits, set here because a
    threaded caller cannot run code between fork and exec safely)."""
    parser = argparse.ArgumentParser(prog="python -m balancer.sim.lab")
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--memory-mb", type=int, default=0)
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if args.memory_mb:
        limit = args.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    if len(raw) > MAX_REQUEST_BYTES:
        print(f"lab: the request is over {MAX_REQUEST_BYTES} bytes", file=sys.stderr)
        return 2
    try:
        replay, arms = read_request(json.loads(raw))
    except (ValueError, KeyError, TypeError, PolicyError) as problem:
        print(f"lab: not a lab request: {problem}", file=sys.stderr)
        return 2
    json.dump(run_lab(replay, arms).to_json(), sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
