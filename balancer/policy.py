"""Every tunable parameter of the five mechanisms, declared once.

The declaration (:data:`PARAMETERS`) is the single source of truth: the
:class:`Policy` dataclass, the console's Policy model, its admin form, the topology
file format and docs/balancing.md all follow it. Defaults and ranges are those of
docs/spec/.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from balancer.units import KB, MB

Kind = Literal["float", "int", "choice"]

THROTTLING_CHOICES = ("none", "stop_resume", "credit", "watermark", "stepwise", "window")
ROUTING_CHOICES = ("static", "water_level", "measured")
MIGRATION_CHOICES = ("off", "pressure", "proportional")
PLACEMENT_CHOICES = ("pooled", "placed")
KEY_MOVE_CHOICES = ("auto", "off")
SCALE_OUT_CHOICES = ("flags", "measured", "off")


@dataclass(frozen=True)
class Param:
    """One policy parameter: how it is named, shown, defaulted and bounded."""

    name: str
    label: str
    default: float | int | str
    description: str
    mechanism: str
    kind: Kind = "float"
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True
    choices: tuple[str, ...] = ()

    def range_text(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        lo = "(" if not self.min_inclusive else "["
        hi = ")" if not self.max_inclusive else "]"
        lo_v = "-inf" if self.minimum is None else _fmt(self.minimum)
        hi_v = "inf" if self.maximum is None else _fmt(self.maximum)
        return f"{lo}{lo_v}, {hi_v}{hi}"

    def check(self, value: object) -> str | None:
        """Return why ``value`` is not acceptable for this parameter, or None."""
        if self.kind == "choice":
            if value not in self.choices:
                return f"{self.name}: {value!r} is not {self.range_text()}"
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{self.name}: expected a number, got {value!r}"
        if self.kind == "int" and not float(value).is_integer():
            return f"{self.name}: expected a whole number, got {value!r}"
        if not math.isfinite(value):
            return f"{self.name}: {value!r} is not a finite number"
        too_low = self.minimum is not None and (
            value < self.minimum or (not self.min_inclusive and value == self.minimum)
        )
        too_high = self.maximum is not None and (
            value > self.maximum or (not self.max_inclusive and value == self.maximum)
        )
        if too_low or too_high:
            return f"{self.name}: {_fmt(value)} is outside {self.range_text()}"
        return None


def _fmt(value: float) -> str:
    return f"{value:g}"


PARAMETERS: tuple[Param, ...] = (
    # Strategy: which layer does what (they compose).
    Param(
        "throttling",
        "Throttling",
        "watermark",
        "How upstreams are slowed down when downstreams fill up.",
        "strategy",
        kind="choice",
        choices=THROTTLING_CHOICES,
    ),
    Param(
        "routing",
        "Routing",
        "water_level",
        "How an upstream splits traffic among interchangeable downstreams. static: by "
        "the data's tag; water_level: shares move from the fullest to emptier peers; "
        "measured: shares in proportion to the instances' measured capacities.",
        "strategy",
        kind="choice",
        choices=ROUTING_CHOICES,
    ),
    Param(
        "migration",
        "Migration",
        "pressure",
        "Whether data of a backpressured branch is sent through light branches "
        "(proportional: only each branch's predicted excess, and data already waiting in "
        "a pool that would empty late moves to its stage's siblings).",
        "strategy",
        kind="choice",
        choices=MIGRATION_CHOICES,
    ),
    Param(
        "placement",
        "Placement",
        "pooled",
        "Where an operator instance's batches run. pooled: any Spark worker takes any "
        "batch, and a stage's instances share the pool (one job may run several of "
        "them). placed: each instance has a Spark worker of its own, its batches run "
        "there only, and the balancer moves data between instances on different workers.",
        "strategy",
        kind="choice",
        choices=PLACEMENT_CHOICES,
    ),
    Param(
        "key_moves",
        "Key-group moves",
        "auto",
        "A keyed stage whose backpressured instance holds a hot key group. auto: the "
        "balancer moves key groups, with their state, so that each instance takes as "
        "many records as its peers (by hot rescale, exactly); off: key groups stay even. "
        "Instances that share a resource never move key groups between them.",
        "strategy",
        kind="choice",
        choices=KEY_MOVE_CHOICES,
    ),
    Param(
        "tick_ms",
        "Balancer tick",
        500,
        "Period of the load-balance loop.",
        "loop",
        kind="int",
        unit="ms",
        minimum=50,
        maximum=60_000,
    ),
    # watermark-flags.md
    Param(
        "high_water",
        "High water (H)",
        0.7,
        "Level at or above which a node is flagged.",
        "watermark",
        minimum=0.6,
        maximum=0.9,
    ),
    Param(
        "low_water",
        "Low water (W)",
        0.2,
        "Level at or below which a node's flag is cleared.",
        "watermark",
        minimum=0.1,
        maximum=0.4,
    ),
    Param(
        "watermark_step",
        "Watermark step",
        0.1,
        "How far H and W move together when they adapt.",
        "watermark",
        minimum=0.0,
        maximum=0.3,
        min_inclusive=False,
    ),
    Param(
        "bp_window_s",
        "Backpressure window (T)",
        60.0,
        "Window over which the duty (share of samples at or above H) is measured.",
        "watermark",
        unit="s",
        minimum=0.0,
        min_inclusive=False,
    ),
    Param(
        "duty_ratio",
        "Preset duty ratio (D)",
        0.5,
        "Duty at or above which H and W are raised.",
        "watermark",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "sampling_period_s",
        "Sampling period",
        1.0,
        "How often each node's level is sampled.",
        "watermark",
        unit="s",
        minimum=0.0,
        min_inclusive=False,
    ),
    Param(
        "rate_initial",
        "Initial rate coefficient (k)",
        1.0,
        "Fraction of its maximum rate an upstream starts at.",
        "rate",
        minimum=0.1,
        maximum=1.0,
    ),
    Param(
        "rate_step",
        "Rate step",
        0.1,
        "How much k moves per change in the count of flagged downstreams.",
        "rate",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "rate_min",
        "Minimum rate coefficient (k_min)",
        0.2,
        "Below this, more flags ask for a scale-out instead of slowing further.",
        "rate",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "rate_floor",
        "Rate floor",
        0.1,
        "k never goes below this, so data never stops flowing.",
        "rate",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "scale_out_ratio",
        "Scale-out ratio (S)",
        0.5,
        "Share of a stage that must be flagged to request a scale-out.",
        "rate",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "scale_out",
        "Scale-out trigger",
        "flags",
        "When the balancer asks for more instances of a stage. flags: when the rate "
        "coefficient is at its floor and S of the stage is flagged (watermark "
        "throttling); measured: when the input the stage must take (the source's "
        "arrival rate plus its backlog over the horizon) has exceeded its measured "
        "capacity for the ticks below; off: never. Either way the request asks, in one "
        "step, for as many instances as the measured rates need (one while they are "
        "not measured, or run on the shared pool), instances sharing a worker counted "
        "once.",
        "scaling",
        kind="choice",
        choices=SCALE_OUT_CHOICES,
    ),
    Param(
        "scale_out_horizon_s",
        "Backlog horizon (H)",
        60.0,
        "Seconds over which a scale-out sized from measured rates plans to drain the "
        "source's backlog.",
        "scaling",
        unit="s",
        minimum=1.0,
        maximum=3600.0,
    ),
    Param(
        "scale_out_ticks",
        "Overloaded ticks",
        3,
        "Ticks in a row a stage must be overloaded before the measured trigger asks "
        "for more instances.",
        "scaling",
        kind="int",
        minimum=1,
        maximum=100,
    ),
    Param(
        "balance_step",
        "Balance step",
        0.1,
        "Share of the fullest node's traffic moved to emptier peers per tick.",
        "routing",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "min_share",
        "Minimum share",
        0.05,
        "No interchangeable downstream gets less than this share.",
        "routing",
        minimum=0.0,
        maximum=0.5,
        max_inclusive=False,
    ),
    # stepwise-backpressure.md
    Param(
        "overload_mb",
        "Overload threshold",
        50.0,
        "Buffered data at which a task is overloaded.",
        "stepwise",
        unit="MB",
        minimum=0.0,
        min_inclusive=False,
    ),
    Param(
        "underload_kb",
        "Underload threshold",
        500.0,
        "Buffered data at or below which a task is underloaded.",
        "stepwise",
        unit="KB",
        minimum=0.0,
    ),
    Param(
        "sensitivity_ms",
        "Sensitivity",
        2000,
        "How long underload must last, and the minimum period between two evaluations of a task.",
        "stepwise",
        kind="int",
        unit="ms",
        minimum=1,
    ),
    Param(
        "backpressure_step",
        "Backpressure step (v)",
        0.5,
        "Speed multiplier on slow-down; restore multiplies by 1/v.",
        "stepwise",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
        max_inclusive=False,
    ),
    # adaptive-window.md
    Param(
        "window_initial",
        "Initial window",
        4,
        "Batches in flight per consumer at start.",
        "window",
        kind="int",
        minimum=1,
        maximum=1024,
    ),
    Param(
        "window_min",
        "Minimum window",
        1,
        "Smallest send window.",
        "window",
        kind="int",
        minimum=1,
        maximum=1024,
    ),
    Param(
        "window_max",
        "Maximum window",
        64,
        "Largest send window.",
        "window",
        kind="int",
        minimum=1,
        maximum=1024,
    ),
    Param(
        "rt_threshold_s",
        "Round-trip threshold",
        2.0,
        "An ack slower than this shrinks the window.",
        "window",
        unit="s",
        minimum=0.0,
        min_inclusive=False,
    ),
    Param(
        "batch_timeout_s",
        "Batch timeout",
        30.0,
        "An unacked batch older than this is resent elsewhere.",
        "window",
        unit="s",
        minimum=0.0,
        min_inclusive=False,
    ),
    # Credit-based flow control (baseline).
    Param(
        "credit_interval_ms",
        "Credit interval",
        100,
        "How often downstreams report free space to upstreams.",
        "credit",
        kind="int",
        unit="ms",
        minimum=1,
    ),
    # pressure-migration.md
    Param(
        "bp_threshold",
        "Backpressure threshold",
        0.8,
        "Queue usage above which a node with input faster than output is a backpressure node.",
        "migration",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
        max_inclusive=False,
    ),
    Param(
        "recovery_threshold",
        "Recovery threshold",
        0.5,
        "Queue usage below which a backpressure node counts as relieved.",
        "migration",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
        max_inclusive=False,
    ),
    Param(
        "recovery_check",
        "Recovery check",
        1,
        "Ticks between two checks of the nodes on the backpressure list.",
        "migration",
        kind="int",
        unit="ticks",
        minimum=1,
    ),
    Param(
        "migration_share",
        "Migration share",
        1.0,
        "Share of the heavy branch's new data sent to the light branch.",
        "migration",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
    ),
    Param(
        "alpha",
        "Pressure score alpha",
        0.3,
        "Weight of queue usage against the I/O rate gap.",
        "migration",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
        max_inclusive=False,
    ),
    Param(
        "beta",
        "Pressure score beta",
        0.5,
        "Exponent of the normalised bottleneck bandwidth.",
        "migration",
        minimum=0.0,
        min_inclusive=False,
        maximum=10.0,
    ),
    # hot-rescale.md
    Param(
        "adjust_timeout_s",
        "Adjustment timeout",
        30.0,
        "A hot rescale not complete after this is rolled back.",
        "rescale",
        unit="s",
        minimum=0.0,
        min_inclusive=False,
        maximum=3600.0,
    ),
    # Placed runs' own Spark workers (docs/runtime.md, "Placement and elastic Spark
    # workers"): when one goes back to the elastic pool.
    Param(
        "scale_in_busy",
        "Scale-in busy share",
        0.25,
        "A placed run with Spark workers of its own gives one back once every operator "
        "instance has kept its worker busy less than this share of the time for "
        "scale_in_after_s (with scale_out measured: once the stage's other workers take "
        "its target with a quarter to spare by their measured rates).",
        "elastic",
        minimum=0.0,
        maximum=1.0,
        min_inclusive=False,
        max_inclusive=False,
    ),
    Param(
        "scale_in_after_s",
        "Scale-in after",
        60.0,
        "How long the run must not need its newest worker of its own (see "
        "scale_in_busy) before the instance on it is removed by hot rescale and that "
        "worker goes back to the pool.",
        "elastic",
        unit="s",
        minimum=5.0,
        maximum=3600.0,
    ),
    # Not a balancing mechanism: how the runtime treats a batch that keeps failing.
    Param(
        "max_batch_attempts",
        "Batch attempts",
        3,
        "A batch whose operator fails this many times fails the run, with the error, "
        "node and segment; a batch lost with its worker is not a failure of the batch.",
        "runtime",
        kind="int",
        unit="attempts",
        minimum=1,
        maximum=20,
    ),
)

PARAMETERS_BY_NAME: Mapping[str, Param] = {p.name: p for p in PARAMETERS}


def _default(name: str) -> Any:
    return PARAMETERS_BY_NAME[name].default


@dataclass(frozen=True)
class Policy:
    """The effective parameters of one run; build it with :meth:`from_mapping`.

    Field defaults come from :data:`PARAMETERS`; a test keeps the two in step.
    """

    throttling: str = _default("throttling")
    routing: str = _default("routing")
    migration: str = _default("migration")
    placement: str = _default("placement")
    key_moves: str = _default("key_moves")
    tick_ms: int = _default("tick_ms")
    high_water: float = _default("high_water")
    low_water: float = _default("low_water")
    watermark_step: float = _default("watermark_step")
    bp_window_s: float = _default("bp_window_s")
    duty_ratio: float = _default("duty_ratio")
    sampling_period_s: float = _default("sampling_period_s")
    rate_initial: float = _default("rate_initial")
    rate_step: float = _default("rate_step")
    rate_min: float = _default("rate_min")
    rate_floor: float = _default("rate_floor")
    scale_out_ratio: float = _default("scale_out_ratio")
    scale_out: str = _default("scale_out")
    scale_out_horizon_s: float = _default("scale_out_horizon_s")
    scale_out_ticks: int = _default("scale_out_ticks")
    balance_step: float = _default("balance_step")
    min_share: float = _default("min_share")
    overload_mb: float = _default("overload_mb")
    underload_kb: float = _default("underload_kb")
    sensitivity_ms: int = _default("sensitivity_ms")
    backpressure_step: float = _default("backpressure_step")
    window_initial: int = _default("window_initial")
    window_min: int = _default("window_min")
    window_max: int = _default("window_max")
    rt_threshold_s: float = _default("rt_threshold_s")
    batch_timeout_s: float = _default("batch_timeout_s")
    credit_interval_ms: int = _default("credit_interval_ms")
    bp_threshold: float = _default("bp_threshold")
    recovery_threshold: float = _default("recovery_threshold")
    recovery_check: int = _default("recovery_check")
    migration_share: float = _default("migration_share")
    alpha: float = _default("alpha")
    beta: float = _default("beta")
    adjust_timeout_s: float = _default("adjust_timeout_s")
    scale_in_busy: float = _default("scale_in_busy")
    scale_in_after_s: float = _default("scale_in_after_s")
    max_batch_attempts: int = _default("max_batch_attempts")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None = None) -> Policy:
        """Defaults overridden by ``values``; raises :class:`PolicyError` if invalid."""
        merged = {p.name: p.default for p in PARAMETERS}
        merged.update(values or {})
        errors = validate(merged)
        if errors:
            raise PolicyError(errors)
        return cls(**{p.name: _coerce(p, merged[p.name]) for p in PARAMETERS})

    def replace(self, **changes: Any) -> Policy:
        return Policy.from_mapping({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def overload_bytes(self) -> float:
        return self.overload_mb * MB

    @property
    def underload_bytes(self) -> float:
        return self.underload_kb * KB


class PolicyError(ValueError):
    """Invalid policy values; ``errors`` lists every problem, one sentence each."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def _coerce(param: Param, value: Any) -> Any:
    if param.kind == "int":
        return int(value)
    if param.kind == "float":
        return float(value)
    return value


