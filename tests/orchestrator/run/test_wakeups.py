"""A run's driver sleeps until one of its batches ends, and whoever waits for a run
to end is woken by its end, on the real PostgreSQL."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from celery.signals import task_postrun
from django.db import connection, transaction

from orchestrator.models import Run
from orchestrator.run.completion import TickStats, settle
from orchestrator.run.wakeups import Wakeups, announce, wait_until_ended
from orchestrator.tasks import process_batch_task
from tests.orchestrator.runs import pending_run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wakeups() -> Iterator[Wakeups]:
    listening = Wakeups(41)
    yield listening
    listening.close()


def later(after_s: float, action: Callable[[], object]) -> threading.Thread:
    def act() -> None:
        time.sleep(after_s)
        action()
        connection.close()  # this thread's own connection

    thread = threading.Thread(target=act)
    thread.start()
    return thread


def announced_later(run_id: int, after_s: float) -> threading.Thread:
    return later(after_s, lambda: announce(run_id))


def test_a_notification_on_the_runs_channel_ends_the_sleep_at_once(wakeups: Wakeups) -> None:
    assert wakeups.sleep(0.01) is False  # now listening
    sender = announced_later(41, 0.2)
    began = time.monotonic()
    assert wakeups.sleep(5.0) is True
    assert time.monotonic() - began < 2.0
    sender.join()


def test_another_runs_notification_leaves_it_asleep(wakeups: Wakeups) -> None:
    wakeups.sleep(0.01)
    announce(42)
    began = time.monotonic()
    assert wakeups.sleep(0.3) is False
    assert time.monotonic() - began >= 0.29


def test_a_notification_sent_between_sleeps_is_kept_for_the_next(wakeups: Wakeups) -> None:
    wakeups.sleep(0.01)
    announce(41)
    assert wakeups.sleep(5.0) is True


def test_notifications_that_queued_up_wake_it_once(wakeups: Wakeups) -> None:
    wakeups.sleep(0.01)
    for _ in range(3):
        announce(41)
    # Queued up at the listener, not in flight: its server reads the channel's whole
    # queue before it answers a query, so after one round trip on the listening
    # connection all three are there (unprompted, a busy server hands them over in
    # several packets some time after their commits).
    listener = wakeups._listening()
    assert listener is not None
    listener.execute("SELECT 1")
    assert wakeups.sleep(5.0) is True
    assert wakeups.sleep(0.2) is False


def test_a_notification_in_a_transaction_that_rolls_back_wakes_nobody(wakeups: Wakeups) -> None:
    wakeups.sleep(0.01)

    class Undone(Exception):
        pass

    with pytest.raises(Undone), transaction.atomic():
        announce(41)
        raise Undone
    assert wakeups.sleep(0.3) is False


def test_a_notification_that_fails_leaves_the_callers_transaction_usable() -> None:
    from orchestrator.models import Run

    with transaction.atomic():
        announce(10**70)  # a channel name longer than PostgreSQL takes: refused
        assert Run.objects.count() == 0  # the transaction still answers


def test_a_batch_tasks_end_wakes_its_runs_driver(wakeups: Wakeups) -> None:
    wakeups.sleep(0.01)
    task_postrun.send(
        sender=process_batch_task,
        task=process_batch_task,
        task_id="t1",
        args=(),
        kwargs={"run_id": 41, "node": "agg1", "routes": None},
        retval={},
        state="SUCCESS",
    )
    assert wakeups.sleep(5.0) is True


def test_another_tasks_end_wakes_no_driver(wakeups: Wakeups) -> None:
    from orchestrator.tasks import drive_run

    wakeups.sleep(0.01)
    task_postrun.send(
        sender=drive_run, task=drive_run, task_id="t2", args=(), kwargs={"run_id": 41}
    )
    assert wakeups.sleep(0.3) is False


def test_a_database_it_cannot_reach_makes_it_sleep_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    params = {**connection.get_connection_params(), "host": "127.0.0.1", "port": port}
    monkeypatch.setattr(connection, "get_connection_params", lambda: params)
    unreachable = Wakeups(41)
    began = time.monotonic()
    assert unreachable.sleep(0.2) is False
    assert unreachable.sleep(0.2) is False  # not retried at once: it only sleeps
    assert time.monotonic() - began >= 0.39
    unreachable.close()


def test_a_waiter_sees_a_run_settle_at_once_not_at_its_next_check() -> None:
    run = pending_run("reference")
    settler = later(0.3, lambda: settle(run, run.epoch, TickStats()))
    began = time.monotonic()
    # Its source never read anything, so the run settles failed (coverage incomplete):
    # what matters here is that the waiter sees it as it happens.
    assert wait_until_ended(run.pk, 60.0, check_s=30.0) == "failed"
    assert time.monotonic() - began < 5.0
    settler.join()


def test_an_end_that_announced_nothing_is_seen_at_the_next_check() -> None:
    run = pending_run("reference")

    def quietly_failed() -> None:
        Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)

    ender = later(0.2, quietly_failed)
    began = time.monotonic()
    assert wait_until_ended(run.pk, 60.0, check_s=0.5) == "failed"
    assert time.monotonic() - began < 5.0
    ender.join()


def test_a_waiter_gives_up_at_its_timeout_saying_how_the_run_stands() -> None:
    run = pending_run("reference")
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"run {run.pk} is still pending after 0.4 s"):
        wait_until_ended(run.pk, 0.4, check_s=0.1)
    assert 0.39 <= time.monotonic() - began < 5.0
