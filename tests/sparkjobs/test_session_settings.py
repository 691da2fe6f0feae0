"""The Spark session's settings that shape a batch's cost outside its job."""

from __future__ import annotations

from typing import Any

import py4j.clientserver
import py4j.protocol
import pytest
from pyspark.sql import functions as F


def test_building_a_plan_records_no_python_call_sites_in_the_jvm(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark's DataFrame debugging sends each function call's Python call site to the
    JVM (PySparkCurrentOrigin): round trips while the cores wait for the job."""
    from sparkjobs.session import operator_session

    session = operator_session()
    assert session.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    sent: list[str] = []
    real = py4j.clientserver.JavaClient.send_command

    def send(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(command)
        return real(self, command, *args, **kwargs)

    monkeypatch.setattr(py4j.clientserver.JavaClient, "send_command", send)
    frame = session.range(3).select(F.when(F.col("id") > 1, F.lit("x")).alias("x"))
    assert frame.columns == ["x"]
    assert sent, "the plan was built in the JVM"
    assert not any("PySparkCurrentOrigin" in command for command in sent)


def _rpc_client_reaches_the_driver(spark: Any, *, authenticate: bool) -> bool:
    """Whether an RPC client (Spark's own, in client mode) set up an endpoint reference on
    the driver's RPC port, with or without Spark's authentication. An authenticating
    client in this JVM uses the JVM's own secret (Spark keeps it in the user's
    credentials), so it stands for whoever holds the secret; the other for anyone else."""
    context = spark.sparkContext
    jvm = context._jvm
    port = context.getConf().get("spark.driver.port")
    security = jvm.org.apache.spark.SecurityManager
    conf = jvm.org.apache.spark.SparkConf(False)
    conf.set("spark.authenticate", "true" if authenticate else "false")
    conf.set("spark.rpc.askTimeout", "10s")
    manager = security(
        conf,
        getattr(security, "$lessinit$greater$default$2")(),
        getattr(security, "$lessinit$greater$default$3")(),
    )
    client = jvm.org.apache.spark.rpc.RpcEnv.create("probe", "127.0.0.1", 0, conf, manager, True)
    try:
        client.setupEndpointRefByURI(f"spark://BlockManagerMaster@127.0.0.1:{port}")
    except py4j.protocol.Py4JJavaError:
        return False
    finally:
        client.shutdown()
    return True


def test_the_drivers_rpc_refuses_a_client_without_the_secret(spark: Any) -> None:
    """The driver listens on loopback, where any local user can connect: its RPC and
    block manager authenticate every client (spark.authenticate)."""
    assert spark.sparkContext.getConf().get("spark.authenticate") == "true"
    assert _rpc_client_reaches_the_driver(spark, authenticate=True)
    assert not _rpc_client_reaches_the_driver(spark, authenticate=False)
