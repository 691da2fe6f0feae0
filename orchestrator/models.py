"""Runs, the durable segment ledger, the sink's merge ledger, results and events."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from sparkjobs.keygroups import KEY_SLOTS


class Run(models.Model):
    """One execution of a pipeline over an input, with the policy it started with."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        PAUSED = "paused"
        # An unbounded run asked to stop: its source reads nothing new and the run
        # completes once what it ingested is merged (orchestrator/source/).
        STOPPING = "stopping"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE = (Status.PENDING, Status.RUNNING, Status.PAUSED, Status.STOPPING)

    # By name, not import: the orchestrator never imports the console's models.
    pipeline = models.ForeignKey(
        "console.Pipeline", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    pipeline_name = models.CharField(max_length=100)
    topology = models.JSONField(help_text="The pipeline document as it was at start.")
    policy = models.JSONField(help_text="Effective policy values at start.")
    input_spec = models.JSONField(help_text="Input files and format, or a generator spec.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    epoch = models.PositiveIntegerField(
        default=0, help_text="Bumped by every new driver; older owners are refused."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    input_bytes = models.BigIntegerField(default=0)
    chunks_total = models.IntegerField(
        null=True, blank=True, help_text="Known once the source has read all its input."
    )
    config_version = models.PositiveIntegerField(
        default=0, help_text="Version of the instance graph; each hot adjustment adds one."
    )
    source_position = models.JSONField(
        default=dict, help_text="Where the source resumes: file index and byte offset."
    )
    references = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "A refreshed join's latest copy of its table, per join stage: its file in the "
            "reference store, its version (1 for the first refresh that changed it) and "
            "when it was read. Files taken in from then on join it."
        ),
    )
    merged_prefix = models.JSONField(
        default=dict,
        help_text=(
            "A continuous run's chunks below 'chunk', merged exactly once and their rows "
            "coalesced: they tile its input up to ('file', 'offset')."
        ),
    )
    windows_closed = models.JSONField(
        default=dict,
        help_text=(
            "A windowed run's sink watermark: chunks below 'chunk' are merged, the largest "
            "event time among them is 'high_us', and windows ending by 'closed_us' are final."
        ),
    )
    error = models.TextField(blank=True)
    # A run started from the policy lab: its curve is drawn over the lab's prediction.
    lab = models.ForeignKey(
        "PolicyLab", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    lab_arm = models.CharField(
        max_length=40, blank=True, help_text="The lab's policy this run was started with."
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"run {self.pk} of {self.pipeline_name} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class PolicyLab(models.Model):
    """Every policy simulated on one workload of a pipeline (orchestrator/lab/): the
    prediction an operator picks a policy from, and draws a live run's curve over."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    ACTIVE = (Status.PENDING, Status.RUNNING)

    pipeline = models.ForeignKey(
        "console.Pipeline", null=True, blank=True, on_delete=models.SET_NULL, related_name="labs"
    )
    pipeline_name = models.CharField(max_length=100)
    topology = models.JSONField(help_text="The pipeline document simulated.")
    policy = models.JSONField(help_text="The pipeline's own effective policy values.")
    workload = models.JSONField(
        help_text="{'kind': 'generator', 'generator': fields} or {'kind': 'run', 'run': id}."
    )
    calibrated_from = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The completed run whose batches and reductions the runtime was fitted to.",
    )
    runtime = models.JSONField(
        null=True, blank=True, help_text="The fitted runtime model (None: links only)."
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(null=True, blank=True, help_text="balancer.sim.lab.LabJson")
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"lab {self.pk} of {self.pipeline_name} ({self.status})"


class Segment(models.Model):
    """A unit of data at a node: an immutable file plus its place in the input."""

    class State(models.TextChoices):
        QUEUED = "queued"
        CLAIMED = "claimed"
        DONE = "done"

    id = models.CharField(primary_key=True, max_length=200)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="segments")
    chunk = models.IntegerField(help_text="Index of the source chunk this data came from.")
    origin_file = models.IntegerField()
    origin_offset = models.BigIntegerField()
    origin_length = models.BigIntegerField()
    node = models.CharField(max_length=100, help_text="Node whose pool holds it.")
    upstream = models.CharField(max_length=100, blank=True)
    tag = models.CharField(max_length=200, blank=True)
    path = models.CharField(max_length=500)
    bytes = models.BigIntegerField()
    malformed = models.IntegerField(default=0)
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    failures = models.IntegerField(
        default=0, help_text="Batches holding it whose operator failed (not lost workers)."
    )
    available_at = models.DateTimeField(help_text="When it arrives (emulated link).")
    migrated_from = models.CharField(
        max_length=100, blank=True, help_text="The branch it was meant for, if migrated."
    )
    epoch = models.PositiveIntegerField(default=0)
    config = models.PositiveIntegerField(
        default=0, help_text="Graph version its sender routed it with (hot-rescale.md)."
    )
    marker = models.BooleanField(
        default=False, help_text="An adjustment marker on the connection upstream -> node."
    )
    slots_from = models.PositiveSmallIntegerField(
        default=0, help_text="First key slot of the chunk this copy carries (keyed stages)."
    )
    slots_to = models.PositiveSmallIntegerField(
        default=KEY_SLOTS, help_text="End (exclusive) of the key slots this copy carries."
    )
    high_before_us = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Largest event time of the chunks before its chunk: the watermark it "
        "was read under (windowed pipelines; null: none yet).",
    )
    high_us = models.BigIntegerField(
        null=True, blank=True, help_text="Largest event time up to and with its chunk."
    )
    late = models.IntegerField(
        default=0, help_text="(record, window) pairs its operator found late."
    )
    records = models.IntegerField(
        default=0,
        help_text="Records its operator took from it, malformed ones included (0 until "
        "done): what a node's capacity in records per second is made of.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["run", "node", "state", "available_at"]),
            models.Index(fields=["run", "state", "lease_expires"]),
            models.Index(fields=["run", "migrated_from"]),
        ]

    def __str__(self) -> str:
        return self.id


class MergedChunk(models.Model):
    """The sink's ledger: each input chunk merged once (the unique constraint)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="merged")
    chunk = models.IntegerField()
    origin_file = models.IntegerField()
    origin_offset = models.BigIntegerField()
    origin_length = models.BigIntegerField()
    slots_from = models.PositiveSmallIntegerField(default=0)
    slots_to = models.PositiveSmallIntegerField(default=KEY_SLOTS)
    segment = models.CharField(max_length=200)
    sink = models.CharField(max_length=100)
    high_us = models.BigIntegerField(
        null=True, blank=True, help_text="Largest event time up to and with this chunk."
    )
    merged_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "chunk", "slots_from"], name="chunk_part_merged_once"
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} chunk {self.chunk} slots [{self.slots_from}, {self.slots_to})"


