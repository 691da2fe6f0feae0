"""``SPARK_JAVA_OPTIONS`` reaches the Spark driver JVM, beside the class archive's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkjobs import class_archive

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

READ_BACK = """
from sparkjobs.session import spark_session

spark = spark_session(master="local[1]")
system = spark.sparkContext._jvm.java.lang.System
print(system.getProperty("bpconsole.probe"), spark.conf.get("spark.driver.extraJavaOptions"))
"""


def test_the_setting_s_options_are_the_driver_jvm_s() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_JAVA_OPTIONS": " -Dbpconsole.probe=yes "}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run(
        [sys.executable, "-c", READ_BACK],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe, options = done.stdout.split()[0], done.stdout.split(maxsplit=1)[1]
    # The JVM has the property, and the class archive's options are still there
    assert probe == "yes"
    assert options.endswith("-Dbpconsole.probe=yes\n")
    archive = class_archive.driver_java_options()
    if archive is not None:
        assert options.startswith(archive + " ")
