"""JSON shapes of the API (docs/api.md); the OpenAPI schema is generated from these."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from orchestrator import service

# The serializers below describe JSON objects (request bodies, and the responses the views
# build as dicts) for validation and the OpenAPI schema; none wraps a model instance.
JsonObject = dict[str, Any]


# What run_json shows of an unbounded source's spec (orchestrator/source/spec.py).
SOURCE_SPEC_FIELDS = {
    "folder": ("folder", "pattern", "format", "stable_s", "clean", "archive", "checkpoint"),
    "stream": ("stream", "url", "group", "start", "linger_s", "partitions", "idle_s", "format"),
}


def source_json(spec: dict[str, Any]) -> dict[str, Any]:
    """The kind of input a run reads and, for an unbounded source, its spec."""
    kind = str(spec.get("kind") or ("generator" if spec.get("generator") else "files"))
    shown: dict[str, Any] = {"kind": kind, "unbounded": kind in SOURCE_SPEC_FIELDS}
    shown.update({name: spec.get(name) for name in SOURCE_SPEC_FIELDS.get(kind, ())})
    if shown.get("url"):
        shown["url"] = without_credentials(str(shown["url"]))
    return shown


def without_credentials(url: str) -> str:
    """A Redis URL without its user and password (an administrator's listed server may
    have them): ``redis://***@host:6379/0``."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "@" not in netloc:
        return url
    return f"{scheme}://***@{netloc.rsplit('@', 1)[1]}{slash}{path}"


def run_json(run: Any) -> dict[str, Any]:
    spec = run.input_spec or {}
    return {
        "id": run.pk,
        "pipeline": run.pipeline_name,
        "pipeline_id": run.pipeline_id,
        "status": run.status,
        "active": run.is_active,
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "created_by": run.created_by.get_username() if run.created_by else None,
        "input": {
            "generator": spec.get("generator"),
            "paths": spec.get("paths", []),
            "format": spec.get("format"),
            "bytes": int(spec.get("extent_total") or 0),
            "preparing": service.input_preparing(run),
        },
        "source": source_json(spec),
        "policy": {
            k: run.policy.get(k)
            for k in ("throttling", "routing", "migration", "placement", "tick_ms")
        },
        # Balancing on declared limits (link bandwidths, node rates), not measured ones.
        "emulated": service.emulated(run.topology),
        "error": run.error,
        "view": f"/runs/{run.pk}/",
    }


def event_json(event: Any) -> dict[str, Any]:
    return {
        **event.to_json(),
        "run": event.run_id,
        "actor_kind": event.actor,
        "user": event.user.get_username() if event.user else None,
    }


class ProblemSerializer(serializers.Serializer[JsonObject]):
    location = serializers.CharField(help_text="Where in the document, e.g. nodes[2].buffer_mb")
    message = serializers.CharField()


class ProblemsSerializer(serializers.Serializer[JsonObject]):
    detail = serializers.CharField()
    problems = ProblemSerializer(many=True)


class BadRequestSerializer(serializers.Serializer[JsonObject]):
    """A 400 of an operation that takes a body: ``detail`` always; ``problems`` when the
    body is not an acceptable JSON document (too large, nested too deeply, not JSON);
    ``errors`` by field when a field is missing or of the wrong type (POST /api/runs/)."""

    detail = serializers.CharField()
    problems = ProblemSerializer(many=True, required=False)
    # DRF's metaclass moves declared fields into ``_declared_fields``, so this never
    # shadows ``Serializer.errors``; the stubs cannot express that.
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()), required=False
    )


class FieldSerializer(serializers.Serializer[JsonObject]):
    name = serializers.CharField()
    type = serializers.CharField(
        help_text="string, long, double, boolean, date, timestamp or unknown"
    )


class SampleRequestSerializer(serializers.Serializer[JsonObject]):
    path = serializers.CharField(
        help_text="a file (or glob: its first file) below the input folders"
    )
    format = serializers.ChoiceField(choices=["jsonl", "csv", "parquet"], default="jsonl")


