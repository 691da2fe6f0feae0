"""The reference benchmark: every policy on the same workload, against the fluid bound.

One *scenario* is a topology, a volume and a seed: its workload (the same packets for
every policy), the fluid bound (:func:`~balancer.sim.bound.fluid_bound` at the
topology's max flow) and the minimum migrated share needed to reach that bound
(:func:`~balancer.sim.bound.minimum_share`). Each policy of
:data:`~balancer.sim.control.BENCHMARK_POLICIES` then runs once on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from balancer.policy import Policy
from balancer.sim.bound import branch_capacities, fluid_bound, max_flow, minimum_share
from balancer.sim.control import BENCHMARK_POLICIES, controllers_for
from balancer.sim.engine import SimResult, Simulator
from balancer.sim.reference import reference_workload
from balancer.sim.workload import Workload, generate
from balancer.topology import Topology

SWEEP_ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9)
SWEEP_BETAS = (0.3, 0.5, 0.7, 1.0, 2.0)
# A run still going after this many bounds is stuck, not slow: stop it with an error.
_GIVE_UP_AFTER_BOUNDS = 50


@dataclass(frozen=True)
class Scenario:
    """What every policy of one comparison shares."""

    topology: Topology
    workload: Workload
    seed: int
    bound_s: float
    minimum_share: float

    @classmethod
    def build(cls, topology: Topology, volume_bytes: float, seed: int) -> Scenario:
        (source,) = topology.sources()
        workload = generate(reference_workload(volume_bytes), topology.downstreams(source), seed)
        bound = fluid_bound(workload, max_flow(topology))
        share = minimum_share(workload, branch_capacities(topology), bound)
        return cls(topology, workload, seed, bound, share)

    def run(self, policy: Policy) -> SimResult:
        simulator = Simulator(self.topology, self.workload, policy, controllers_for(policy))
        return simulator.run(max_time_s=_GIVE_UP_AFTER_BOUNDS * self.bound_s)


@dataclass(frozen=True)
class Outcome:
    """One policy's run on one scenario, with the scenario's yardsticks."""

    policy: str
    volume_bytes: float
    completion_s: float
    bound_s: float
    migrated_share: float
    minimum_share: float

    @property
    def ratio_to_bound(self) -> float:
        return self.completion_s / self.bound_s

    def gain_over(self, baseline: Outcome) -> float:
        """Share of the baseline's completion time saved (the published "gain")."""
        return (baseline.completion_s - self.completion_s) / baseline.completion_s

    def to_json(self, baseline: Outcome | None = None) -> dict[str, float | str]:
        payload: dict[str, float | str] = {
            "policy": self.policy,
            "completion_s": round(self.completion_s, 3),
            "bound_s": round(self.bound_s, 3),
            "ratio_to_bound": round(self.ratio_to_bound, 4),
            "migrated_share": round(self.migrated_share, 4),
            "minimum_share": round(self.minimum_share, 4),
        }
        if baseline is not None:
            payload["gain_over_credit"] = round(self.gain_over(baseline), 4)
        return payload


def run_policy(scenario: Scenario, name: str, policy: Policy | None = None) -> Outcome:
    """Run benchmark policy ``name`` (or ``policy``, reported under that name)."""
    result = scenario.run(policy or BENCHMARK_POLICIES[name].policy())
    return Outcome(
        policy=name,
        volume_bytes=scenario.workload.volume_bytes,
        completion_s=result.completion_s,
        bound_s=scenario.bound_s,
        migrated_share=result.migrated_share,
        minimum_share=scenario.minimum_share,
    )


def table(
    topology: Topology,
    volumes: Iterable[float],
    seed: int,
    policies: Sequence[str] = tuple(BENCHMARK_POLICIES),
) -> list[list[Outcome]]:
    """Per volume, every policy's outcome on that volume's scenario."""
    rows = []
    for volume in volumes:
        scenario = Scenario.build(topology, volume, seed)
        rows.append([run_policy(scenario, name) for name in policies])
    return rows


def sweep(
    topology: Topology,
    volume_bytes: float,
    seed: int,
    alphas: Sequence[float] = SWEEP_ALPHAS,
    betas: Sequence[float] = SWEEP_BETAS,
) -> Mapping[tuple[float, float], Outcome]:
    """The published migration policy at every ``(alpha, beta)``, like Table 1."""
    scenario = Scenario.build(topology, volume_bytes, seed)
    published = BENCHMARK_POLICIES["pressure"]
    return {
        (alpha, beta): run_policy(
            scenario, f"pressure a={alpha:g} b={beta:g}", published.policy(alpha=alpha, beta=beta)
        )
        for beta in betas
        for alpha in alphas
    }


def completion_curves(
    scenario: Scenario, policies: Sequence[str], every_s: float
) -> dict[str, list[tuple[float, float]]]:
    """Completed fraction of the volume every ``every_s`` seconds, per policy."""
    return {
        name: scenario.run(BENCHMARK_POLICIES[name].policy()).completed_fraction(every_s)
        for name in policies
    }
