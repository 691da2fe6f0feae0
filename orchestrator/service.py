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
from sparkjobs.catalog import OPERATORS, OperatorSpec, validate_params

__all__ = [
    "OPERATORS",
    "PARAMETERS",
    "PARAMETERS_BY_NAME",
    "OperatorSpec",
    "Param",
    "Policy",
    "PolicyError",
    "validate_params",
    "validate_policy",
]