CROSS_FIELD_RULES: tuple[tuple[str, str, str], ...] = (
    ("low_water", "high_water", "low water must be below high water"),
    ("underload_kb", "overload_mb", "underload must be below overload"),
    (
        "recovery_threshold",
        "bp_threshold",
        "recovery threshold must be below the backpressure threshold",
    ),
    ("rate_floor", "rate_min", "rate floor must not exceed the minimum rate coefficient"),
    ("window_min", "window_max", "window minimum must not exceed the maximum"),
)


def validate(values: Mapping[str, Any]) -> list[str]:
    """Every problem with ``values`` (a complete or partial set), in declaration order."""
    errors = [
        f"{name}: unknown policy parameter" for name in values if name not in PARAMETERS_BY_NAME
    ]
    for param in PARAMETERS:
        if param.name in values:
            problem = param.check(values[param.name])
            if problem:
                errors.append(problem)
    if errors:
        return errors
    for low, high, message in CROSS_FIELD_RULES:
        if low in values and high in values:
            low_v, high_v = _comparable(low, values[low]), _comparable(high, values[high])
            strict = low not in {"rate_floor", "window_min"}
            if low_v > high_v or (strict and low_v == high_v):
                errors.append(f"{low}: {message} ({values[low]} vs {high}={values[high]})")
    window = ("window_min", "window_initial", "window_max")
    if all(name in values for name in window) and not (
        values["window_min"] <= values["window_initial"] <= values["window_max"]
    ):
        errors.append("window_initial: must lie between window_min and window_max")
    return errors


def _comparable(name: str, value: float) -> float:
    # Overload is in MB and underload in KB; compare both in bytes.
    if name == "overload_mb":
        return value * MB
    if name == "underload_kb":
        return value * KB
    return value
