"""Watch processes and restart the ones that exit, with exponential backoff.

``make run`` (``runconsole``) hands the supervisor everything it started: its children
(workers, beat, the ASGI server, the demo producer) and the embedded services. A process
that exits is restarted after a delay that starts at 1 s, doubles on each quick exit up
to 30 s, and starts again at 1 s once the process had stayed up 5 s: a crash loop (a
process dying as it starts) costs little, and a process killed now and then, however
often, is back in a second. The console's processes that cannot start die in their
imports and configuration checks (a worker with a missing settings module: 1.2 s); one
that lived longer had started.
(A minute was the first rule, then 15 s: under the chaos suite's faults on the control
worker alone, which came 8 to 13 s after its restarts, 15 s made its delay grow to 30 s
and its recovery p95 45.6 s.)

The decision (:class:`Backoff`) is pure: times in, a :class:`Restart` out. The loop
(:class:`Supervisor`) does the process I/O through :class:`Supervised`, and only
``poll`` reads an exit, so every exited child is reaped (no zombie holds its pid, which
PostgreSQL would take for a live server when it checks its lock file).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol


@dataclass(frozen=True)
class Restart:
    """One decided restart: its number (1 for the first) and the wait before it."""

    number: int
    delay_s: float


@dataclass(frozen=True)
class Backoff:
    """How long to wait before restarting a process that exited."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 5.0

    def next(self, previous: Restart | None, uptime_s: float) -> Restart:
        """The restart after an exit, given the previous restart (``None``: the process
        never was restarted) and how long the process ran before it exited."""
        number = 1 if previous is None else previous.number + 1
        if previous is None or uptime_s >= self.stable_s:
            return Restart(number, self.first_s)
        return Restart(number, min(previous.delay_s * 2, self.max_s))


class Supervised(Protocol):
    """A process the supervisor can watch and start again."""

    @property
    def name(self) -> str: ...

    def poll(self) -> int | None:
        """The exit code once the process exited (reaping it), else ``None``."""

    def start(self) -> None:
        """Start the process again, in place; may raise when it cannot."""


def _print(line: str) -> None:
    print(line, flush=True)


@dataclass
class _Watch:
    target: Supervised
    started_at: float
    last: Restart | None = None
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Polls its processes; restarts each one that exited once its backoff has passed.

    ``clock`` and ``say`` can be replaced so that the loop's timing and log lines are
    tested without waiting; ``runconsole`` uses monotonic time and stdout."""

    backoff: Backoff = field(default_factory=Backoff)
    clock: Callable[[], float] = time.monotonic
    say: Callable[[str], None] = _print
    _watches: list[_Watch] = field(default_factory=list)

    def watch(self, target: Supervised) -> None:
        """Supervise ``target``, already started."""
        self._watches.append(_Watch(target, started_at=self.clock()))

    def forget(self, target: Supervised) -> None:
        """Stop supervising ``target`` (a process stopped on purpose stays down)."""
        self._watches = [w for w in self._watches if w.target is not target]

    def tick(self) -> None:
        """One pass: note exits, and start the processes whose delay has passed."""
        for watch in self._watches:
            now = self.clock()
            if watch.restart_at is None:
                code = watch.target.poll()
                if code is None:
                    continue
                watch.last = self.backoff.next(watch.last, now - watch.started_at)
                watch.restart_at = now + watch.last.delay_s
                self.say(
                    f"{watch.target.name} exited with code {code}; "
                    f"restarting in {watch.last.delay_s:g} s (restart {watch.last.number})"
                )
            elif now >= watch.restart_at:
                watch.restart_at = None
                watch.started_at = now
                try:
                    watch.target.start()
                except Exception as exc:  # noqa: BLE001 - a failed restart must not stop the console
                    # If the process is down (the old one, or a new one that died while
                    # starting), the next tick sees its exit and schedules another
                    # attempt, with a longer delay.
                    self.say(f"{watch.target.name} did not start again: {exc}")

    def run(self, interval_s: float = 0.5) -> NoReturn:
        """Supervise until interrupted (runconsole's signal handlers raise out of here)."""
        while True:
            self.tick()
            time.sleep(interval_s)
