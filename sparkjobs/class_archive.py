"""A class-data-sharing archive for the Spark driver JVM: a new worker JVM starts sooner.

A Spark worker process whose JVM died (or a pool child that was killed) starts a new
one before its next batch. Measured on the project's 2-core machine, a cold JVM took
7.8 to 9.4 s to a SparkSession and 7.9 to 8.1 s more for its first aggregate batch (the
same batch takes 1 to 2 s warm): much of it loading and verifying Spark's classes.
With the classes of a representative batch archived (JDK's dynamic AppCDS), the same
cold start took 4.0 to 4.8 s and 4.3 to 5.0 s: recovery from a killed worker is bounded
by this time (docs/runtime.md).

The archive depends only on the JDK and on Spark's jars, so one archive per
(pyspark version, java) is kept in the virtualenv and shared by every stack that runs
from it. ``make setup`` builds it (``python -m sparkjobs.class_archive``); when it is
missing or does not fit the JVM (another JDK), the JVM starts as it would without it.
``BPCONSOLE_SPARK_CDS``: the archive's path, or ``off``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pyspark

SETTING = "BPCONSOLE_SPARK_CDS"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found else None


def archive_path() -> Path | None:
    """Where this JDK's and this Spark's archive is (built or not); None when off."""
    setting = os.environ.get(SETTING, "")
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    java = _java()
    if java is None:
        return None
    stat = java.stat()
    # The JDK's identity: an upgraded JDK at the same path has another size or time.
    jdk = hashlib.sha256(f"{java}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return Path(sys.prefix) / "share" / "bpconsole" / f"spark-{pyspark.__version__}-{jdk}.jsa"


def driver_java_options() -> str | None:
    """The driver JVM's options that use the archive, when it has been built."""
    path = archive_path()
    if path is None or not path.is_file():
        return None
    # -Xshare:auto: an archive that does not fit this JVM is skipped, never an error;
    # -Xlog:cds=off keeps the JVM from saying so on every start.
    return f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _warm_up(folder: Path) -> None:
    """Run, on generated records, the batches a worker runs and the batch job: their
    classes are archived."""
    from sparkjobs.measures import Grouping
    from sparkjobs.plain_job import batch_grouped
    from sparkjobs.session import spark_session
    from sparkjobs.warm_up import one_round

    one_round(folder)
    paths = sorted(str(path) for path in folder.glob("seg-*.jsonl"))
    grouping = Grouping.of({})  # the key form's defaults: the reference pipeline's
    if grouping is None:
        raise ValueError("the key form's defaults name no grouping")
    batch_grouped(spark_session(), paths, "jsonl", grouping)


def build(path: Path) -> Path:
    """Start a driver JVM that dumps its classes at exit, run the warm-up, stop it."""
    from pyspark import SparkContext

    from sparkjobs.session import spark_session

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    # This process must not load an older archive while it dumps a new one.
    os.environ[SETTING] = "off"
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options '-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"
        " -Xlog:cds+dynamic=off' pyspark-shell"
    )
    with tempfile.TemporaryDirectory() as folder:
        _warm_up(Path(folder))
    spark_session().stop()
    # The gateway JVM exits when its standard input closes; the archive is written then.
    process = SparkContext._gateway.proc  # type: ignore[union-attr]
    process.stdin.close()
    process.wait(timeout=300)
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class archive at {partial}")
    partial.replace(path)
    return path


def ensure() -> Path | None:
    """The archive for this JDK and Spark, built first if it is missing; None when off."""
    path = archive_path()
    if path is None or path.is_file():
        return path
    return build(path)


def main() -> int:
    path = ensure()
    print(f"class archive for Spark's driver JVM: {path or SETTING + '=off'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
