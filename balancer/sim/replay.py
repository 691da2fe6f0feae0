"""A live run replayed in the simulator: its pipeline, its input, its runtime.

A :class:`Replay` is what ``manage.py calibrate_sim RUN`` writes and
``manage.py simulate --replay FILE`` reads: the run's pipeline document, its input as
the source cut it (each chunk tagged with the branch its key routes to, and arriving
when its data did: a file's at the start, a stream's as its entries were added), and
the :class:`~balancer.sim.calibration.RuntimeModel` fitted from its batches (a placed
run's with each operator's own cost on its own worker). Every policy then runs on the
same replay, placed as the run was, and its live fluid bound is that schedule drained
at the pipeline's max flow counted in source bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from balancer.document import PipelineDocument
from balancer.policy import Policy
from balancer.sim.bound import reduced_max_flow, schedule_bound
from balancer.sim.calibration import RuntimeModel
from balancer.sim.control import BENCHMARK_POLICIES, controllers_for
from balancer.sim.engine import SimResult, Simulator
from balancer.sim.workload import Workload
from balancer.topology import Topology

MAX_PACKETS = 1_000_000  # a replay file is read whole: bounded
# A simulated run still going after this many live bounds is stuck, not slow.
_GIVE_UP_AFTER_BOUNDS = 50


@dataclass(frozen=True)
class Replay:
    document: PipelineDocument
    runtime: RuntimeModel
    workload: Workload

    @property
    def topology(self) -> Topology:
        """The pipeline with its operators' reductions, as the live balancer sees it."""
        return Topology.from_document(self.document).with_reductions(self.runtime.reductions)

    def live_bound_s(self) -> float:
        """No policy finishes before the input crossed the pipeline at its max flow in
        source bytes, the operators' reductions counted. Not the workers' speed: that is
        a fitted model's, which a live run may beat, and a bound it must not."""
        rate = reduced_max_flow(self.topology, self.runtime.reductions)
        sizes = np.full(self.workload.packets, self.workload.packet_bytes)
        return schedule_bound(self.workload.arrivals, sizes, rate)

    def run(self, policy_name: str) -> SimResult:
        return self.run_policy(BENCHMARK_POLICIES[policy_name].policy())

    def run_policy(self, policy: Policy) -> SimResult:
        """Raises RuntimeError when the policy has not finished after many bounds."""
        simulator = Simulator(
            self.topology, self.workload, policy, controllers_for(policy), self.runtime
        )
        bound = self.live_bound_s()
        limit = _GIVE_UP_AFTER_BOUNDS * bound if math.isfinite(bound) and bound > 0 else 3600.0
        return simulator.run(max_time_s=max(limit, 60.0))

    def run_all(self, names: Sequence[str] = tuple(BENCHMARK_POLICIES)) -> dict[str, SimResult]:
        return {name: self.run(name) for name in names}

    def to_json(self) -> dict[str, Any]:
        w = self.workload
        return {
            "document": self.document,
            "runtime": self.runtime.to_json(),
            "workload": {
                "tags": list(w.tags),
                "packet_bytes": w.packet_bytes,
                "arrivals": [round(float(a), 6) for a in w.arrivals],
                "tag_index": [int(t) for t in w.tag_index],
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Replay:
        """Raises ValueError (or KeyError, TypeError) on a document that is not a replay."""
        raw = data["workload"]
        tags = tuple(str(t) for t in raw["tags"])
        arrivals = np.array(raw["arrivals"], dtype=float)
        index = np.array(raw["tag_index"], dtype=np.int64)
        if not 0 < len(arrivals) <= MAX_PACKETS or len(index) != len(arrivals):
            raise ValueError(f"a replay holds 1 to {MAX_PACKETS} chunks, each with a tag")
        if index.min() < 0 or index.max() >= len(tags):
            raise ValueError("a chunk's tag is not one of the replay's branches")
        if np.any(np.diff(arrivals) < 0) or not np.all(np.isfinite(arrivals)):
            raise ValueError("arrival times must be finite and in order")
        packet_bytes = float(raw["packet_bytes"])
        if not packet_bytes > 0:
            raise ValueError("packet_bytes must be positive")
        document: PipelineDocument = data["document"]
        replay = cls(
            document,
            RuntimeModel.from_json(data["runtime"]),
            Workload(tags, packet_bytes, arrivals, index),
        )
        topology = replay.topology
        (source,) = topology.sources()
        if set(tags) != set(topology.downstreams(source)):
            raise ValueError("the replay's branches are not its source's downstreams")
        replay.runtime.check_placed(topology)
        return replay
