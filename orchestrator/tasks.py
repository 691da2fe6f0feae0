"""Celery tasks: run drivers and the watchdog on ``control``, operator batches on ``spark``;
and :func:`start_run`, which gives a created run its driver."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import current_app, shared_task
from celery.bootsteps import RUN  # type: ignore[attr-defined]  # missing from the stubs
from celery.signals import (
    task_postrun,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Count, Max, Q
from django.utils import timezone
from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from orchestrator.ledger import retention, segments
from orchestrator.ledger.events import record_event
from orchestrator.models import PolicyLab, Run
from orchestrator.run.driver_threads import DriverThreads
from orchestrator.run.wakeups import announce
from orchestrator.services.embedded import pid_alive
from orchestrator.worker.batch import BatchReport, process_batch
from orchestrator.zk.control_plane import ControlPlane

if TYPE_CHECKING:
    from orchestrator.run.dispatch import BatchRequest

log = logging.getLogger(__name__)

NETWORK_ERRORS = (OperationalError, InterfaceError, ConnectionLoss, SessionExpiredError)
# This process's drivers, each in a thread of its own beside the pool.
DRIVERS = DriverThreads(limit=settings.BPCONSOLE_DRIVERS_PER_WORKER)


def _dispatch(run_id: int, request: BatchRequest) -> Any:
    """A batch for ``request.node``: on its placed worker's own queue, or on any Spark
    worker.

    Not added to the parent: Celery would append every batch's result to the driver
    task's ``request.children``, and a driver runs for days (it grew by each batch's
    result, 0.6 MB a minute, found with tracemalloc over a soak)."""
    return process_batch_task.apply_async(
        kwargs={
            "run_id": run_id,
            "node": request.node,
            "routes": request.routes,
            "siblings": request.siblings,
            "max_bytes": request.max_bytes,
        },
        queue=request.queue or "spark",
        add_to_parent=False,
    )


@shared_task(bind=True, name="orchestrator.drive_run")
def drive_run(self: Any, *, run_id: int) -> str:
    """Give the run a driver in a thread of this worker's own (it drives the run until
    the run ends, or until another driver supersedes it) and return at once, so that a
    run waiting for data never holds one of the pool's threads (orchestrator/run/
    driver_threads.py). A run this worker cannot take is sent again by the watchdog."""
    identity = f"{socket.gethostname()}:{os.getpid()}:{self.request.id}"
    outcome = DRIVERS.start(run_id, lambda: _drive(run_id, identity))
    if outcome != "started":
        log.warning("run %s: no driver started here: %s", run_id, outcome)
    return outcome


def _drive(run_id: int, identity: str) -> str:
    from orchestrator.run.driver import RunDriver
    from orchestrator.run.publisher import publish

    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        driver = RunDriver(
            run_id,
            control,
            identity,
            dispatch=_dispatch,
            publish=publish,
            host_running=_worker_running,
        )
        return driver.drive()


def start_run(run: Run) -> None:
    """Give a created run its driver, on the ``control`` queue."""
    drive_run.apply_async(kwargs={"run_id": run.pk}, queue="control")


@shared_task(
    bind=True,
    name="orchestrator.process_batch",
    acks_late=True,
    # A batch whose process died fails (WorkerLostError) rather than going back to the
    # end of its queue: the driver sees the failure within a second, frees what the
    # batch held and sends the node's next batch (orchestrator/run/dispatch.py).
    reject_on_worker_lost=False,
    autoretry_for=NETWORK_ERRORS,
    max_retries=5,
    retry_backoff=True,
    retry_jitter=True,
)
def process_batch_task(
    self: Any,
    *,
    run_id: int,
    node: str,
    routes: dict[str, Any] | None,
    siblings: dict[str, dict[str, Any]] | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    try:
        report = process_batch(
            run_id,
            node,
            routes,
            task_id=self.request.id or "",
            siblings=siblings,
            max_bytes=max_bytes,
        )
        if report.aligned is not None and report.aligned.tail:
            _report_tail(run_id, report)
        return report.to_json()
    except segments.LeaseLostError as err:
        # Another worker has (or will have) these segments; nothing of ours was written.
        log.warning("run %s node %s: %s", run_id, node, err)
        return {"node": node, "lease_lost": str(err)}


@task_postrun.connect
def _wake_the_driver(task: Any = None, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    """A batch has ended, its result stored: its run's driver acts on it now, not at
    its next loop (orchestrator/run/wakeups.py)."""
    run_id = (kwargs or {}).get("run_id")
    if getattr(task, "name", None) == process_batch_task.name and isinstance(run_id, int):
        announce(run_id)


@shared_task(name="orchestrator.simulate_lab", acks_late=True)
def simulate_lab(*, lab_id: int) -> str:
    """Simulate a policy lab (in a child process: see orchestrator/lab/simulation.py)."""
    from orchestrator.lab.simulation import simulate

    return simulate(lab_id)


def start_lab(lab: PolicyLab) -> None:
    """Hand a created lab to a control worker."""
    simulate_lab.apply_async(kwargs={"lab_id": lab.pk}, queue="control")


@shared_task(
    name="orchestrator.watchdog", autoretry_for=NETWORK_ERRORS, max_retries=3, retry_backoff=True
)
def watchdog() -> dict[str, Any]:
    """Reclaim expired leases; give every active run without a live driver a new one,
    and a pending run whose start was lost another; fail labs whose worker stopped
    before they finished; delete the segment files of runs that ended (a cancelled
    run's queued segments would keep theirs for good) and the distinct sets of runs
    that ended, their counts kept; withdraw the elastic pool's asks of runs that ended
    (a driver withdraws its run's own as the run ends, but a run cancelled while it had
    no driver would hold its workers for good)."""
    reclaimed = segments.reclaim_expired()
    _fail_abandoned_labs()
    retention.drop_ended_folders()
    retention.freeze_results()
    started = []
    # A pending run whose driver began writing its generated input (input_spec has
    # "generating") lost that driver if nobody holds its lock: the next one resumes it.
    # One that never had a driver may have lost the message asking for it.
    unstarted = set(_unstarted_runs())
    active = list(
        Run.objects.filter(
            Q(status__in=[Run.Status.RUNNING, Run.Status.PAUSED, Run.Status.STOPPING])
            | Q(status=Run.Status.PENDING, input_spec__has_key="generating")
        ).values_list("pk", flat=True)
    )
    with ControlPlane.connect(settings.ZK_HOSTS) as control:
        withdrawn = _withdraw_ended_asks(control)
        for run_id in sorted({*active, *unstarted}):
            holder = control.driver_holder(str(run_id))
            if holder is not None and died_here(holder):
                # Its process is gone (a control worker killed): its lock would
                # otherwise last until its ZooKeeper session expires.
                control.break_driver_lock(str(run_id), holder)
                log.warning("run %s: driver %s is dead; its lock was broken", run_id, holder)
                holder = None
            if holder is None and run_id in unstarted and not claim_resend(run_id):
                continue
            if holder is None:
                drive_run.apply_async(kwargs={"run_id": run_id}, queue="control")
                started.append(run_id)
    return {"reclaimed": reclaimed, "drivers_started": started, "asks_withdrawn": withdrawn}


def _withdraw_ended_asks(control: ControlPlane) -> list[int]:
    """Withdraw the elastic pool's asks (``spark/asked/<run>``) of runs that ended or no
    longer exist; an ask not named by a run id is not a run's and is left alone."""
    asked = {int(key) for key in control.spark_workers_asked() if key.isdecimal()}
    if not asked:
        return []
    going = Run.objects.filter(
        pk__in=asked,
        status__in=[Run.Status.PENDING, Run.Status.RUNNING, Run.Status.PAUSED, Run.Status.STOPPING],
    ).values_list("pk", flat=True)
    ended = sorted(asked - set(going))
    for run_id in ended:
        control.ask_spark_workers(str(run_id), 0, "the run ended")
        log.warning(
            "run %s ended asking the elastic pool for workers; the ask is withdrawn", run_id
        )
    return ended


def claim_resend(run_id: int) -> bool:
    """Record that this watchdog sends ``run_id`` another driver, unless another one is
    doing so or just did: watchdogs queued while the control worker was down run
    together once it is back (the chaos benchmark saw two record it in the same
    millisecond). Under the run row's lock, the run must still be overdue."""
    with transaction.atomic():
        locked = Run.objects.select_for_update(skip_locked=True).filter(pk=run_id)
        if not list(locked.values_list("pk", flat=True)) or run_id not in _unstarted_runs(run_id):
            return False
        record_event(
            run_id,
            "driver_resent",
            "no driver took this run since it was created: the message asking for one was "
            "lost (with a control worker or Redis) or is still queued; another was sent",
        )
    return True


def _unstarted_runs(run_id: int | None = None) -> list[int]:
    """Pending runs that no driver has begun and whose driver is overdue: first
    ``BPCONSOLE_DRIVER_START_S`` after the run was created, then twice as long after
    each message the watchdog sent for it (at most an hour apart). A duplicate driver
    is harmless (it waits for the run's lock, then finds the run taken or ended), but a
    run queued behind busy control workers should not collect one every 2 s."""
    start_s = settings.BPCONSOLE_DRIVER_START_S
    now = timezone.now()
    candidates = (
        Run.objects.filter(
            status=Run.Status.PENDING, created_at__lt=now - timedelta(seconds=start_s)
        )
        .filter(**({} if run_id is None else {"pk": run_id}))
        .exclude(input_spec__has_key="generating")
        .annotate(
            resent=Count("events", filter=Q(events__kind="driver_resent")),
            last_resent=Max("events__time", filter=Q(events__kind="driver_resent")),
        )
        .values_list("pk", "resent", "last_resent")
    )
    due = []
    for pk, resent, last_resent in candidates:
        wait_s = min(start_s * 2**resent, 3600.0)
        if last_resent is None or last_resent < now - timedelta(seconds=wait_s):
            due.append(pk)
    return due


def _fail_abandoned_labs() -> None:
    """A lab still waiting or running well past its time limit lost its worker (a
    control worker killed mid-simulation): said so, so that the pipeline may have
    another."""
    grace = timedelta(seconds=2 * settings.BPCONSOLE_LAB_TIMEOUT_S + 60)
    PolicyLab.objects.filter(
        status__in=PolicyLab.ACTIVE, created_at__lt=timezone.now() - grace
    ).update(
        status=PolicyLab.Status.FAILED,
        error="its worker stopped before it finished; start the lab again",
        finished_at=timezone.now(),
    )


def died_here(holder: str) -> bool:
    """Is the driver named ``holder`` (host:pid:task) a process of this machine that no
    longer exists? Unknowable for another machine's: that one's session expiry tells."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


_registration: dict[str, ControlPlane] = {}
# How long a worker waits for its name to be free in ZooKeeper (a dead process's
# session lasts up to its timeout, plus a restarted server's time to expire it).
REGISTRATION_WAIT_S = 120.0
_worker: dict[str, Any] = {}


@worker_init.connect
def _keep_worker(sender: Any = None, **_: Any) -> None:
    _worker["controller"] = sender
    queues = sender.app.amqp.queues.consume_from if sender is not None else None
    if "spark" in (queues or {}):
        _start_worker_jvm(sender.hostname)


def _start_worker_jvm(worker: str) -> None:
    """A Spark worker's JVM, started and kept up by this main process for its pool
    processes, which attach to it: a pool process killed with its batch leaves the
    JVM warm for its replacement (docs/adr/0007). On a cluster its application is
    named after the worker (``bpconsole spark-1@host``), so that the cluster manager's
    pages say which console worker holds which executors."""
    from sparkjobs import shared_jvm
    from sparkjobs.session import spark_conf

    path = Path(settings.VAR_DIR) / "run" / f"{shared_jvm.FILE_PREFIX}{os.getpid()}.json"
    # Set before the pool is forked, so every pool process inherits it.
    os.environ[shared_jvm.INFO_ENV] = str(path)
    jvm = shared_jvm.WorkerJvm(
        spark_conf(app_name=f"bpconsole {worker}"),
        path,
        warm_up_rounds=settings.BPCONSOLE_SPARK_WARM_UP_ROUNDS,
    )
    jvm.start()
    _worker["jvm"] = jvm


def _worker_running() -> bool:
    """Is this Celery worker still running (not stopping)?

    A worker whose consumer died (kombu fails to restore unacked messages on a Redis
    that is gone: "Unrecoverable error") stops, and a threads pool waits for its tasks:
    a driver, which runs as long as its run, would keep the dead worker up for days.
    Seeing the stop, the driver returns; the worker exits and its supervisor starts it
    again."""
    controller = _worker.get("controller")
    blueprint = getattr(controller, "blueprint", None)
    return blueprint is None or blueprint.state in (None, RUN)


def _report_tail(run_id: int, report: BatchReport) -> None:
    """A tail has every marker: tell the control side under ``adjust/<version>/tails``.
    If this is lost (the worker dies now), the driver reports from the ledger."""
    control = _registration.get("control")
    aligned = report.aligned
    if control is None or aligned is None:
        return
    try:
        control.report_tail(
            str(run_id),
            aligned.version,
            aligned.instance,
            {"by": socket.gethostname(), "pid": os.getpid()},
        )
    except Exception:
        log.warning("run %s: could not report tail %s", run_id, aligned.instance, exc_info=True)


@worker_ready.connect
def _register_worker(sender: Any = None, **_: Any) -> None:
    name = getattr(sender, "hostname", None) or f"{socket.gethostname()}-{os.getpid()}"
    try:
        control = ControlPlane.connect(settings.ZK_HOSTS)
        # What it consumes says what it is: placement only picks Spark workers.
        queues = sorted(sender.app.amqp.queues.consume_from or {}) if sender else []
        # How many batches it runs at once: the driver sends no more of a stage's
        # fusable batches than the Spark workers can run (orchestrator/run/dispatch.py).
        concurrency = int(getattr(getattr(sender, "controller", None), "concurrency", 0) or 1)
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "name": name,
            "queues": queues,
            "concurrency": concurrency,
            # Which worker is the newest: an elastic pool gives that one back first.
            "started": time.time(),
        }
        _registration["control"] = control
    except Exception:
        log.warning("could not register worker %s in ZooKeeper", name, exc_info=True)
        return
    # A worker started again right after it was killed waits, beside its work, for
    # ZooKeeper to expire its dead process's session, which still holds its name.
    threading.Thread(
        target=_register_when_free,
        args=(control, name, info),
        name="zk-registration",
        daemon=True,
    ).start()


def _register_when_free(control: ControlPlane, name: str, info: dict[str, Any]) -> None:
    try:
        control.register_worker_when_free(
            name.replace("@", "-"), info, timeout_s=REGISTRATION_WAIT_S
        )
    except Exception:
        log.warning("could not register worker %s in ZooKeeper", name, exc_info=True)


@worker_shutdown.connect
def _unregister_worker(**_: Any) -> None:
    # Each driver sees the worker stopping and gives its run up, its lock released.
    left = DRIVERS.join()
    if left:
        log.warning("runs %s: their drivers did not stop in time", left)
    control = _registration.pop("control", None)
    if control is not None:
        control.close()
    jvm = _worker.pop("jvm", None)
    if jvm is not None:
        jvm.stop()


@worker_process_init.connect
def _beat_from_a_spark_worker(**_: Any) -> None:
    # A Spark worker's process reports in from its start, so /healthz knows it is there
    # before its first batch starts a JVM (the queues chosen with -Q are the parent's,
    # inherited by the pool's processes).
    if "spark" in (current_app.amqp.queues.consume_from or {}):
        from orchestrator.services import heartbeat

        jvm = _worker.get("jvm")
        if jvm is not None:
            jvm.in_pool_process()

        heartbeat.start()
