"""A tiny Spark job that proves Spark runs: ``python -m sparkjobs.probe``.

Prints one JSON line ``{"ok": true, "detail": ...}`` and exits 0, or exits 1 with the
reason. Run as its own process so a health check never loads a JVM into the web server.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    began = time.monotonic()
    try:
        from sparkjobs.session import spark_session

        spark = spark_session(app_name="bpconsole-health")
        total = spark.range(1000).selectExpr("sum(id) AS s").collect()[0]["s"]
        if total != 499500:
            raise RuntimeError(f"sum of 0..999 came back as {total}")
        detail = f"Spark {spark.version} ({spark.sparkContext.master}) ran a job"
        spark.stop()
    except Exception as exc:  # noqa: BLE001 - the failure is the answer
        print(json.dumps({"ok": False, "detail": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"ok": True, "detail": f"{detail} in {time.monotonic() - began:.1f} s"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
