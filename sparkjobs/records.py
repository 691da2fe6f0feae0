"""Reading input records the same way everywhere: operators and the batch reference job.

Segments are JSON lines, CSV (with their input's header line) or Parquet, each read by
Spark's own reader with a schema of the fields an operator needs, as a Spark engineer
reads them (``spark.read.schema(...).json(...)``, ``.csv(...)``, ``.parquet(...)``), so
a record means what it means to plain Spark. In JSON lines, a line holding an array of
objects holds those records, a blank line or an empty array none, and of a field given
twice the last counts; in CSV a record is a line, its fields by the header's columns.
A record is *malformed* when its line is not valid JSON or not an object (the reader's
corrupt record), a field does not convert to its type (a value that is not a number),
a field the operator requires is missing or null, or a text field it needs could not be
kept (``unkeepable``). Malformed records are counted and quarantined (with their raw
line, or the fields read of a readable one), never fatal. Numbers are read as DECIMAL(38,10):
sums of decimals are exact whatever the order of addition, which is what lets data be
regrouped across branches and still match the batch job to the last digit.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkjobs.segments import MAX_HEADER_BYTES

VALUE_TYPE = "DECIMAL(38,10)"
SEGMENT_COL = "_segment"
RAW_COL = "_raw"
MALFORMED_COL = "_malformed"


SUFFIXES = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
# The reader's corrupt-record column when a record operator reads every field.
CORRUPT = "_corrupt_record"
# The text fields an aggregate reads become keys and distinct values kept in
# PostgreSQL: its text holds no NUL character, and its unique index on a result's key
# takes a few thousand bytes at most. A record whose such field holds a NUL, or whose
# key is longer, is malformed, on the live path and in the batch job alike, rather than
# a sink batch that can never commit.
MAX_KEY_CHARS = 500


def segment_of(file: str) -> str:
    """A segment's id is its file name without the extension, from the file's name or
    its URL (``SEGMENT_COL``). Mapped in Python after the job: a per-record regular
    expression in Spark would cost more than the parse."""
    name = file.rsplit("/", 1)[-1]
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def segment_column() -> Column:
    """The file a record came from, as Spark names it (its URL), for ``SEGMENT_COL``.

    ``input_file_name()``, not the scan's ``_metadata.file_name``: a scan asked for a
    metadata column appends it to every row by copying the row once more, where this
    reads the task's current file, and only for the records whose file is used (in a
    batch of siblings, the malformed ones). The operator job over the peers' 512 MB
    spent 7 to 10% more CPU with the metadata column (docs/benchmarks.md, "the file
    a record came from"). The URL's last part is the name the metadata column gives
    (``file_name``), percent-encoded alike; a segment's name needs no encoding."""
    return F.input_file_name()


def file_name(segment: Column) -> Column:
    """The file name of a ``segment_column`` value, to look a segment up in Spark."""
    return F.substring_index(segment, "/", -1)


def read_records(
    spark: SparkSession,
    paths: Sequence[str],
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    keys: Sequence[str],
    fmt: str | None = None,
    segments: bool = True,
    required: Collection[str] = (),
) -> DataFrame:
    """Typed columns for ``strings`` and ``numbers``, a ``_malformed`` flag and ``_raw``:
    the raw line of a record the reader could not read (null for a readable record,
    also one that is malformed for a missing required field). With
    ``segments``, the file each record came from. Files are read in ``fmt``, or each in
    the format its suffix names (segments). ``keys``: the fields of ``strings`` that
    become result keys (``unkeepable``). A field missing or null is null, as in SQL,
    but for the fields of ``required``: a record missing one of those is malformed."""
    frame = _each_format(
        paths,
        fmt,
        jsonl=lambda files: _json_records(spark, files, strings, numbers),
        csv=lambda files, header: _csv_records(spark, files, header, strings, numbers),
        parquet=lambda files: _typed(spark.read.parquet(*files), strings, numbers),
    )
    wanted = [*strings, *numbers]
    bad = _malformed(
        F.col(RAW_COL).isNotNull(),
        {name: F.col(f"`{name}`") for name in wanted},
        strings,
        keys=keys,
        required=required,
    )
    kept = [F.col(f"`{name}`") for name in wanted]
    if segments:
        kept.insert(0, F.col(SEGMENT_COL))
    return frame.select(*kept, F.col(RAW_COL), bad.alias(MALFORMED_COL))


def read_rows(
    spark: SparkSession, paths: Sequence[str], fmt: str | None = None, *, schema: str | None = None
) -> DataFrame:
    """Every field of every record, for a record operator, with the file it came from
    and, of JSON lines, the reader's corrupt record (``CORRUPT``, null in a readable
    record). CSV fields are text; files with other columns add theirs (null elsewhere).
    With ``schema`` (Spark DDL: the source's declared fields), JSON lines are read with
    it: a record holding a value its field's type cannot take is a corrupt record, not
    a batch whose types differ from the next one's."""

    def json_rows(files: list[str]) -> DataFrame:
        reader = spark.read.option("mode", "PERMISSIVE")
        if schema is not None:
            reader = reader.schema(f"{schema}, {CORRUPT} STRING")
        return reader.option("columnNameOfCorruptRecord", CORRUPT).json(files)

    def csv_rows(files: list[str], header: str) -> DataFrame:
        schema = _ddl([(n, "STRING") for n in csv_columns(header)])
        return spark.read.schema(schema).option("header", "true").csv(files)

    def named(read: Callable[..., DataFrame]) -> Callable[..., DataFrame]:
        return lambda *args: read(*args).withColumn(SEGMENT_COL, segment_column())

    return _each_format(
        paths,
        fmt,
        jsonl=named(json_rows),
        csv=named(csv_rows),
        parquet=named(lambda files: spark.read.parquet(*files)),
        missing_columns=True,
    )


def _json_records(
    spark: SparkSession, files: list[str], strings: Sequence[str], numbers: Sequence[str]
) -> DataFrame:
    """JSON lines as Spark reads them with a schema: PERMISSIVE, a corrupt record's line
    kept."""
    schema = _ddl([*_fields(strings, numbers), (RAW_COL, "STRING")])
    frame = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", RAW_COL)
        .json(files)
    )
    return frame.select(
        segment_column().alias(SEGMENT_COL),
        *[F.col(f"`{name}`") for name in [*strings, *numbers]],
        F.col(RAW_COL),
    )


