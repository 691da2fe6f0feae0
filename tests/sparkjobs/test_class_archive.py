"""A worker's new Spark JVM loads Spark's classes from the class-data-sharing archive
(sparkjobs/class_archive.py), and one that does not fit is skipped, never an error; the
options of ``SPARK_JAVA_OPTIONS`` come after the archive's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkjobs import class_archive
from sparkjobs.session import LATER_C2

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]

ONE_BATCH = """
from pyspark.sql import functions as F
from sparkjobs.session import collect_all, spark_session

spark = spark_session(master="local[1]")
rows = collect_all(spark.range(1000).groupBy((F.col("id") % 7).alias("k")).count())
print("keys", len(rows), flush=True)
"""


def _in_a_new_jvm(code: str, **env: str) -> str:
    """Run ``code`` in a new process and Spark JVM with ``env`` added; its stdout."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ.pop("PYSPARK_SUBMIT_ARGS", None)
    outcome = subprocess.run(
        [sys.executable, "-c", code],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    return outcome.stdout


def _batch_in_a_new_jvm(tmp_path: Path, archive: str) -> tuple[str, str]:
    """Run one batch in a new process and JVM; its stdout and the JVM's class-load log."""
    log = tmp_path / "classes.log"
    # Read by every JVM besides its command line: where each class was loaded from.
    out = _in_a_new_jvm(
        ONE_BATCH,
        **{
            class_archive.SETTING: archive,
            "JAVA_TOOL_OPTIONS": f"-Xlog:class+load=info:file={log}",
        },
    )
    return out, log.read_text()


def _loaded_from(log: str, name: str) -> str:
    line = next(line for line in log.splitlines() if f" {name} source:" in line)
    return line.split(" source: ", 1)[1]


def test_a_new_spark_jvm_loads_sparks_classes_from_the_archive(tmp_path: Path) -> None:
    archive = class_archive.ensure()
    assert archive is not None and archive.is_file()

    out, log = _batch_in_a_new_jvm(tmp_path, str(archive))

    assert "keys 7" in out
    # "top": the dynamic archive layered over the JDK's own, i.e. ours.
    assert _loaded_from(log, "org.apache.spark.SparkContext") == "shared objects file (top)"
    assert _loaded_from(log, "org.apache.spark.sql.Dataset") == "shared objects file (top)"


def test_an_archive_that_does_not_fit_the_jvm_is_skipped(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.jsa"
    foreign.write_bytes(b"not a class archive" * 100)

    out, log = _batch_in_a_new_jvm(tmp_path, str(foreign))

    assert "keys 7" in out
    assert _loaded_from(log, "org.apache.spark.SparkContext").endswith(".jar")


def test_the_archive_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(class_archive.SETTING, "off")
    assert class_archive.archive_path() is None
    assert class_archive.driver_java_options() is None


def test_one_archive_per_jdk_and_spark_version_in_the_virtualenv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(class_archive.SETTING, raising=False)
    path = class_archive.archive_path()
    assert path is not None
    assert path.parent == Path(sys.prefix) / "share" / "bpconsole"
    import pyspark

    assert path.name.startswith(f"spark-{pyspark.__version__}-")


READ_BACK = """
from sparkjobs.session import spark_session

spark = spark_session(master="local[1]")
jvm = spark.sparkContext._jvm
system = jvm.java.lang.System
hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
    jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
)
print(
    system.getProperty("bpconsole.probe"),
    hotspot.getVMOption("Tier4InvocationThreshold").getValue(),
    spark.conf.get("spark.driver.extraJavaOptions"),
)
"""


def test_spark_java_options_follow_the_archive_s_in_the_driver_jvm() -> None:
    mine = "-Dbpconsole.probe=yes -XX:Tier4InvocationThreshold=7000"
    out = _in_a_new_jvm(READ_BACK, SPARK_JAVA_OPTIONS=f" {mine} ")
    probe, tier4, options = out.split(maxsplit=2)
    # The JVM has the property, and the class archive's options are still there
    assert probe == "yes"
    assert options.endswith(f"{mine}\n")
    # The later top-tier compiles are there too, and the user's own setting wins
    assert LATER_C2 in options
    assert tier4 == "7000"
    archive = class_archive.driver_java_options()
    if archive is not None:
        assert options.startswith(archive + " ")