class ResultGroup(models.Model):
    """Per-group result of a stage of grouped measures (sparkjobs/measures.py): the
    group's values and each measure's partial state, merged by every sink batch, its
    values computed when read. Over event-time windows, a row per (window, group), open
    until the sink's watermark passes the window's end; then closed, once, and final:
    its values kept, its states (a distinct count's set among them) dropped."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="result_groups")
    # The SHA-256 of the group's values (with its window's start, over windows) as JSON:
    # values of any length and number make a key an index takes.
    digest = models.CharField(max_length=64)
    group = models.JSONField(help_text="The group's values, in group_by's order.")
    states = models.JSONField(help_text="Each measure's partial state, by its name.")
    records = models.BigIntegerField(default=0, help_text="The records the group holds.")
    start_us = models.BigIntegerField(null=True, blank=True, help_text="Its window's start.")
    end_us = models.BigIntegerField(null=True, blank=True, help_text="Its window's end.")
    closed_at = models.DateTimeField(null=True, blank=True)
    finished = models.JSONField(
        null=True, blank=True, help_text="Each measure's value, kept when its window closes."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "digest"], name="one_row_per_group")]
        indexes = [models.Index(fields=["run", "closed_at", "end_us"])]

    def __str__(self) -> str:
        return f"run {self.run_id} group {self.group}"


class SeenRecord(models.Model):
    """A record identity a ``deduplicate`` stage kept: the digest of its fields' values,
    128 bits kept as a UUID (orchestrator/ledger/seen.py). A record of the same digest
    is dropped while the row lasts: the stage's ``within_s`` after it was kept.

    A batch inserts one row per record it keeps, so a row holds no more than that: the
    run, stage and digest are its key (no surrogate id to index besides), and the time
    it was kept is indexed by block range (BRIN), as rows are inserted in that order,
    for the sweep that forgets them."""

    pk = models.CompositePrimaryKey("run", "stage", "digest")
    # The key's first column serves the run's lookups and its cascade.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="seen_records", db_index=False
    )
    stage = models.CharField(max_length=100)
    digest = models.UUIDField()
    kept_at = models.DateTimeField()

    class Meta:
        indexes = [BrinIndex(fields=["kept_at"], name="seen_record_kept_at")]

    def __str__(self) -> str:
        return f"run {self.run_id} stage {self.stage} kept {self.digest}"


class SourceFile(models.Model):
    """A file a landing-folder source took in, numbered in arrival order.

    The number is what the ledger's chunks name as their origin file, so it is given
    once, durably, before any chunk of the file is emitted; the size is the file's as
    it was taken in (what the run reads of it, and what coverage must tile).
    """

    class State(models.TextChoices):
        READING = "reading"
        READ = "read", "read (every chunk emitted)"
        CLEANED = "cleaned", "cleaned (archived or deleted once merged)"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="source_files")
    index = models.PositiveIntegerField()
    path = models.CharField(max_length=1000, help_text="Where it is: moved when archived.")
    size = models.BigIntegerField()
    data_start = models.BigIntegerField(default=0)
    mtime_ns = models.BigIntegerField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.READING)
    changed = models.BooleanField(
        default=False, help_text="Rewritten or truncated after it was taken in (reported)."
    )
    references = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "The copy of each refreshed join's table its records join (stage -> file in "
            "the reference store), bound when it was taken in; a node not named joins the "
            "copy the run started with."
        ),
    )
    discovered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="one_file_per_index"),
            # A cleaned file's name may come back with new data (archive and delete
            # modes): it is a new file then.
            models.UniqueConstraint(
                fields=["run", "path"],
                condition=~models.Q(state="cleaned"),
                name="one_index_per_file",
            ),
        ]
        ordering = ["run", "index"]

    def __str__(self) -> str:
        return f"run {self.run_id} file {self.index}: {self.path}"


class Throttle(models.Model):
    """Token bucket of an emulated node rate or link bandwidth: busy until ``free_at``."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="throttles")
    name = models.CharField(max_length=220, help_text="node:<name> or link:<src>><dst>")
    free_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_bucket")]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.name} free at {self.free_at}"