def _csv_records(
    spark: SparkSession,
    files: list[str],
    header: str,
    strings: Sequence[str],
    numbers: Sequence[str],
) -> DataFrame:
    """CSV files sharing a header line, as Spark reads them with ``header``: a record per
    line, fields by their column (a field the line lacks is null, one past the header's
    columns ignored). Every column is read as text and numbers converted after, as in
    Parquet: the CSV reader's own number parsing would take "1,000" for 1000."""
    schema = _ddl([(n, "STRING") for n in csv_columns(header)])
    frame = spark.read.schema(schema).option("header", "true").csv(files)
    return _typed(frame, strings, numbers)


def _typed(frame: DataFrame, strings: Sequence[str], numbers: Sequence[str]) -> DataFrame:
    """The fields of a reader that keeps no corrupt line (CSV, Parquet) as
    ``_json_records`` gives them: strings as text, numbers converted or null, a field
    the files lack null."""
    return frame.select(
        segment_column().alias(SEGMENT_COL),
        *_converted(frame.columns, strings, numbers),
        F.lit(None).cast("STRING").alias(RAW_COL),
    )


def _converted(
    columns: Sequence[str], strings: Sequence[str], numbers: Sequence[str]
) -> list[Column]:
    present = set(columns)

    def field(name: str, kind: str) -> Column:
        column = F.col(f"`{name}`") if name in present else F.lit(None)
        typed = column.cast(kind) if kind == "STRING" else column.try_cast(kind)
        return typed.alias(name)

    return [field(name, kind) for name, kind in _fields(strings, numbers)]


def csv_columns(header: str) -> list[str]:
    """The column names of a CSV header line as Spark names them: an empty name is
    ``_c<i>``, a name given twice is suffixed with its position in each place."""
    names = [name or f"_c{i}" for i, name in enumerate(next(csv.reader([header]), []))]
    counts = Counter(n.lower() for n in names)
    return [f"{n}{i}" if counts[n.lower()] > 1 else n for i, n in enumerate(names)]


def _each_format(
    paths: Sequence[str],
    fmt: str | None,
    *,
    jsonl: Callable[[list[str]], DataFrame],
    csv: Callable[[list[str], str], DataFrame],
    parquet: Callable[[list[str]], DataFrame],
    missing_columns: bool = False,
) -> DataFrame:
    """One frame of files in several formats: each format's files read by its reader
    (CSV files once per header line), the frames united by column name (with
    ``missing_columns``, a column only some have is null in the others)."""
    parts: list[DataFrame] = []
    for kind, files in _by_format(paths, fmt).items():
        if kind == "jsonl":
            parts.append(jsonl(files))
        elif kind == "csv":
            parts.extend(csv(group, header) for header, group in _by_header(files).items())
        else:
            parts.append(parquet(files))
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=missing_columns), parts)


