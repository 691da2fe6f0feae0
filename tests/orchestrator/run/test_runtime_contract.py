"""One contract for both runtimes (balancer.runtime.Runtime): fed the same measurements,
the simulator and a live run observe alike, and every policy takes the same decisions
in both, tick after tick, with what each applied coming back in its next observation.

The live side is the driver's own runtime on a real ZooKeeper (flags, the stepwise
task-message queue, task states); only the measurements are scripted, in place of the
ledger's flows and the simulator's packet counters.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from balancer.loop import BalancerState, step
from balancer.model import Observation
from balancer.runtime import Measured, Measurement, Runtime
from balancer.sim.control import BENCHMARK_POLICIES
from balancer.sim.engine import Simulator
from balancer.sim.runtime import SimRuntime
from balancer.sim.workload import Workload
from balancer.topology import Topology
from balancer.units import MB
from orchestrator.run.actions import ActionTable
from orchestrator.run.commands import SignalQueue
from orchestrator.run.runtime import LiveRuntime
from orchestrator.zk.control_plane import ControlPlane
from tests.balancer.builders import CAPACITY, layered

pytestmark = pytest.mark.integration

TICK_S = 0.5
# A run id per policy, for the run's znodes under the test's own ZooKeeper root.
CONTRACT_RUNS = {name: 9000 + i for i, name in enumerate(sorted(BENCHMARK_POLICIES))}
TICKS = 60


def script() -> list[Measured]:
    """s sends to a1 and a2; a1 fills to its capacity, stays full, then drains and stays
    empty long enough for every slowed upstream to be restored; a2 stays light."""
    measured = []
    for tick in range(TICKS):
        if tick < 12:
            a1 = CAPACITY * tick / 12
        elif tick < 24:
            a1 = float(CAPACITY)
        elif tick < 32:
            a1 = CAPACITY * (32 - tick) / 8
        else:
            a1 = 0.0
        a2 = 2 * MB if tick % 3 else 0.0
        incoming = {"a1": 8 * MB * (tick < 24), "a2": 2 * MB}
        nodes = {
            "s1": Measurement(
                buffered_bytes=4 * MB,
                in_rate=10 * MB,
                out_rate=10 * MB,
                head_by_route={"a1": 3 * MB, "a2": 1 * MB},
                in_rate_by_route=incoming,
                capacity_bps=math.inf,
                resource="s1",
            ),
            # Measured capacities, each instance on a worker of its own.
            "a1": Measurement(a1, 8 * MB, 4 * MB * (tick < 24), {}, {}, 4 * MB, "w1"),
            "a2": Measurement(a2, 2 * MB, 2 * MB, {}, {}, 8 * MB, "w2"),
            "k1": Measurement(0.0, 6 * MB, 6 * MB, {}, {}, math.inf, "w1"),
        }
        measured.append(Measured(tick * TICK_S, TICK_S, nodes))
    return measured


def scripted(measured: list[Measured]) -> Callable[..., Measured]:
    ticks = iter(measured)
    return lambda *_: next(ticks)


def decisions(
    runtime: Runtime, policy_name: str
) -> tuple[list[Observation], list[list[dict[str, object]]]]:
    policy = BENCHMARK_POLICIES[policy_name].policy()
    state, observed, decided = BalancerState(), [], []
    for _ in range(TICKS):
        observation = runtime.observe()
        decision = step(observation, state, policy)
        state = decision.state
        runtime.apply(decision.actions)
        observed.append(observation)
        decided.append([action.to_json() for action in decision.actions])
    return observed, decided


def sim_runtime(topology: Topology, policy_name: str) -> SimRuntime:
    policy = BENCHMARK_POLICIES[policy_name].policy()
    workload = Workload(("a1", "a2"), MB, np.zeros(1), np.zeros(1, dtype=int))
    return SimRuntime(Simulator(topology, workload, policy), scripted(script()))


def live_runtime(plane: ControlPlane, topology: Topology, policy_name: str) -> LiveRuntime:
    policy = BENCHMARK_POLICIES[policy_name].policy()
    table = ActionTable(plane, run_id=CONTRACT_RUNS[policy_name], on_graph_change=lambda: None)
    return LiveRuntime(topology, scripted(script()), table, SignalQueue(table, policy))


@pytest.mark.parametrize("policy_name", sorted(BENCHMARK_POLICIES))
def test_both_runtimes_take_the_same_decisions_on_the_same_measurements(
    plane: ControlPlane, policy_name: str
) -> None:
    topology = layered(("s", 1), ("a", 2), ("k", 1))
    sim_observed, sim_decided = decisions(sim_runtime(topology, policy_name), policy_name)
    live_observed, live_decided = decisions(live_runtime(plane, topology, policy_name), policy_name)
    assert live_decided == sim_decided
    assert live_observed == sim_observed
    # The adaptive window decides per batch, in the dispatcher, never at a tick
    # (balancer.loop): both runtimes take no tick decision for it.
    assert any(sim_decided) == (policy_name != "window"), "the script makes the policy act"


def test_a_live_stepwise_upstream_is_slowed_then_restored_to_full_speed(
    plane: ControlPlane,
) -> None:
    # The driver once reported no task speeds: a slowed upstream was never restored.
    topology = layered(("s", 1), ("a", 2), ("k", 1))
    runtime = live_runtime(plane, topology, "stepwise")
    observed, decided = decisions(runtime, "stepwise")
    signals = [
        a["signal"] for actions in decided for a in actions if a["kind"] == "stepwise_signal"
    ]
    assert "slow" in signals and "restore" in signals
    assert min(o.nodes["s1"].speed for o in observed) < 1.0
    assert runtime.table.controls.of("s1").speed.speed == 1.0
    assert not runtime.table.controls.of("s1").speed.in_backpressure
    written = plane.read_task_state(str(CONTRACT_RUNS["stepwise"]), "s1")
    assert written is not None
    assert (written["speed"], written["in_backpressure"]) == (1.0, False)
