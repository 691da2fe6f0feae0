"""Pipelines (nodes and edges) and the policies that tune their balancing."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models

from orchestrator.service import (
    DEFAULT_BUFFER_MB,
    OPERATORS,
    PARAMETERS,
    Param,
    validate_params,
    validate_policy,
)

NAME_VALIDATOR = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
    "Use letters, digits, '_', '.' or '-', starting with a letter or digit.",
)


def _help_text(param: Param) -> str:
    if param.kind == "choice":
        return param.description
    unit = f", in {param.unit}" if param.unit else ""
    return f"{param.description} Range {param.range_text()}{unit}."


def _policy_field(param: Param) -> models.Field[Any, Any]:
    common: dict[str, Any] = {
        "default": param.default,
        "verbose_name": param.label,
        "help_text": _help_text(param),
    }
    if param.kind == "choice":
        return models.CharField(
            max_length=32, choices=[(c, c.replace("_", " ")) for c in param.choices], **common
        )
    if param.kind == "int":
        return models.IntegerField(**common)
    return models.FloatField(**common)


class Policy(models.Model):
    """A named set of every balancing parameter; exactly one is the default."""

    name = models.CharField(max_length=100, unique=True, validators=[NAME_VALIDATOR])
    description = models.TextField(blank=True)
    is_default = models.BooleanField(
        default=False, help_text="Used by pipelines that do not name a policy."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "policies"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="one_default_policy",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} (default)" if self.is_default else self.name

    def values(self) -> dict[str, Any]:
        return {p.name: getattr(self, p.name) for p in PARAMETERS}

    def clean(self) -> None:
        problems = validate_policy(self.values())
        if problems:
            raise ValidationError(_errors_by_field(problems))

    @classmethod
    def default(cls) -> Policy:
        policy, _ = cls.objects.get_or_create(
            is_default=True, defaults={"name": "default", "description": "Shipped defaults."}
        )
        return policy


# One model field per declared parameter: the declaration in balancer/policy.py is
# the only place a parameter, its default or its range is written down.
for _param in PARAMETERS:
    Policy.add_to_class(_param.name, _policy_field(_param))


def _errors_by_field(problems: list[str]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for problem in problems:
        name, _, message = problem.partition(": ")
        field = name if name in _PARAM_NAMES else "__all__"
        errors.setdefault(field, []).append(message or problem)
    return errors


_PARAM_NAMES = frozenset(p.name for p in PARAMETERS)


class Pipeline(models.Model):
    """A topology of source, operator and sink nodes joined by edges."""

    name = models.CharField(max_length=100, unique=True, validators=[NAME_VALIDATOR])
    description = models.TextField(blank=True)
    policy = models.ForeignKey(
        Policy,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="pipelines",
        help_text="Base policy; empty means the default policy.",
    )
    policy_overrides = models.JSONField(
        default=dict,
        blank=True,
        help_text="Parameters that differ from the base policy for this pipeline only.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def base_policy(self) -> Policy:
        return self.policy or Policy.default()

    def effective_policy_values(self) -> dict[str, Any]:
        return {**self.base_policy().values(), **(self.policy_overrides or {})}

    def clean(self) -> None:
        if not isinstance(self.policy_overrides, dict):
            raise ValidationError({"policy_overrides": "must be a mapping of parameter: value"})
        problems = validate_policy(self.effective_policy_values())
        if problems:
            raise ValidationError({"policy_overrides": problems})


class Node(models.Model):
    class Kind(models.TextChoices):
        SOURCE = "source", "source"
        OPERATOR = "operator", "operator"
        SINK = "sink", "sink"

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=100, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=10, choices=Kind.choices)
    stage = models.CharField(
        max_length=100,
        blank=True,
        help_text="Parallel nodes running the same operator share a stage; empty = own name.",
    )
    operator = models.CharField(
        max_length=50, choices=[(name, name) for name in OPERATORS], help_text="What it runs."
    )
    params = models.JSONField(default=dict, blank=True, help_text="Operator parameters.")
    buffer_mb = models.FloatField(
        default=DEFAULT_BUFFER_MB,
        validators=[MinValueValidator(0.001)],
        help_text="Capacity of the node's data pool; its water level is queued MB over this.",
    )
    max_rate_mbps = models.FloatField(
        default=0.0,
        validators=[MinValueValidator(0.0)],
        help_text="Emulated maximum processing rate in Mb/s; 0 = unlimited.",
    )

    class Meta:
        ordering = ["pipeline", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "name"], name="unique_node_name")
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name}/{self.name}"

    @property
    def stage_name(self) -> str:
        return self.stage or self.name

    def clean(self) -> None:
        problems = validate_params(self.operator, self.kind, self.params or {})
        if problems:
            raise ValidationError({"params": problems})


class Edge(models.Model):
    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="edges")
    source = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="out_edges")
    target = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="in_edges")
    bandwidth_mbps = models.FloatField(
        default=0.0,
        validators=[MinValueValidator(0.0)],
        help_text="Emulated link bandwidth in Mb/s; 0 = unlimited.",
    )

    class Meta:
        ordering = ["pipeline", "id"]
        constraints = [
            models.UniqueConstraint(fields=["source", "target"], name="unique_edge"),
            models.CheckConstraint(
                condition=~models.Q(source=models.F("target")), name="no_self_loop"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source.name} -> {self.target.name}"

    def clean(self) -> None:
        errors = {}
        if self.source_id and self.source.pipeline_id != self.pipeline_id:
            errors["source"] = "must be a node of the same pipeline"
        if self.target_id and self.target.pipeline_id != self.pipeline_id:
            errors["target"] = "must be a node of the same pipeline"
        if errors:
            raise ValidationError(errors)
