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
    also one that is malformed for a missing required field: see
    ``lines_missing_fields``). With
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


def lines_missing_fields(
    spark: SparkSession,
    paths: Sequence[str],
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    keys: Sequence[str],
    required: Collection[str],
) -> DataFrame:
    """The raw lines of the records ``read_records`` found malformed but kept no line of
    (a required field missing or null; in CSV and Parquet every malformed record), with
    their file: a line once per such record in it (``n``: a JSON array line may hold
    several).

    A second read, only of the files that had such records, repeating the reader's
    rules on each line. A Parquet record's line is its fields as a JSON object.
    """
    return _each_format(
        paths,
        None,
        jsonl=lambda files: _json_lines_missing(
            spark, files, strings, numbers, keys=keys, required=required
        ),
        csv=lambda files, header: _csv_bad_lines(
            spark, files, header, strings, numbers, keys=keys, required=required
        ),
        parquet=lambda files: _parquet_bad_rows(
            spark, files, strings, numbers, keys=keys, required=required
        ),
    )


def _csv_bad_lines(
    spark: SparkSession,
    files: list[str],
    header: str,
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    keys: Sequence[str],
    required: Collection[str],
) -> DataFrame:
    """Each line parsed as the reader parses it (``from_csv`` keeps the fields of a line
    with too few or too many, as the reader does); header and blank lines skipped as the
    reader skips them. A data line equal to the header is skipped too: the count of
    malformed records stays the reader's, only that line is not quarantined."""
    schema = _ddl([(n, "STRING") for n in csv_columns(header)])
    raw = F.col("value")
    parsed = F.from_csv(raw, schema)
    fields = [parsed[c].alias(c) for c in csv_columns(header)]
    lines = spark.read.text(files).select(
        segment_column().alias(SEGMENT_COL), raw.alias(RAW_COL), *fields
    )
    lines = lines.where((F.col(RAW_COL) != "") & (F.col(RAW_COL) != header))
    return _bad_of(lines, strings, numbers, keys, required)


def _parquet_bad_rows(
    spark: SparkSession,
    files: list[str],
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    keys: Sequence[str],
    required: Collection[str],
) -> DataFrame:
    frame = spark.read.parquet(*files)
    payload = F.to_json(F.struct(*[column(c) for c in frame.columns]))
    rows = frame.select(segment_column().alias(SEGMENT_COL), payload.alias(RAW_COL), "*")
    return _bad_of(rows, strings, numbers, keys, required)


def unkeepable(text: Column, *, key: bool) -> Column:
    """A text field PostgreSQL could not keep: one holding a NUL, or a ``key`` longer
    than ``MAX_KEY_CHARS`` (a distinct value is kept in an array, of any length)."""
    nul = text.contains("\x00")
    # Characters are counted only past as many bytes: a count reads every byte of
    # every key, where the bytes are the string's length, and a text of at most
    # MAX_KEY_CHARS bytes has at most as many characters.
    long_key = (F.octet_length(text) > MAX_KEY_CHARS) & (F.length(text) > MAX_KEY_CHARS)
    return (nul | long_key) if key else nul


def _bad_of(
    rows: DataFrame,
    strings: Sequence[str],
    numbers: Sequence[str],
    keys: Sequence[str],
    required: Collection[str],
) -> DataFrame:
    """The rows whose required fields do not all convert, or that hold text that could
    not be kept, one record each (``read_records``' rules)."""
    bad = F.lit(False)  # noqa: FBT003 - a Spark literal, not a flag
    converted = _converted(rows.columns, strings, numbers)
    for name, column in zip([*strings, *numbers], converted, strict=True):
        if name in required:
            bad = bad | column.isNull()
        if name in strings:
            bad = bad | F.coalesce(unkeepable(column, key=name in keys), F.lit(False))  # noqa: FBT003
    return rows.where(bad).select(SEGMENT_COL, RAW_COL, F.lit(1).alias("n"))


def _json_lines_missing(
    spark: SparkSession,
    paths: Sequence[str],
    strings: Sequence[str],
    numbers: Sequence[str],
    *,
    keys: Sequence[str],
    required: Collection[str],
) -> DataFrame:
    """A JSON line holds records the reader could read but that are malformed when it is
    an object, or an array of objects, whose every present field converts (else the
    reader had kept the whole line as corrupt), and a required field is missing or null,
    or a text field it reads could not be kept."""
    numeric = list(numbers)
    as_text = f"struct<{_ddl([(n, 'STRING') for n in [*strings, *numeric]], ':')}>"
    typed = f"struct<{_ddl(_fields(strings, numbers), ':')}>"
    raw = F.col("value")

    def missing(text: Column) -> Column:
        out = F.lit(False)  # noqa: FBT003 - a Spark literal, not a flag
        for name in [*strings, *numeric]:
            if name in required:
                out = out | text[name].isNull()
        for name in strings:
            out = out | F.coalesce(unkeepable(text[name], key=name in keys), F.lit(False))  # noqa: FBT003
        return out

    def converts(text: Column, value: Column) -> Column:
        out = F.lit(True)  # noqa: FBT003 - a Spark literal, not a flag
        for name in numeric:
            out = out & (text[name].isNull() | value[name].isNotNull())
        return out

    one_text, one_typed = F.from_json(raw, as_text), F.from_json(raw, typed)
    many_text = F.from_json(raw, f"array<{as_text}>")
    many_typed = F.from_json(raw, f"array<{typed}>")
    pairs = F.arrays_zip(many_text.alias("t"), many_typed.alias("v"))
    in_array = F.when(
        F.forall(pairs, lambda e: e["t"].isNotNull() & converts(e["t"], e["v"])),
        F.size(F.filter(pairs, lambda e: missing(e["t"]))),
    ).otherwise(0)
    in_object = F.when(
        F.json_object_keys(raw).isNotNull() & missing(one_text) & converts(one_text, one_typed),
        1,
    ).otherwise(0)
    records = F.when(F.ltrim(raw).startswith("["), F.coalesce(in_array, F.lit(0))).otherwise(
        in_object
    )
    lines = spark.read.text(list(paths)).select(
        segment_column().alias(SEGMENT_COL), raw.alias(RAW_COL), records.alias("n")
    )
    return lines.where(F.col("n") > 0)


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
