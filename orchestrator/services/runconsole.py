"""``make run``: services, migrations, first-run set-up, then the console's processes.

Starts the embedded services that are not configured, applies migrations, creates the
admin account and the reference pipeline when absent, then runs the Celery workers,
Celery beat, the ASGI server on 127.0.0.1:8000 and, when ``BPCONSOLE_SPARK_WORKERS_MAX``
is above ``BPCONSOLE_SPARK_WORKERS``, the elastic pool's process (:func:`elastic_workers`)
until Ctrl-C or SIGTERM, and stops all of it on the way out. Until then a process that
dies, one of those or an embedded service, is restarted in place with backoff
(``supervisor``), with a line on stdout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from orchestrator.services.embedded import ServiceError, die_with_parent
from orchestrator.services.launcher import PROJECT_ROOT, Launcher, var_dir_from_env
from orchestrator.services.supervisor import Supervisor
from sparkjobs import task_settings

STOP_GRACE_S = 20.0
# Each Spark worker holds a JVM of SPARK_DRIVER_MEMORY: a typo of 100 must not start 100.
MAX_SPARK_WORKERS = 16


class Stop(BaseException):
    """Raised from a signal handler to unwind into the clean-up path.

    A BaseException, as KeyboardInterrupt is: a signal can arrive while the supervisor
    is restarting a process, inside its ``except Exception`` for failed starts, which
    must not take Ctrl-C or SIGTERM for a failed start (the console then ran on)."""


@dataclass
class Child:
    """One of the console's processes: how to start it, and the running one."""

    name: str
    args: list[str]
    env: Mapping[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.args,
                env=dict(self.env),
                cwd=PROJECT_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
            )

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()


def _stop_on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


def _manage(args: list[str], env: Mapping[str, str]) -> None:
    subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), *args],
        check=True,
        env=dict(env),
        cwd=PROJECT_ROOT,
    )


def _spawn(name: str, args: list[str], env: Mapping[str, str], log: Path) -> Child:
    child = Child(name, args, env, log)
    child.start()
    return child


def _stop_children(children: list[Child]) -> None:
    running = [c.process for c in reversed(children) if c.process is not None]
    for process in running:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in running:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _celery_worker(python: str, queue: str, node: str, *pool: str) -> list[str]:
    """A Celery worker of the console's app taking ``queue`` as ``node``."""
    return [
        python,
        "-m",
        "celery",
        "-A",
        "orchestrator.celery",
        "worker",
        "-Q",
        queue,
        *pool,
        "-n",
        node,
        "--loglevel",
        "INFO",
    ]


def spark_worker_count(environ: Mapping[str, str]) -> int:
    """``BPCONSOLE_SPARK_WORKERS``, the number of Spark workers ``make run`` starts."""
    raw = environ.get("BPCONSOLE_SPARK_WORKERS", "1")
    # Length first: int() refuses more than 4,300 digits with an error of its own.
    if (
        not (raw.isascii() and raw.isdigit() and len(raw) <= 2)
        or not 1 <= int(raw) <= MAX_SPARK_WORKERS
    ):
        raise ServiceError(
            f"BPCONSOLE_SPARK_WORKERS={raw[:20]!r}{'...' if len(raw) > 20 else ''}: "
            f"a whole number from 1 to {MAX_SPARK_WORKERS}"
        )
    return int(raw)


def spark_worker_maximum(environ: Mapping[str, str], base: int) -> int:
    """``BPCONSOLE_SPARK_WORKERS_MAX``: how many Spark workers the runs' scale-outs may
    bring the pool to (default: the base count, no elastic workers); from the base to
    MAX_SPARK_WORKERS."""
    raw = environ.get("BPCONSOLE_SPARK_WORKERS_MAX", str(base))
    if (
        not (raw.isascii() and raw.isdigit() and len(raw) <= 2)
        or not base <= int(raw) <= MAX_SPARK_WORKERS
    ):
        raise ServiceError(
            f"BPCONSOLE_SPARK_WORKERS_MAX={raw[:20]!r}{'...' if len(raw) > 20 else ''}: "
            f"a whole number from BPCONSOLE_SPARK_WORKERS ({base}) to {MAX_SPARK_WORKERS}"
        )
    return int(raw)


def check_spark_settings(environ: Mapping[str, str]) -> None:
    """The Spark task sizes a batch will read (``sparkjobs/task_settings.py``), refused
    before anything starts rather than by the first batch."""
    try:
        task_settings.check(environ)
    except ValueError as error:
        raise ServiceError(str(error)) from None


def spark_workers(count: int, python: str, env: Mapping[str, str], logs: Path) -> list[Child]:
    """The Spark workers (not started), each a Celery worker of one pool process with a
    Spark JVM of its own (docs/adr/0007): a JVM that dies stops only its worker's
    batches, and the others go on while it comes back cold, as separate workers do on a
    cluster."""
    return [spark_worker(number, python, env, logs) for number in range(1, count + 1)]


def spark_worker(number: int, python: str, env: Mapping[str, str], logs: Path) -> Child:
    """The Spark worker numbered ``number`` (``spark@host``, then ``spark-2@host``...)."""
    suffix = "" if number == 1 else f"-{number}"
    return Child(
        f"spark worker{suffix}",
        _celery_worker(python, "spark", f"spark{suffix}@%h", "--concurrency", "1"),
        env,
        logs / f"celery-spark{suffix}.log",
    )