class SampledSchemaSerializer(serializers.Serializer[JsonObject]):
    schema = serializers.CharField(
        help_text='the fields proposed, as a source declares them: "key string, ..."'
    )
    nested = serializers.ListField(
        child=serializers.CharField(), help_text="fields holding objects or lists, left out"
    )
    file = serializers.CharField(help_text="the file read")
    records = serializers.IntegerField(help_text="records read (at most 1,000)")
    malformed = serializers.IntegerField(help_text="lines that are not a JSON object")


class ValidationResultSerializer(serializers.Serializer[JsonObject]):
    valid = serializers.BooleanField()
    problems = ProblemSerializer(many=True)
    schemas = serializers.DictField(
        child=FieldSerializer(many=True),
        help_text="each node's output fields, by node name, where a source's declared "
        "schema reaches it",
    )


class LastRunSerializer(serializers.Serializer[JsonObject]):
    id = serializers.IntegerField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()


class PipelineSummarySerializer(serializers.Serializer[JsonObject]):
    name = serializers.CharField()
    description = serializers.CharField()
    policy = serializers.CharField(help_text="Base policy name")
    policy_overrides = serializers.DictField()
    nodes = serializers.IntegerField()
    edges = serializers.IntegerField()
    last_run = LastRunSerializer(allow_null=True)
    health = serializers.ChoiceField(
        choices=["ok", "warn", "bad", "idle"], help_text="Colour of the health dot"
    )


class PipelineDetailSerializer(PipelineSummarySerializer):
    document = serializers.DictField(help_text="The pipeline in the topology format")


class PipelineDocumentSerializer(serializers.Serializer[JsonObject]):
    """A pipeline document (docs/topology-format.md); validated by the topology checker."""

    name = serializers.CharField()
    description = serializers.CharField(required=False)
    policy = serializers.CharField(required=False)
    policy_overrides = serializers.DictField(required=False)
    nodes = serializers.ListField(child=serializers.DictField())
    edges = serializers.ListField(child=serializers.DictField())


class YamlImportSerializer(serializers.Serializer[JsonObject]):
    yaml = serializers.CharField(help_text="A topology file's text")


class RunInputSerializer(serializers.Serializer[JsonObject]):
    generator = serializers.JSONField(allow_null=True)
    paths = serializers.ListField(child=serializers.CharField())
    format = serializers.CharField(allow_null=True)
    bytes = serializers.IntegerField()
    preparing = serializers.DictField(
        allow_null=True,
        help_text="While the run's driver writes a generated input: written and total bytes "
        "and the fraction; null once the input exists (bytes is then its size)",
    )


class RunSourceSerializer(serializers.Serializer[JsonObject]):
    """What the run reads; the spec fields are those of its kind (folder or stream)."""

    kind = serializers.ChoiceField(choices=["files", "generator", "folder", "stream"])
    unbounded = serializers.BooleanField(
        help_text="A landing folder or a stream: read until an operator stops the run"
    )
    folder = serializers.CharField(required=False, help_text="folder: the landing folder")
    pattern = serializers.CharField(required=False, help_text="folder: the files read")
    stable_s = serializers.FloatField(
        required=False, help_text="folder: seconds a file's size must hold before it is read"
    )
    clean = serializers.ChoiceField(
        choices=["keep", "archive", "delete"],
        required=False,
        help_text="folder: what becomes of a file once merged",
    )
    archive = serializers.CharField(
        required=False, allow_blank=True, help_text="folder: where archived files go"
    )
    checkpoint = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="folder: the named checkpoint (empty: the run reads every file there)",
    )
    stream = serializers.CharField(required=False, help_text="stream: the Redis stream")
    url = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="stream: empty for the console's Redis; never with its password",
    )
    group = serializers.CharField(
        required=False, allow_blank=True, help_text="stream: the consumer group (empty: the run's)"
    )
    start = serializers.ChoiceField(
        choices=["earliest", "latest"], required=False, help_text="stream: where a new group starts"
    )
    linger_s = serializers.FloatField(
        required=False, help_text="stream: seconds a partial chunk waits for more entries"
    )
    partitions = serializers.IntegerField(
        required=False, help_text="stream: its partitions, the streams <stream>:0 .. (1: itself)"
    )
    idle_s = serializers.FloatField(
        required=False,
        help_text="stream: seconds a partition gives nothing before the watermark goes on "
        "without it",
    )
    format = serializers.CharField(required=False)