class Instance(models.Model):
    """An operator instance of a run: where it is placed and where it stands in the
    current adjustment (docs/spec/hot-rescale.md)."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        JOINING = "joining", "joining (added, adjustment under way)"
        RETIRING = "retiring", "retiring (removed, adjustment under way)"
        RETIRED = "retired"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="instances")
    name = models.CharField(max_length=100)
    stage = models.CharField(max_length=100)
    worker = models.CharField(
        max_length=200, blank=True, help_text="Worker its batches run on; blank = any."
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ACTIVE)
    config = models.PositiveIntegerField(
        default=0, help_text="Graph version it has aligned with (its routing)."
    )
    target = models.PositiveIntegerField(
        default=0, help_text="Version of the adjustment it takes part in; > config = aligning."
    )
    expect = models.JSONField(
        default=list, help_text="Upstreams whose marker it waits for ('control' = injected)."
    )
    forward = models.JSONField(default=list, help_text="Downstreams it forwards the marker to.")
    tail = models.BooleanField(default=False)
    barrier = models.BooleanField(
        default=False,
        help_text="Holds data from after the markers until aligned (a changed keyed stage).",
    )
    aligned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_instance_name")]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.name} ({self.status})"

    @property
    def aligning(self) -> bool:
        return self.target > self.config


class Adjustment(models.Model):
    """One hot migration / scale out / scale in of a run, from plan to completion."""

    class Status(models.TextChoices):
        RUNNING = "running"
        COMPLETE = "complete"
        ROLLED_BACK = "rolled_back", "rolled back"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="adjustments")
    version = models.PositiveIntegerField()
    kind = models.CharField(max_length=20)
    reason = models.TextField()
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RUNNING)
    before = models.JSONField(help_text="The run's pipeline document before the change.")
    after = models.JSONField(help_text="The run's pipeline document after the change.")
    plan = models.JSONField(help_text="Subgraph, sources, tails, connections, key groups.")
    placement = models.JSONField(default=dict, help_text="New instances' workers.")
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "version"], name="one_adjustment_per_version")
        ]
        ordering = ["-version"]

    def __str__(self) -> str:
        return f"run {self.run_id} adjustment {self.version} ({self.kind}, {self.status})"


class KeyState(models.Model):
    """A stateful instance's running state of one group, per event-time window when its
    pipeline windows: each of the stage's measures as its partial state
    (sparkjobs/measures.py; a ``key``/``value`` stage's as the measures count, sum, min
    and max of its value)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="key_states")
    stage = models.CharField(max_length=100)
    holder = models.CharField(max_length=100)
    key = models.CharField(
        max_length=500,
        help_text="The key; of grouped measures, the SHA-256 of the group's values as JSON.",
    )
    window_us = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Start of the event-time window (null: over all time); dropped once "
        "the window closes.",
    )
    slot = models.PositiveSmallIntegerField(
        help_text="Key-space slot: crc32(key, or the group's values) mod slots."
    )
    states = models.JSONField(help_text="Each measure's partial state, by its name.")
    records = models.BigIntegerField(help_text="The records the state holds.")

    class Meta:
        constraints = [
            # All-time state has no window: null must conflict with null for the fold's
            # upsert to find the row.
            models.UniqueConstraint(
                fields=["run", "stage", "holder", "key", "window_us"],
                name="one_state_per_holder_key_window",
                nulls_distinct=False,
            )
        ]
        indexes = [models.Index(fields=["run", "stage", "slot"])]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.holder}[{self.key}]"


