"""The ZooKeeper control plane of a run: flags, state, routes, signals, locks, workers.

Everything a live run coordinates through ZooKeeper goes through :class:`ControlPlane`,
one object over one kazoo client, so callers hold a single handle. Its parts live in
modules named for what they own, and the znode layout (docs/architecture.md, "The control
plane") is written down here, in one place::

    <root>/runs/<run>/flags/<node>        exists = the node is flagged (persistent)
    <root>/runs/<run>/state/<node>        JSON: level, watermarks, rate coefficient, speeds
    <root>/runs/<run>/taskstate/<task>    JSON: state a target wrote after applying a signal
                                          (these three: ``node_state``)
    <root>/runs/<run>/routes/<node>       JSON {"epoch": e, "routes": {...}}, epoch-fenced
    <root>/runs/<run>/epoch               the run's epoch, a decimal integer (``routes``)
    <root>/runs/<run>/taskmessage/        FIFO of stepwise signals (kazoo Queue recipe)
    <root>/runs/<run>/commands/           FIFO of operators' commands (both ``queues``)
    <root>/runs/<run>/adjust/<version>/   hot-rescale records (``rescale_rounds``)
    <root>/runs/<run>/driver              kazoo Lock: one live driver/balance loop per run
    <root>/workers/<name>                 ephemeral JSON: host, pid, queues, started
                                          (these two: ``workers``)
    <root>/spark/asked/<run>              JSON {"extra", "reason"}: Spark workers a run
                                          asks of the elastic pool beyond its base
    <root>/spark/pool                     ephemeral JSON {"base", "maximum", "extra"}:
                                          what the live pool allows and keeps (both
                                          ``spark_pool``)

The session (connection state, JSON encoding, the base error) is ``session``; paths and
the shared reads, writes and watches are ``znodes``. Readers learn of changes by
watching, never by polling; watch and connection-state callbacks run in kazoo's threads
and must return quickly (set an event, enqueue work).

Imports no Django: the default root comes from settings only when no root is given, so
scripts and benchmarks use it with a bare ``KazooClient``.
"""

from __future__ import annotations

from orchestrator.services.spark_pool import PoolState
from orchestrator.zk.node_state import NodeStateZnodes
from orchestrator.zk.queues import QueueZnodes
from orchestrator.zk.rescale_rounds import RescaleZnodes
from orchestrator.zk.routes import RouteZnodes, StaleEpochError
from orchestrator.zk.session import (
    DEFAULT_ROOT,
    ControlPlaneError,
    SessionGuard,
    decode,
    default_root,
    encode,
)
from orchestrator.zk.spark_pool import SparkPoolZnodes
from orchestrator.zk.workers import WorkerNameTakenError, WorkerZnodes
from orchestrator.zk.znodes import Subscription


class ControlPlane(
    NodeStateZnodes, RouteZnodes, QueueZnodes, RescaleZnodes, WorkerZnodes, SparkPoolZnodes
):
    """The znodes of every run under one root, through one kazoo client.

    Pass a started client (the caller keeps ownership) or use :meth:`connect` (the
    control plane owns the client and :meth:`close` stops it). Every method is safe to
    call from several threads: kazoo's client is.
    """


__all__ = [
    "DEFAULT_ROOT",
    "ControlPlane",
    "ControlPlaneError",
    "PoolState",
    "SessionGuard",
    "StaleEpochError",
    "Subscription",
    "WorkerNameTakenError",
    "decode",
    "default_root",
    "encode",
]
