"""The Spark session's settings that shape a batch's cost outside its job."""

from __future__ import annotations

from typing import Any

import py4j.clientserver
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