def _by_format(paths: Sequence[str], fmt: str | None) -> dict[str, list[str]]:
    """Files by the format to read them in: ``fmt``, or the one their suffix names."""
    out: dict[str, list[str]] = {}
    for path in paths:
        kind = fmt or next((k for s, k in SUFFIXES.items() if path.endswith(s)), "jsonl")
        out.setdefault(kind, []).append(path)
    return out


def _by_header(files: Sequence[str]) -> dict[str, list[str]]:
    """CSV files by their header line (files of several inputs may differ)."""
    out: dict[str, list[str]] = {}
    for path in files:
        with open(path, "rb") as handle:  # noqa: PTH123 - the first line only
            header = handle.readline(MAX_HEADER_BYTES).decode("utf-8", "replace")
        out.setdefault(header.rstrip("\r\n"), []).append(path)
    return out


def unkeepable(text: Column, *, key: bool) -> Column:
    """A text field PostgreSQL could not keep: one holding a NUL, or a ``key`` longer
    than ``MAX_KEY_CHARS`` (a distinct value is kept in an array, of any length)."""
    nul = text.contains("\x00")
    # Characters are counted only past as many bytes: a count reads every byte of
    # every key, where the bytes are the string's length, and a text of at most
    # MAX_KEY_CHARS bytes has at most as many characters.
    long_key = (F.octet_length(text) > MAX_KEY_CHARS) & (F.length(text) > MAX_KEY_CHARS)
    return (nul | long_key) if key else nul


def parse_fields(
    lines: DataFrame,
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    keys: Sequence[str],
    required: Collection[str] = (),
) -> DataFrame:
    """Typed columns for ``strings`` and ``numbers`` plus a ``_malformed`` flag, of JSON
    objects in the ``_raw`` column (records a record operator wrote, in the batch job),
    by ``read_records``' rules: a number is read as its text and converted, and a value
    that does not convert makes the record malformed, as the JSON reader's schema does."""
    # A line that is not a JSON object is the reader's corrupt record (PERMISSIVE
    # from_json gives it a row of nulls, not a null).
    as_text = [(name, "STRING") for name in [*strings, *numbers]]
    schema = _ddl([*as_text, (CORRUPT, "STRING")])
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    parsed = lines.withColumn("_r", F.from_json(F.col(RAW_COL), schema, options))
    typed = {name: F.col(f"_r.`{name}`") for name in strings}
    unconverted = F.lit(False)  # noqa: FBT003 - a Spark literal
    for name in numbers:
        text = F.col(f"_r.`{name}`")
        typed[name] = text.try_cast(VALUE_TYPE)
        unconverted = unconverted | (text.isNotNull() & typed[name].isNull())
    unread = F.col("_r").isNull() | F.col(f"_r.`{CORRUPT}`").isNotNull()
    bad = _malformed(unread, typed, strings, keys=keys, required=required)
    return parsed.select(
        *[c for c in lines.columns],
        *[typed[name].alias(name) for name in [*strings, *numbers]],
        (bad | unconverted).alias(MALFORMED_COL),
    )


def _malformed(
    unread: Column,
    fields: Mapping[str, Column],
    strings: Sequence[str],
    *,
    keys: Sequence[str],
    required: Collection[str],
) -> Column:
    """Whether a record is malformed: ``unread`` (its line could not be read), a field
    of ``required`` missing or null, or a text field that could not be kept."""
    bad = unread
    for name in required:
        bad = bad | fields[name].isNull()
    for name in strings:
        kept = unkeepable(fields[name], key=name in keys)
        bad = bad | F.coalesce(kept, F.lit(False))  # noqa: FBT003 - a Spark literal
    return bad


def _fields(strings: Sequence[str], numbers: Sequence[str]) -> list[tuple[str, str]]:
    """(name, Spark type) of each field an operator reads."""
    return [(name, "STRING") for name in strings] + [(name, VALUE_TYPE) for name in numbers]


def _ddl(fields: Sequence[tuple[str, str]], sep: str = "") -> str:
    """Fields as Spark DDL: ``a STRING, b DECIMAL(38,10)`` (``sep`` ":" inside struct<>)."""
    return ", ".join(f"{_quoted(name)}{sep} {kind}" for name, kind in fields)


def column(name: str) -> Column:
    """The column of that name, whatever it holds: a CSV header or a JSON key names
    columns, and may hold dots or backquotes."""
    return F.col(_quoted(name))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
