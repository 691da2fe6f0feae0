"""CSV and Parquet inputs against JSON lines: the same records, time per record.

    .venv/bin/python bench/bench_formats.py [--mb 256] [--rounds 3] [--seed 1] [--json]

One generated input (bench_peers.py's records: ``key``, ``value`` with four decimals,
``user``, a ``pad`` to about 150 bytes, 35% of the records on one of 243 keys), written
as JSON lines, then the same records as CSV (a header line) and as Parquet (``value`` a
DECIMAL(14,4) column, the rest strings, pyarrow's default row groups). Each format is
aggregated twice per round: by our live run (bench_runtime.py's throughput pipeline,
source -> 3 aggregators -> sink, 8 MB segments, one Spark worker), and by the batch job
(``run_pipeline --batch``'s ``batch_grouped``) in this process's SparkSession, both
computing the pipeline's stage in the key form as its grouping (``group_by: [key]`` and
six named measures: sparkjobs/key_form.py). Every result is checked against a
pure-Python computation over the JSON lines. After an untimed warm-up of each side on a
small input, ``--rounds`` rounds, the formats in an order that rotates each round.
Reported: median seconds per side and format, and each format's time per record over
JSON lines' (the target: at most 1.3 for the live run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# This script's own folder is first on sys.path.
from bench_peers import (  # noqa: E402
    SEGMENT_MB,
    Shape,
    _measured,
    compare,
    ledger_outcome,
    median,
    reference,
    write_input,
)
from bench_runtime import Stack, run_to_end, throughput_pipeline  # noqa: E402

FORMATS = ("jsonl", "csv", "parquet")
MB = 2**20


def as_formats(jsonl: Path) -> dict[str, Path]:
    """The JSON-lines file and the same records as CSV and as Parquet, beside it."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson
    import pyarrow.parquet as pq

    fields: list[pa.Field[Any]] = [
        pa.field("key", pa.string()),
        pa.field("value", pa.decimal128(14, 4)),
        pa.field("user", pa.string()),
        pa.field("pad", pa.string()),
    ]
    schema = pa.schema(fields)
    table = pjson.read_json(jsonl, parse_options=pjson.ParseOptions(explicit_schema=schema))
    csv_path, parquet_path = jsonl.with_suffix(".csv"), jsonl.with_suffix(".parquet")
    pcsv.write_csv(table, csv_path, pcsv.WriteOptions(quoting_style="none"))
    pq.write_table(table, parquet_path)
    return {"jsonl": jsonl, "csv": csv_path, "parquet": parquet_path}


def with_format(doc: Any, fmt: str) -> Any:
    doc = json.loads(json.dumps(doc))
    next(n for n in doc["nodes"] if n["kind"] == "source")["params"]["format"] = fmt
    return doc


def live(doc: Any, policy: dict[str, Any], fmt: str, path: Path) -> tuple[Any, dict[str, Any]]:
    run = run_to_end(with_format(doc, fmt), policy, None, input_path=str(path))
    outcome = ledger_outcome(run)
    return outcome.result, outcome.extra


def batch(params: Mapping[str, Any], fmt: str, path: Path) -> tuple[Any, dict[str, Any]]:
    from sparkjobs.measures import Grouping
    from sparkjobs.plain_job import batch_grouped
    from sparkjobs.session import spark_session

    grouping = Grouping.of(params)
    if grouping is None:
        raise SystemExit(f"the pipeline's stage names no valid grouping: {params}")
    result = batch_grouped(spark_session(), [str(path)], fmt, grouping)
    rows = {str(group[0]): _measured(values) for group, values in result.rows}
    return rows, {"malformed": result.malformed}


def formats(args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(243, 0.35, 150, 1000)
    folder = Path(tempfile.mkdtemp(prefix="bpconsole-formats-"))
    try:
        with Stack(spark_workers=1):
            doc, policy = throughput_pipeline(SEGMENT_MB)
            params = next(n for n in doc["nodes"] if n["kind"] == "operator")["params"]
            warm = as_formats(write_input(folder / "warmup", 16, shape, args.seed + 1, 8).whole)
            data = write_input(folder / "input", args.mb, shape, args.seed, 8)
            files = as_formats(data.whole)
            want = reference(data.whole)
            records = sum(row[0] for row in want.values())
            sides: dict[str, Callable[[str, Path], tuple[Any, dict[str, Any]]]] = {
                "live": lambda fmt, path: live(doc, policy, fmt, path),
                "batch": lambda fmt, path: batch(params, fmt, path),
            }
            for fmt, path in warm.items():
                for side in sides.values():
                    side(fmt, path)
            seconds: dict[str, dict[str, list[float]]] = {
                s: {f: [] for f in FORMATS} for s in sides
            }
            wrong: list[str] = []
            for round_ in range(args.rounds):
                order = FORMATS[round_ % 3 :] + FORMATS[: round_ % 3]
                for fmt in order:
                    for name, side in sides.items():
                        began = time.monotonic()
                        got, extra = side(fmt, files[fmt])
                        seconds[name][fmt].append(round(time.monotonic() - began, 2))
                        differs = compare(got, want)
                        if differs is None and extra.get("coverage", "exact") != "exact":
                            differs = f"coverage {extra['coverage']}"
                        if differs is not None:
                            wrong.append(f"{name} {fmt} round {round_ + 1}: {differs}")
            sizes = {fmt: round(path.stat().st_size / MB, 1) for fmt, path in files.items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    medians = {s: {f: median(v) for f, v in per.items()} for s, per in seconds.items()}
    return {
        "records": records,
        "file_mb": sizes,
        "rounds": args.rounds,
        "seconds": seconds,
        "median_s": medians,
        # Time per record of each format over JSON lines' (the same records).
        "per_record_vs_jsonl": {
            s: {f: round(m[f] / m["jsonl"], 3) for f in FORMATS} for s, m in medians.items()
        },
        "exact": not wrong,
        "wrong": wrong,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"records: {result['records']:,}; files MB: {result['file_mb']}; "
        f"rounds: {result['rounds']}; exact: {result['exact']} {result['wrong'] or ''}",
        "",
        "| side | " + " | ".join(f"{f} s (x jsonl)" for f in FORMATS) + " |",
        "|---|---|---|---|",
    ]
    for side, per in result["median_s"].items():
        ratios = result["per_record_vs_jsonl"][side]
        cells = [f"{per[f]} ({ratios[f]})" for f in FORMATS]
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=256.0, help="JSON-lines input size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = formats(args)
    print(json.dumps(result, indent=2, default=str) if args.json else table(result))
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