class Event(models.Model):
    """Something that happened to a run: a balancer action, an operator action, a step."""

    class Actor(models.TextChoices):
        BALANCER = "balancer"
        USER = "user"
        SYSTEM = "system"

    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    time = models.DateTimeField(auto_now_add=True, db_index=True)
    node = models.CharField(max_length=100, blank=True)
    kind = models.CharField(max_length=50)
    reason = models.TextField()
    actor = models.CharField(max_length=10, choices=Actor.choices, default=Actor.SYSTEM)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["run", "-time"])]

    def __str__(self) -> str:
        return f"{self.time:%H:%M:%S} {self.kind} {self.node}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "time": self.time.isoformat(),
            "node": self.node,
            "kind": self.kind,
            "reason": self.reason,
            "actor": self.user.get_username() if self.user else self.actor,
            "data": self.data,
        }


class SinkOwner(models.Model):
    """A sink's PostgreSQL table or Parquet folder and the pipeline that owns it: the
    first one to start a run writing it. Another pipeline naming it is refused, so one
    operator's pipeline cannot overwrite another's windows (orchestrator/ledger/sink_owners.py)."""

    class Kind(models.TextChoices):
        POSTGRES = "postgres"
        PARQUET = "parquet"

    kind = models.CharField(max_length=10, choices=Kind.choices)
    database = models.CharField(
        max_length=100, blank=True, help_text="A table's database, as the pipeline names it."
    )
    target = models.CharField(
        max_length=500, help_text="The table, or the folder below the sink root (resolved)."
    )
    pipeline_name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "database", "target"], name="one_owner_per_sink_target"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.database}.{self.target} of {self.pipeline_name}"


class OperatorQuota(models.Model):
    """What one operator may hold at once, set by an admin (one row): runs not over yet
    (pending, running, paused, stopping) and labs waiting or running. One operator's
    idle continuous runs hold control-worker threads and labs hold a CPU for everyone."""

    active_runs = models.PositiveSmallIntegerField(
        default=4, help_text="Runs not over yet one operator may have at once (0: none)."
    )
    active_labs = models.PositiveSmallIntegerField(
        default=2, help_text="Policy labs waiting or running one operator may have at once."
    )
    admins_exempt = models.BooleanField(
        default=True, help_text="Admins are not held to these quotas."
    )

    class Meta:
        verbose_name = "operator quota"

    def __str__(self) -> str:
        return f"{self.active_runs} active runs, {self.active_labs} labs per operator"

    @classmethod
    def current(cls) -> OperatorQuota:
        quota, _ = cls.objects.get_or_create(pk=1)
        return quota
