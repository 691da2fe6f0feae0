"""The restart policy (pure) and the supervisor's loop, on a clock the test moves."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.services.runconsole import Stop
from orchestrator.services.supervisor import Backoff, Restart, Supervisor

POLICY = Backoff()
uptimes = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


def test_quick_exits_double_the_delay_up_to_30_s() -> None:
    restart = None
    delays = []
    for _ in range(8):
        restart = POLICY.next(restart, uptime_s=0.5)
        delays.append(restart.delay_s)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert restart == Restart(number=8, delay_s=30)


def test_5_s_up_resets_the_delay_but_not_the_count() -> None:
    slow = Restart(number=5, delay_s=16)
    assert POLICY.next(slow, uptime_s=5.0) == Restart(number=6, delay_s=1)
    assert POLICY.next(slow, uptime_s=4.9) == Restart(number=6, delay_s=30)


@given(st.lists(uptimes, min_size=1, max_size=40))
def test_every_delay_is_within_bounds_and_counts_up(uptime_list: list[float]) -> None:
    restart = None
    for number, uptime in enumerate(uptime_list, start=1):
        previous = restart
        restart = POLICY.next(previous, uptime)
        assert restart.number == number
        assert POLICY.first_s <= restart.delay_s <= POLICY.max_s
        if previous is None or uptime >= POLICY.stable_s:
            assert restart.delay_s == POLICY.first_s
        else:
            assert restart.delay_s == min(previous.delay_s * 2, POLICY.max_s)


@given(
    st.floats(min_value=0.1, max_value=10.0),
    st.floats(min_value=1.0, max_value=100.0),
    st.lists(st.floats(min_value=0.0, max_value=59.9), min_size=1, max_size=30),
)
def test_quick_exits_never_shorten_the_delay(
    first_s: float, factor: float, quick_uptimes: list[float]
) -> None:
    policy = Backoff(first_s=first_s, max_s=first_s * factor, stable_s=60.0)
    restart = policy.next(None, 0.0)
    for uptime in quick_uptimes:
        following = policy.next(restart, uptime)
        assert following.delay_s >= restart.delay_s
        restart = following


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ScriptedProcess:
    """Stands in for a process in the loop's test only: exits when told to."""

    name: str
    exit_code: int | None = None
    starts: int = 0

    def poll(self) -> int | None:
        return self.exit_code

    def start(self) -> None:
        self.starts += 1
        self.exit_code = None


@dataclass
class Lines:
    said: list[str] = field(default_factory=list)

    def __call__(self, line: str) -> None:
        self.said.append(line)


def test_the_loop_waits_out_the_delay_then_restarts_and_says_so() -> None:
    clock, lines = FakeClock(), Lines()
    supervisor = Supervisor(clock=clock, say=lines)
    worker = ScriptedProcess("control worker")
    supervisor.watch(worker)
    supervisor.tick()
    assert worker.starts == 0 and lines.said == []
    # It dies at once: restarted 1 s later, not before
    worker.exit_code = -9
    clock.now = 0.5
    supervisor.tick()
    assert lines.said == ["control worker exited with code -9; restarting in 1 s (restart 1)"]
    clock.now = 1.4
    supervisor.tick()
    assert worker.starts == 0
    clock.now = 1.5
    supervisor.tick()
    assert worker.starts == 1
    # It dies again quickly: 2 s
    worker.exit_code = 1
    clock.now = 2.0
    supervisor.tick()
    assert lines.said[-1] == "control worker exited with code 1; restarting in 2 s (restart 2)"
    clock.now = 4.0
    supervisor.tick()
    assert worker.starts == 2
    # After a minute up, back to 1 s
    worker.exit_code = -15
    clock.now = 64.0
    supervisor.tick()
    assert lines.said[-1] == "control worker exited with code -15; restarting in 1 s (restart 3)"


def test_a_failed_start_is_reported_and_tried_again_later() -> None:
    clock, lines = FakeClock(), Lines()

    @dataclass
    class Refuses(ScriptedProcess):
        def start(self) -> None:
            self.starts += 1
            raise OSError("port in use")

    redis = Refuses("redis", exit_code=-9)
    supervisor = Supervisor(clock=clock, say=lines)
    supervisor.watch(redis)
    supervisor.tick()
    clock.now = 1.0
    supervisor.tick()
    assert redis.starts == 1
    assert lines.said[-1] == "redis did not start again: port in use"
    supervisor.tick()
    assert lines.said[-1] == "redis exited with code -9; restarting in 2 s (restart 2)"


def test_a_stop_signal_during_a_restart_stops_the_loop() -> None:
    @dataclass
    class Interrupted(ScriptedProcess):
        def start(self) -> None:
            raise Stop("SIGTERM")

    clock, lines = FakeClock(), Lines()
    postgresql = Interrupted("postgresql", exit_code=-9)
    supervisor = Supervisor(clock=clock, say=lines)
    supervisor.watch(postgresql)
    supervisor.tick()
    clock.now = 1.0
    # SIGTERM while PostgreSQL starts again is not a failed start: it reaches the console
    with pytest.raises(Stop):
        supervisor.tick()
    assert not any("did not start again" in line for line in lines.said)
