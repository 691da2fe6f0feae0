"""The small interface the console uses to reach the orchestrator.

The console (webapp/) never imports balancer/ or sparkjobs/ directly: what it needs of
them (the policy declaration, the operator catalog) comes through here, as will
starting, stopping, hot-migrating and snapshotting runs.
"""

from __future__ import annotations

from balancer.policy import (
    PARAMETERS,
    PARAMETERS_BY_NAME,
    Param,
    Policy,
    PolicyError,
)
from balancer.policy import validate as validate_policy
from orchestrator.batchjob import batch_summary
from orchestrator.generator import GeneratorError
from orchestrator.results import summary as run_summary
from orchestrator.runs import RunError, create_run, set_status, snapshot, start_run
from orchestrator.source import InputError
from sparkjobs.catalog import OPERATORS, OperatorSpec, validate_params


def workers_alive(timeout_s: float = 2.0) -> bool:
    """Does at least one Celery worker answer a ping?"""
    from orchestrator.celery import app

    return bool(app.control.ping(timeout=timeout_s))


__all__ = [
    "OPERATORS",
    "PARAMETERS",
    "PARAMETERS_BY_NAME",
    "GeneratorError",
    "InputError",
    "OperatorSpec",
    "Param",
    "Policy",
    "PolicyError",
    "RunError",
    "batch_summary",
    "create_run",
    "run_summary",
    "set_status",
    "snapshot",
    "start_run",
    "validate_params",
    "validate_policy",
    "workers_alive",
]