class RunSerializer(serializers.Serializer[JsonObject]):
    id = serializers.IntegerField()
    pipeline = serializers.CharField()
    pipeline_id = serializers.IntegerField(allow_null=True)
    status = serializers.ChoiceField(
        choices=["pending", "running", "paused", "stopping", "completed", "failed", "cancelled"]
    )
    active = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    created_by = serializers.CharField(allow_null=True)
    input = RunInputSerializer()
    # DRF's metaclass moves declared fields into ``_declared_fields``, so this never
    # shadows ``Field.source``; the stubs cannot express that.
    source = RunSourceSerializer()  # type: ignore[assignment]
    policy = serializers.DictField()
    error = serializers.CharField()
    view = serializers.CharField(help_text="The run's page in the console")


class StartSourceSerializer(serializers.Serializer[JsonObject]):
    """A landing folder or a Redis stream to start a run over (docs/api.md). Lengths are
    bounded here; what the values mean is checked by the orchestrator (400 naming the
    field, nothing created)."""

    kind = serializers.ChoiceField(choices=["folder", "stream"])
    folder = serializers.CharField(
        required=False,
        max_length=1000,
        help_text="folder: the landing folder, under an input folder (BPCONSOLE_INPUT_ROOTS)",
    )
    pattern = serializers.CharField(
        required=False, max_length=200, help_text="folder: file name pattern (default *.jsonl)"
    )
    stable_s = serializers.FloatField(
        required=False,
        help_text="folder: seconds (0 to 600, default 1) a file's size must hold before it is read",
    )
    clean = serializers.ChoiceField(
        choices=["keep", "archive", "delete"],
        required=False,
        help_text="folder: what becomes of a file once merged (default keep)",
    )
    archive = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=1000,
        help_text="folder: with clean=archive, where files go (under an input folder, not "
        "inside the landing folder)",
    )
    checkpoint = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="folder: a name; the run skips the files that completed runs with this "
        "checkpoint read over the folder (for clean=keep; default: none, every file is read)",
    )
    stream = serializers.CharField(
        required=False,
        max_length=200,
        help_text="stream: its name; on the console's Redis letters, digits and ._- (no ':'), "
        "read as the key bpconsole:stream:<name>; on a listed server :._- too, the key as named",
    )
    group = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=200,
        help_text="stream: consumer group, not starting with bpconsole. (default: the run's "
        "own, bpconsole.run.<id>); one active run per group",
    )
    start = serializers.ChoiceField(
        choices=["earliest", "latest"],
        required=False,
        help_text="stream: read from its first entry (default) or only new ones",
    )
    linger_s = serializers.FloatField(
        required=False,
        help_text="stream: seconds (0 to 10, default 0.5) a partial chunk waits for more "
        "entries before it is sent: lower is fresher, higher makes fewer, larger batches",
    )
    partitions = serializers.IntegerField(
        required=False,
        help_text="stream: 1 (default) reads the stream itself; 2 to 16 read the streams "
        "<stream>:0 to <stream>:<partitions - 1> side by side, each with its own event-time "
        "watermark (the run's is the smallest)",
    )
    idle_s = serializers.FloatField(
        required=False,
        help_text="stream: seconds (0 to 3600, default 30) a partition may give nothing "
        "before the watermark goes on without it; 0: it always waits",
    )
    url = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="stream: a Redis URL in BPCONSOLE_STREAM_URLS; empty = the console's Redis",
    )