def elastic_workers(
    base: int, maximum: int, python: str, env: Mapping[str, str], logs: Path
) -> Child | None:
    """The elastic pool's process (not started): ``manage.py elastic_workers``, which
    starts Spark workers beyond the ``base`` ones as placed runs ask for them, up to
    ``maximum`` in all (``orchestrator/services/spark_pool.py``); None when the maximum
    is the base, so no run can be given a worker of its own."""
    if maximum <= base:
        return None
    return Child(
        "elastic Spark workers",
        [
            python,
            "manage.py",
            "elastic_workers",
            "--base",
            str(base),
            "--maximum",
            str(maximum),
        ],
        env,
        logs / "elastic-workers.log",
    )


def _demo(python: str, env: dict[str, str], var_dir: Path, logs: Path) -> Child:
    """The continuous demo: a run of the landing-demo pipeline (started unless one is
    going on) and a producer writing bursty, skewed records into its landing folder, so
    a newcomer sees backpressure build and be relieved without typing anything.
    ``BPCONSOLE_DEMO=0`` turns it off."""
    folder = var_dir / "inputs" / "landing-demo"
    _manage(["start_demo", "--folder", str(folder)], env)
    return _spawn(
        "demo producer",
        [
            python,
            "manage.py",
            "produce",
            "--to",
            f"folder:{folder}",
            "--rate",
            os.environ.get("BPCONSOLE_DEMO_RATE", "768KB/s"),
            "--pattern",
            "bursty-skewed",
            "--duration",
            "forever",
            "--file-mb",
            "0.25",
            "--branches",
            "task1,task2,task3",
        ],
        env,
        logs / "demo-producer.log",
    )


def main() -> int:
    # Every file the console and its children create (logs, inputs, segments, sinks,
    # schedules) is its user's only, whatever the shell's umask.
    os.umask(0o077)
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGINT, _stop_on_signal)
    var_dir = var_dir_from_env()
    host = os.environ.get("BPCONSOLE_HOST", "127.0.0.1")
    port = os.environ.get("BPCONSOLE_PORT", "8000")
    launcher = Launcher(var_dir)
    children: list[Child] = []
    try:
        # Settings a worker reads are refused before anything starts.
        spark_worker_total = spark_worker_count(os.environ)
        spark_worker_max = spark_worker_maximum(os.environ, spark_worker_total)
        check_spark_settings(os.environ)
        began = time.monotonic()
        endpoints = launcher.start()
        print(
            f"services up in {time.monotonic() - began:.1f} s: {endpoints.redacted()}", flush=True
        )
        env = {
            **os.environ,
            **endpoints.as_env(),
            "DJANGO_SETTINGS_MODULE": os.environ.get(
                "DJANGO_SETTINGS_MODULE", "webapp.settings.local"
            ),
            "BPCONSOLE_VAR_DIR": str(var_dir),
        }
        _manage(["migrate", "--noinput", "-v", "0"], env)
        _manage(["bootstrap"], env)
        logs = var_dir / "log"
        python = sys.executable
        children.append(
            _spawn(
                "control worker",
                _celery_worker(
                    python, "control", "control@%h", "--pool", "threads", "--concurrency", "8"
                ),
                env,
                logs / "celery-control.log",
            )
        )
        for worker in spark_workers(spark_worker_total, python, env, logs):
            worker.start()
            children.append(worker)
        children.append(
            _spawn(
                "celery beat",
                [
                    python,
                    "-m",
                    "celery",
                    "-A",
                    "orchestrator.celery",
                    "beat",
                    "--schedule",
                    str(var_dir / "celerybeat-schedule"),
                    "--loglevel",
                    "INFO",
                ],
                env,
                logs / "celery-beat.log",
            )
        )
        children.append(
            _spawn(
                "ASGI server",
                [
                    python,
                    "-m",
                    "daphne",
                    "-b",
                    host,
                    "-p",
                    port,
                    "--websocket_connect_timeout",
                    "30",
                    "webapp.asgi:application",
                ],
                env,
                logs / "asgi.log",
            )
        )
        if os.environ.get("BPCONSOLE_DEMO", "1") != "0":
            children.append(_demo(python, env, var_dir, logs))
        pool = elastic_workers(spark_worker_total, spark_worker_max, python, env, logs)
        if pool is not None:
            pool.start()
            children.append(pool)
        print(f"\nThe backpressure console is up: http://{host}:{port}/", flush=True)
        print(f"Logs: {logs}. Stop with Ctrl-C.", flush=True)
        supervisor = Supervisor()
        # Only what this console started itself: configured external services are
        # someone else's to keep up.
        for service in launcher.started:
            supervisor.watch(service)
        for child in children:
            supervisor.watch(child)
        supervisor.run()
    except Stop as stop:
        print(f"\n{stop}: stopping the console and its services...", flush=True)
        return 0
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(
            f"error: {' '.join(map(str, exc.cmd[1:3]))} failed (exit {exc.returncode})",
            file=sys.stderr,
        )
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _stop_children(children)
        launcher.stop()


if __name__ == "__main__":
    sys.exit(main())
