"""The one place a SparkSession is built (one per worker process)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, Row, SparkSession

from sparkjobs import class_archive, shared_jvm
from sparkjobs.task_settings import even_split_bytes, one_task_bytes, task_bytes

# Spark binds its driver to the machine's hostname by default; on a single machine
# that may not resolve, and a console must not listen beyond loopback unasked.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# The JIT's top tier (C2) compiles a method once it has run 10 times as often as the
# JDK's default asks. A new JVM's first minute is mostly code that runs a few thousand
# times (Spark's planning, its generated code's first batches), and on 2 cores C2's
# compiles of it took the CPU the batch needed. Measured (docs/benchmarks.md, "Chaos",
# 2026-11-27): a new JVM's session and first batch 2.5 s sooner, large batches as fast
# (loops that run millions of times still reach C2 within the first batch).
# ``SPARK_JAVA_OPTIONS`` comes after, so a cluster can set its own.
LATER_C2 = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4CompileThreshold=150000"
    " -XX:Tier4BackEdgeThreshold=400000"
)

# A JVM that runs out of memory is ended at once, whichever thread's allocation failed
# (a task's, or the py4j thread planning a query): half-alive, it would fail every
# other pipeline's batches it serves. The worker records the batch it ran and starts
# a new JVM for the next one (orchestrator/worker/batch.py).
EXIT_ON_OUT_OF_MEMORY = "-XX:+ExitOnOutOfMemoryError"
#: How a JVM that ran out of memory ends: ExitOnOutOfMemoryError's code, or Spark's
#: own when a task's OutOfMemoryError reaches its handler first (SparkExitCode.OOM).
OUT_OF_MEMORY_EXIT_CODES = frozenset({3, 52})


@cache
def spark_session(master: str | None = None, app_name: str = "bpconsole") -> SparkSession:
    conf = spark_conf(master, app_name)
    path = shared_jvm.info_path()
    if path is not None:
        # A pool process of a Spark worker: the worker's JVM, not one of its own.
        info = shared_jvm.wait_for_live(path, unlike=_use.dead_jvm)
        shared_jvm.attach(info, conf)
        _use.shared_jvm = info.pid
    return SparkSession.builder.config(conf=conf).getOrCreate()


def spark_conf(master: str | None = None, app_name: str = "bpconsole") -> SparkConf:
    """Every setting of this project's Spark driver, for a JVM started by this process
    or by a Spark worker's main process for its pool (``sparkjobs/shared_jvm.py``)."""
    master = master or os.environ.get("SPARK_MASTER", "local[*]")
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName(app_name)
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "4"))
        .set("spark.sql.session.timeZone", "UTC")
        # Partial aggregates collect sets per (segment, key): keep them in the hash
        # aggregate instead of falling back to sorting every row past 128 groups.
        .set("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "100000")
        .set("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "1g"))
        # PySpark records the Python call site of every function call in the JVM, for
        # error messages: six more Py4J round trips per call, 1,400 of a batch's 2,200,
        # while both cores wait for the job to start. Our errors name their node.
        .set("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    extra = os.environ.get("SPARK_JAVA_OPTIONS", "").strip()
    java_options = " ".join(
        o
        for o in (class_archive.driver_java_options(), LATER_C2, EXIT_ON_OUT_OF_MEMORY, extra)
        if o
    )
    if java_options:
        conf.set("spark.driver.extraJavaOptions", java_options)
    if master.startswith("local"):
        conf.set("spark.driver.bindAddress", "127.0.0.1").set("spark.driver.host", "127.0.0.1")
        # The driver's RPC and block manager listen on loopback, where any local user
        # can connect: each JVM authenticates them with a secret it generates itself and
        # that never leaves it (Spark's SecurityManager, local mode). A cluster's secret
        # is the cluster's configuration (spark-defaults.conf, docs/security.md).
        conf.set("spark.authenticate", "true")
    else:
        _cluster_share(conf)
        if extra:
            conf.set("spark.executor.extraJavaOptions", extra)
    return conf


def _cluster_share(conf: SparkConf) -> None:
    """Each Spark worker process is one application on the cluster: cap its cores.

    A standalone master gives an application every free core unless told otherwise, so
    the first worker's session takes the whole cluster and every other worker's first job
    waits for ever ("Initial job has not accepted any resources"). ``SPARK_CORES_MAX``
    is one application's share; ``SPARK_EXECUTOR_MEMORY`` the memory of each of its
    executors (Spark's default, 1g, is kept when unset). An executor takes as many of the
    share's cores as its worker has free, so a share larger than one worker still fits.
    """
    cores = os.environ.get("SPARK_CORES_MAX")
    if cores:
        conf.set("spark.cores.max", cores)
    memory = os.environ.get("SPARK_EXECUTOR_MEMORY")
    if memory:
        conf.set("spark.executor.memory", memory)


def operator_session(file_sizes: Sequence[int] = ()) -> SparkSession:
    """The session operator batches run in: the worker's SparkContext with its own SQL
    settings (the batch job keeps Spark's defaults, which suit one large file best),
    its task size set for a batch of files of ``file_sizes``.

    A batch is many segment files of a few MB, cut into tasks of equal input, as many
    as the cores or a multiple of them, none much over ``BPCONSOLE_SPARK_TASK_MB`` (128
    MB, Spark's own bound). At Spark's default a 360 MB batch made three tasks for two
    cores, one core idle for a third of the job; at a task per 8 MB segment the batch's
    64 tasks each built the partial sets of their own records, and the exchange
    carried them all: the aggregate's batch of 512 MB took 5.9 s in 64 tasks against
    5.2 s in 2 or 6 (docs/benchmarks.md, "tasks of equal input").
    """
    spark = _operator_session()
    bound = even_split_bytes(
        file_sizes,
        cores=spark.sparkContext.defaultParallelism,
        most=task_bytes(),
        open_cost=OPEN_COST_BYTES,
    )
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(bound))
    return spark


def in_one_task(frame: DataFrame, files: Iterable[Path]) -> DataFrame:
    """``frame``, read from ``files``, as one partition when they hold at most
    ``BPCONSOLE_SPARK_ONE_TASK_MB`` (2 MB; 0 never).

    One partition satisfies any grouping's distribution, so Spark plans an aggregation
    over it with no exchange: the aggregate's two stages of a few tasks each (read and
    build each task's sets; unite them) become one task. The aggregate's batch of 8
    segments on a warm JVM (``bench/bench_operator_job.py --plans``, on the generator's
    input and on bench_peers.py's) is faster in one task up to 2 MB and slower from
    4 MB, so larger batches keep their parallel plan (a cluster's executors may put the
    line elsewhere). A record operator's small batch (no exchange) is read in one task
    too, instead of one per core.
    """
    return frame.coalesce(1) if sum(f.stat().st_size for f in files) <= one_task_bytes() else frame


# What Spark counts for opening a file when it packs files into tasks (its default),
# set here so that operator_session's split counts the same.
OPEN_COST_BYTES = 4 * 2**20


@cache
def _operator_session() -> SparkSession:
    session = spark_session().newSession()
    # Past 32 paths Spark lists a batch's files in a Spark job of its own, which costs
    # as much as a small batch; a batch's paths are files, listed in a few milliseconds.
    session.conf.set("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000")
    # operator_session's bound alone decides the tasks, not also Spark's share per core.
    session.conf.set("spark.sql.files.openCostInBytes", str(OPEN_COST_BYTES))
    session.conf.set("spark.sql.files.minPartitionNum", "1")
    return session


@dataclass
class _JvmUse:
    """Results this process has collected on its current JVM: none yet means a new JVM,
    whose code Spark's first jobs still run interpreted (the class archive spares only
    loading), or a new pool process, whose first batch may be a killed one's re-run. In
    a Spark worker's pool process, also the worker's JVM it attached to, and the one it
    saw die (not to be attached to again)."""

    collected: int = 0
    shared_jvm: int | None = None
    dead_jvm: int | None = None


_use = _JvmUse()


def has_collected() -> bool:
    """Has a job of this process on its current Spark JVM returned its result yet?"""
    return _use.collected > 0


def jvm_started() -> bool:
    """Has this process started its Spark JVM (a worker starts it at its first batch),
    or attached to its worker's?"""
    if _use.shared_jvm is not None:
        return True
    return getattr(SparkContext._gateway, "proc", None) is not None


def jvm_exit_code() -> int | None:
    """The exit code of this process's Spark JVM once it has died; None while it runs
    (or before the first session started it)."""
    if _use.shared_jvm is not None:
        return _shared_exit_code(_use.shared_jvm)
    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    return None if process is None else process.poll()


def _shared_exit_code(pid: int) -> int | None:
    """The worker's main process reaps its JVM and records how it ended (it looks every
    0.2 s); a JVM gone whose end is not recorded within a second reads as -1, unknown."""
    if shared_jvm.alive(pid):
        return None
    path = shared_jvm.info_path()
    deadline = time.monotonic() + 1.0
    while path is not None and time.monotonic() < deadline:
        info = shared_jvm.read_info(path)
        if info is not None and info.previous_pid == pid and info.previous_code is not None:
            return info.previous_code
        time.sleep(0.05)
    return -1


def restart_if_dead() -> int | None:
    """Forget a session whose JVM died, so the next call starts a new one.

    pyspark caches the gateway, context and session process-wide and never checks them:
    after the JVM died every batch failed at once on a refused connection. Returns the
    dead JVM's exit code, or None when it was alive (nothing changed).
    """
    code = jvm_exit_code()
    if code is None:
        return None
    context = SparkContext._active_spark_context
    gateway = SparkContext._gateway
    # Releasing the Python side of a dead JVM's context and gateway fails on its refused
    # connection part-way; what is left is dropped with the references below.
    with contextlib.suppress(Py4JError, OSError):
        if context is not None:
            context.stop()
    with contextlib.suppress(Py4JError, OSError):
        if gateway is not None:
            gateway.shutdown()
    SparkContext._active_spark_context = None
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    spark_session.cache_clear()
    _operator_session.cache_clear()
    _use.collected = 0
    _use.dead_jvm, _use.shared_jvm = _use.shared_jvm, None
    return code


def tag_jobs(spark: SparkSession) -> None:
    """Tag this thread's next Spark jobs with this process: if it dies, the next pool
    process on the worker's JVM cancels them (``shared_jvm.attach``)."""
    spark.sparkContext.addJobTag(shared_jvm.job_tag(os.getpid()))


def claim_jvm(spark: SparkSession) -> None:
    """Before a batch: tag this thread's jobs (``tag_jobs``), and stop the worker's JVM's
    warm-up if it still runs (``sparkjobs/warm_up.py``): the batch takes its cores."""
    tag_jobs(spark)
    if _use.shared_jvm is not None:
        shared_jvm.stop_warm_up(spark.sparkContext, _use.shared_jvm)


def collect_all(frame: DataFrame) -> list[Row]:
    """``frame.collect()``, but never a result cut short by the JVM dying under it.

    pyspark reads a collected result from a socket the JVM serves and takes the end of
    that stream for the end of the result: a JVM killed during the transfer handed back
    the rows sent so far as if they were all (2,621,439 rows of 3,000,000, silently; the
    chaos suite lost a batch's records that way with the run's coverage still exact).
    A dead JVM has closed its gateway as well, so one more call through it fails, and
    the caller sees Spark's failure instead of a short result."""
    rows = frame.collect()
    _alive_after_collect(frame)
    return rows


def collect_arrow(frame: DataFrame) -> pa.Table:
    """``frame.toArrow()``, with :func:`collect_all`'s guarantee. Many rows of a few
    columns come back as Arrow batches several times faster than as ``Row`` objects
    (a record job's lines: 270,000 in 1.3 s against 3.4 s)."""
    table = frame.toArrow()
    _alive_after_collect(frame)
    return table


def _alive_after_collect(frame: DataFrame) -> None:
    frame.sparkSession.sparkContext._jvm.java.lang.System.nanoTime()  # type: ignore[union-attr]
    _use.collected += 1