class StartRunSerializer(serializers.Serializer[JsonObject]):
    pipeline = serializers.CharField(help_text="Name of a saved pipeline")
    generator = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="Built-in input, e.g. seed=7,volume_mb=8,dominance=0.8",
    )
    input_path = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="Input file or glob under an input folder (BPCONSOLE_INPUT_ROOTS)",
    )
    # (never shadows ``Field.source``: see RunSerializer.source)
    source = StartSourceSerializer(  # type: ignore[assignment]
        required=False,
        help_text="An unbounded source, read until the run is stopped (instead of "
        "generator or input_path)",
    )
    policy = serializers.CharField(
        required=False, allow_blank=True, help_text="Named policy; empty = the pipeline's"
    )


class NodeActionSerializer(serializers.Serializer[JsonObject]):
    node = serializers.CharField(help_text="Name of a node of the run's topology")


class AdjustSerializer(serializers.Serializer[JsonObject]):
    action = serializers.ChoiceField(
        choices=["hot_migrate", "add_instance", "remove_instance"],
        help_text="hot_migrate and remove_instance need node; add_instance needs stage",
    )
    node = serializers.CharField(required=False, help_text="An operator instance of the run")
    stage = serializers.CharField(required=False, help_text="An operator stage of the run")
    worker = serializers.CharField(
        required=False, help_text="A live Spark worker for the new instance (default: any)"
    )


class WorkerSerializer(serializers.Serializer[JsonObject]):
    name = serializers.CharField(help_text="What /adjust/ takes as worker")
    host = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)


class ActionResultSerializer(serializers.Serializer[JsonObject]):
    detail = serializers.CharField()
    run = RunSerializer(required=False)


class DetailSerializer(serializers.Serializer[JsonObject]):
    detail = serializers.CharField()


class EventSerializer(serializers.Serializer[JsonObject]):
    id = serializers.IntegerField()
    run = serializers.IntegerField(allow_null=True)
    time = serializers.DateTimeField()
    node = serializers.CharField()
    kind = serializers.CharField(
        help_text="set_flag, clear_flag, set_thresholds, set_rate, set_shares, "
        "start_migration, stop_migration, operator_migrate, action_refused, run_paused, ..."
    )
    reason = serializers.CharField()
    actor = serializers.CharField(help_text="The user's name, or balancer / system")
    actor_kind = serializers.ChoiceField(choices=["balancer", "user", "system"])
    user = serializers.CharField(allow_null=True)
    # DRF's metaclass moves declared fields into ``_declared_fields``, so this never
    # shadows ``Serializer.data``; the stubs cannot express that.
    data = serializers.DictField()  # type: ignore[assignment]


class OpenWindowSerializer(serializers.Serializer[JsonObject]):
    start = serializers.CharField(help_text="ISO-8601, UTC")
    end = serializers.CharField()
    keys = serializers.IntegerField()
    records = serializers.IntegerField()
    progress = serializers.FloatField(help_text="how far the watermark is through it, 0 to 1")


class NodeTimeSerializer(serializers.Serializer[JsonObject]):
    oldest_waiting = serializers.CharField(
        allow_null=True, help_text="the event time its oldest waiting data reaches"
    )
    lag_s = serializers.FloatField(
        help_text="behind the source in event time by its oldest waiting data; 0: nothing waits"
    )


class WindowsSerializer(serializers.Serializer[JsonObject]):
    event_time = serializers.CharField(help_text="the field holding each record's event time")
    window_s = serializers.FloatField()
    slide_s = serializers.FloatField()
    lateness_s = serializers.FloatField()
    source_high = serializers.CharField(
        allow_null=True,
        help_text="the source's watermark: the smallest of its partitions' largest event "
        "times (with one partition, the largest it has read)",
    )
    partitions = serializers.ListField(
        child=serializers.CharField(allow_null=True),
        help_text="a partitioned stream's: each partition's largest event time (null: none "
        "yet); empty with one partition",
    )
    watermark = serializers.CharField(
        allow_null=True, help_text="windows ending by this are closed: final, written once"
    )
    event_lag_s = serializers.FloatField(
        allow_null=True, help_text="the source's largest event time minus the sink's"
    )
    late_records = serializers.IntegerField(
        help_text="(record, window) pairs behind the watermark: quarantined, not counted"
    )
    late_sample = serializers.ListField(
        child=serializers.CharField(), help_text="the first late records, as quarantined"
    )
    closed = serializers.IntegerField(help_text="windows closed")
    open = OpenWindowSerializer(many=True, help_text="open windows, oldest first")
    nodes = serializers.DictField(child=NodeTimeSerializer())


