"""A result collected while the Spark JVM dies is refused, never returned in part
(pyspark alone hands back the rows received so far as if they were all)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]

KILLED_MID_TRANSFER = """
import signal, sys, threading, time
from pyspark import SparkContext
from sparkjobs.session import collect_all, collect_arrow, spark_session

collect, rows = {"rows": (collect_all, 1_000_000), "arrow": (collect_arrow, 4_000_000)}[sys.argv[1]]
spark = spark_session(master="local[1]")
frame = spark.range(rows).selectExpr("id", "cast(id as string) as s")
for _ in range(2):
    began = time.monotonic()
    assert len(collect(frame)) == rows
    whole = time.monotonic() - began
# Most of a collect is the transfer and unpickling of its rows: 40% into it, the JVM is
# still sending rows (pyspark alone then returned 1.2 of 2 million rows).
jvm = SparkContext._gateway.proc
threading.Timer(whole * 0.4, lambda: jvm.send_signal(signal.SIGKILL)).start()
try:
    got = collect(frame)
except Exception as error:
    print("refused", type(error).__name__, flush=True)
else:
    print("returned", len(got), flush=True)
"""


@pytest.mark.parametrize("collect", ["rows", "arrow"])
def test_a_result_cut_short_by_a_dying_jvm_is_refused(collect: str) -> None:
    root = Path(__file__).resolve().parents[2]
    outcome = subprocess.run(
        [sys.executable, "-c", KILLED_MID_TRANSFER, collect],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    last = outcome.stdout.strip().splitlines()[-1:]
    assert last and last[0].startswith("refused"), (outcome.stdout, outcome.stderr[-2000:])
