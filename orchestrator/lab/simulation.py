"""A lab's simulation, in a process of its own.

``python -m balancer.sim.lab`` takes the replay and the policies on stdin and prints the
outcome. Run apart, niced, with a time and a memory limit: a simulation holds a CPU for
seconds, and the control worker's threads that asked for it drive live runs, whose ticks
must not wait on it; a workload too large for the limits fails the lab with that reason
instead of the worker.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from balancer.policy import Policy, PolicyError
from balancer.sim.control import BENCHMARK_POLICIES
from balancer.sim.lab import Arm, LabJson, request_of
from orchestrator.lab.replays import lab_replay
from orchestrator.ledger.calibration import CalibrationError
from orchestrator.models import PolicyLab
from orchestrator.pipeline.generator import GeneratorError

log = logging.getLogger(__name__)

PIPELINE_ARM = "pipeline"  # the pipeline's own policy, beside the benchmark's seven
PROJECT = Path(__file__).resolve().parents[2]
MAX_OUTPUT_BYTES = 16 * 2**20


class LabError(RuntimeError):
    """The simulation could not run; the message says why, for the lab's page."""


def arms_of(lab: PolicyLab) -> list[Arm]:
    """The pipeline's own policy, then every benchmark policy."""
    own = Arm(PIPELINE_ARM, "this pipeline's policy", Policy.from_mapping(lab.policy))
    return [own, *(Arm(p.name, p.label, p.policy()) for p in BENCHMARK_POLICIES.values())]


def arm_policy(lab: PolicyLab, name: str) -> dict[str, Any] | None:
    """The policy values of the lab's arm ``name``, or None when it has no such arm."""
    return next((a.policy.to_dict() for a in arms_of(lab) if a.name == name), None)


def simulate(lab_id: int) -> str:
    """Run the lab once: pending -> running -> done or failed. Returns its status."""
    with transaction.atomic():
        lab = PolicyLab.objects.select_for_update().filter(pk=lab_id).first()
        if lab is None or lab.status != PolicyLab.Status.PENDING:
            return lab.status if lab is not None else "gone"  # a redelivered task
        lab.status = PolicyLab.Status.RUNNING
        lab.save(update_fields=["status"])
    try:
        outcome = _simulate(lab)
    except LabError as problem:
        _finish(lab, PolicyLab.Status.FAILED, error=str(problem))
    except Exception as problem:
        log.exception("lab %s failed", lab_id)
        _finish(lab, PolicyLab.Status.FAILED, error=f"the simulation failed: {problem}")
    else:
        _finish(lab, PolicyLab.Status.DONE, result=outcome)
    return lab.status


def _simulate(lab: PolicyLab) -> LabJson:
    try:
        request = request_of(lab_replay(lab), arms_of(lab))
    except (CalibrationError, GeneratorError, PolicyError) as problem:
        raise LabError(str(problem)) from None
    timeout = settings.BPCONSOLE_LAB_TIMEOUT_S
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "balancer.sim.lab",
                "--nice",
                "10",
                "--memory-mb",
                str(settings.BPCONSOLE_LAB_MEMORY_MB),
            ],
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=timeout,
            cwd=PROJECT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LabError(
            f"the simulation took longer than {timeout:g} s (BPCONSOLE_LAB_TIMEOUT_S); "
            "try a smaller workload"
        ) from None
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [
            f"exit status {done.returncode}"
        ]
        if done.returncode < 0 or "MemoryError" in reason[0]:
            reason = [f"it ran out of memory or was killed (BPCONSOLE_LAB_MEMORY_MB, {reason[0]})"]
        raise LabError(f"the simulation failed: {reason[0][:500]}")
    if len(done.stdout) > MAX_OUTPUT_BYTES:
        raise LabError("the simulation's outcome is larger than a lab keeps")
    outcome: LabJson = json.loads(done.stdout)
    return outcome


def _finish(lab: PolicyLab, status: str, *, result: LabJson | None = None, error: str = "") -> None:
    lab.status = status
    lab.result = result
    lab.error = error
    lab.finished_at = timezone.now()
    lab.save(update_fields=["status", "result", "error", "finished_at"])