class ResultsSerializer(serializers.Serializer[JsonObject]):
    run = serializers.IntegerField()
    status = serializers.CharField()
    exact_up_to = serializers.CharField(
        help_text="every chunk of the input before this position is merged exactly once"
    )
    final = serializers.BooleanField(help_text="the run has ended: the result is complete")
    keys = serializers.IntegerField(help_text="keys (or groups) in the result")
    columns = serializers.ListField(
        child=serializers.CharField(),
        help_text="the names of a row's values, in order: key, count, sum_value, min_value, "
        "max_value, avg_value, distinct_users; or, for grouped measures, each group_by "
        "field then each measure by its name",
    )
    rows = serializers.ListField(
        child=serializers.DictField(),
        help_text="the keys (groups) with the most records, each a value per column (null "
        "where SQL has NULL: a sum, min, max or avg of no value)",
    )
    windows = WindowsSerializer(
        allow_null=True, help_text="a windowed pipeline's windows (null without windows)"
    )


class CompletionSerializer(serializers.Serializer[JsonObject]):
    run = serializers.IntegerField()
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="[seconds since start, completed fraction]",
    )


class StartLabSerializer(serializers.Serializer[JsonObject]):
    generator = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=512,
        help_text="A generated workload, e.g. seed=7,volume_mb=64,dominance=0.8",
    )
    run = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        help_text="A completed run of the pipeline, over files or the generator: its "
        "recorded input and runtime (instead of generator)",
    )


class LabArmSerializer(serializers.Serializer[JsonObject]):
    name = serializers.CharField(help_text="pipeline (its own policy) or a benchmark policy")
    # shadows ``Field.label``; the stubs cannot express that.
    label = serializers.CharField()  # type: ignore[assignment]
    completion_s = serializers.FloatField(allow_null=True, help_text="null: did not finish")
    ratio_to_bound = serializers.FloatField(allow_null=True)
    migrated_share = serializers.FloatField()
    curve = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="[simulated seconds, completed fraction], about 120 points",
    )
    problem = serializers.CharField(allow_blank=True)


class LabResultSerializer(serializers.Serializer[JsonObject]):
    bound_s = serializers.FloatField(help_text="the live fluid bound of the workload")
    arms = LabArmSerializer(many=True)


class LabRunSerializer(serializers.Serializer[JsonObject]):
    run = serializers.IntegerField()
    arm = serializers.CharField()
    status = serializers.CharField()


class LabSerializer(serializers.Serializer[JsonObject]):
    id = serializers.IntegerField()
    pipeline = serializers.CharField()
    status = serializers.ChoiceField(choices=["pending", "running", "done", "failed"])
    workload = serializers.CharField(help_text="what was simulated, in words")
    calibration = serializers.CharField(help_text="where the runtime model comes from")
    runtime = serializers.DictField(allow_null=True, help_text="the fitted runtime model")
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(allow_blank=True)
    result = LabResultSerializer(allow_null=True)
    best = LabArmSerializer(allow_null=True, help_text="the policy predicted to finish first")
    runs = LabRunSerializer(many=True, help_text="live runs started from the lab")


class StartLabRunSerializer(serializers.Serializer[JsonObject]):
    policy = serializers.CharField(
        max_length=40, help_text="an arm of the lab: pipeline, or a benchmark policy's name"
    )
