"""Launcher start time: services up (PostgreSQL, Redis, ZooKeeper), nothing installed.

    .venv/bin/python bench/bench_launcher.py [--runs 5]

"cold" starts from an empty state folder (initdb included); "warm" restarts on an
existing one (what every `make run` after the first does). Target: cold under 20 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.services.launcher import Launcher

NO_SERVICES = {"DATABASE_URL": "", "REDIS_URL": "", "ZK_HOSTS": ""}


def timed_start(var_dir: Path) -> tuple[float, dict[str, float]]:
    launcher = Launcher(var_dir, environ=NO_SERVICES)
    began = time.monotonic()
    launcher.start()
    total = time.monotonic() - began
    per_service = dict(launcher.start_seconds)
    launcher.stop()
    return total, per_service


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bpconsole-bench-") as tmp:
            total, detail = timed_start(Path(tmp))
            cold.append(total)
            print(f"cold {total:5.2f} s  {detail}")
            total, detail = timed_start(Path(tmp))
            warm.append(total)
            print(f"warm {total:5.2f} s  {detail}")
    for name, values in (("cold", cold), ("warm", warm)):
        print(
            f"{name}: median {statistics.median(values):.2f} s, "
            f"max {max(values):.2f} s over {len(values)} runs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
