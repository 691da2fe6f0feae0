"""Runs, the durable segment ledger, the sink's merge ledger, results and events."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models


class Run(models.Model):
    """One execution of a pipeline over an input, with the policy it started with."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        PAUSED = "paused"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE = (Status.PENDING, Status.RUNNING, Status.PAUSED)

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
    source_position = models.JSONField(
        default=dict, help_text="Where the source resumes: file index and byte offset."
    )
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"run {self.pk} of {self.pipeline_name} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


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
    records = models.IntegerField(default=0)
    malformed = models.IntegerField(default=0)
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    available_at = models.DateTimeField(help_text="When it arrives (emulated link).")
    migrated_from = models.CharField(
        max_length=100, blank=True, help_text="The branch it was meant for, if migrated."
    )
    epoch = models.PositiveIntegerField(default=0)
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
    segment = models.CharField(max_length=200)
    sink = models.CharField(max_length=100)
    merged_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "chunk"], name="chunk_merged_once")]

    def __str__(self) -> str:
        return f"run {self.run_id} chunk {self.chunk}"


class ResultKey(models.Model):
    """Per-key result of an aggregating pipeline; avg is sum / count at read time."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="result_keys")
    key = models.CharField(max_length=500)
    count = models.BigIntegerField()
    sum = models.DecimalField(max_digits=38, decimal_places=10)
    min = models.DecimalField(max_digits=38, decimal_places=10)
    max = models.DecimalField(max_digits=38, decimal_places=10)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="one_row_per_key")]

    def __str__(self) -> str:
        return f"run {self.run_id} key {self.key}"


class ResultDistinct(models.Model):
    """The exact set behind the distinct count: one row per (key, value)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="result_distinct")
    key = models.CharField(max_length=500)
    value = models.CharField(max_length=500)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "key", "value"], name="distinct_value_once")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.key}={self.value}"


class Throttle(models.Model):
    """Token bucket of an emulated node rate or link bandwidth: busy until ``free_at``."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="throttles")
    name = models.CharField(max_length=220, help_text="node:<name> or link:<src>><dst>")
    free_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="one_bucket")]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.name} free at {self.free_at}"


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
