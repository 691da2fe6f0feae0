"""A tiny Spark job that proves Spark runs: ``python -m sparkjobs.probe``.

Prints one JSON line ``{"ok": true, "detail": ..., "local": ...}`` and exits 0, or
exits 1 with the reason: ``detail`` names Spark's version or the error's type, never an
address (it may be shown on ``/healthz``); ``local`` says where the master is, or the
error's own message, for the server's shell. Run as its own process so a health check
never loads a JVM into the web server.
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
        detail = f"Spark {spark.version} ran a job"
        master = spark.sparkContext.master
        spark.stop()
    except Exception as exc:  # noqa: BLE001 - the failure is the answer
        answer = {
            "ok": False,
            "detail": type(exc).__name__,
            "local": f"{type(exc).__name__}: {exc}",
        }
        print(json.dumps(answer))
        return 1
    took = time.monotonic() - began
    print(json.dumps({"ok": True, "detail": f"{detail} in {took:.1f} s", "local": f"on {master}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
