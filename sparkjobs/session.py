"""The one place a SparkSession is built (one per worker process)."""

from __future__ import annotations

import os
from functools import cache

from pyspark.sql import SparkSession

# Spark binds its driver to the machine's hostname by default; on a single machine
# that may not resolve, and a console must not listen beyond loopback unasked.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@cache
def spark_session(master: str | None = None, app_name: str = "bpconsole") -> SparkSession:
    master = master or os.environ.get("SPARK_MASTER", "local[*]")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", os.environ.get("SPARK_SHUFFLE_PARTITIONS", "4"))
        .config("spark.sql.session.timeZone", "UTC")
        # Partial aggregates collect sets per (segment, key): keep them in the hash
        # aggregate instead of falling back to sorting every row past 128 groups.
        .config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "100000")
        .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "1g"))
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    return builder.getOrCreate()
