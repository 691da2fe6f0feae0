"""What an operator can do to runs, shared by the HTML views and the JSON API.

Every action checks the user's role first. A refusal is recorded as an event (with the
user and what they tried) before the caller answers 403, so refused attempts show in the
run's timeline and on the activity page, not only in a log file. Repeated refusals of
one user's action on one run fold into that one event (its count goes up), and only a
node of the run is named as the event's node (``service.record_refusal``): a refused
user cannot flood the timeline or write text of their choosing into it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import models as auth

from orchestrator import service
from orchestrator.models import OperatorQuota
from webapp.console.models import Pipeline, Policy
from webapp.console.roles import Role, has_role, role_of
from webapp.console.topology_io import export_document
from webapp.console.validation import shown

log = logging.getLogger("webapp.console.audit")

# A request's user, as django-stubs type it (AUTH_USER_MODEL is Django's own).
User = auth.User | auth.AnonymousUser

# "stop" asks an unbounded run to stop reading and complete once what it took in is
# merged (set_status makes it "cancelled" for a bounded run, which has nothing to drain);
# "cancel" abandons any active run at once.
RUN_CONTROLS = {"pause": "paused", "resume": "running", "stop": "stopping", "cancel": "cancelled"}


class ActionError(Exception):
    """An action that cannot be done as asked; nothing was changed.

    ``status`` is the HTTP status the caller answers with (400, 403, 404, 409, 429).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Refused(ActionError):
    def __init__(self, message: str) -> None:
        super().__init__(message, status=403)


def require(
    user: User,
    role: Role,
    *,
    action: str,
    run_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Raise :class:`Refused` (after recording it) unless ``user`` holds ``role``."""
    if has_role(user, role):
        return
    held = role_of(user) or "no role"
    name = user.get_username() if user.is_authenticated else "anonymous"
    reason = f"{name} ({held}) tried to {action.replace('_', ' ')}: this needs the {role} role"
    log.warning("refused: %s", reason)
    if user.is_authenticated:
        service.record_refusal(run_id=run_id, action=action, user=user, reason=reason, data=data)
    raise Refused(
        f"refused: {action.replace('_', ' ')} needs the {role} role (you are {held}); "
        "the attempt was recorded"
    )


def require_own_run(
    user: User, run: Any, *, action: str, data: dict[str, Any] | None = None
) -> None:
    """Raise :class:`Refused` (after recording it) when ``run`` was started by another
    operator: a run is steered by whoever started it, or by an admin. A run started
    from the server's shell (no one's, like the demo) is any operator's to steer."""
    owner = run.created_by
    if owner is None or owner.pk == user.pk or has_role(user, "admin"):
        return
    reason = (
        f"{user.get_username()} tried to {action.replace('_', ' ')} run {run.pk}, "
        f"started by {owner.get_username()}"
    )
    log.warning("refused: %s", reason)
    service.record_refusal(run_id=run.pk, action=action, user=user, reason=reason, data=data)
    raise Refused(
        f"refused: run {run.pk} was started by {owner.get_username()}; only they or an "
        "admin may steer it (the attempt was recorded)"
    )


def quota_of(user: User) -> OperatorQuota | None:
    """The operator quota ``user`` is held to, or None for an admin it exempts."""
    quota = OperatorQuota.current()
    if quota.admins_exempt and has_role(user, "admin"):
        return None
    return quota


def over_quota(
    user: User, action: str, exc: service.RunQuotaExceeded | service.LabQuotaExceeded
) -> ActionError:
    """A 429 for an action over the user's quota, recorded as refusals are."""
    reason = f"refused: {exc}"
    service.record_refusal(
        run_id=None, action=action, user=user, reason=reason, data={"limit": exc.limit}
    )
    return ActionError(reason, status=429)


def get_run(run_id: int) -> Any:
    try:
        return service.get_run(run_id)
    except service.RunNotFound as exc:
        raise ActionError(str(exc), status=404) from None


@dataclass(frozen=True)
class RunRequest:
    pipeline: str
    generator: str | None = None
    input_path: str | None = None
    policy: str | None = None
    # An unbounded source as the operator sent it: {"kind": "folder" | "stream", ...}
    # (SOURCE_FIELDS); checked by ``checked_source``.
    source: Mapping[str, Any] | None = None


# The fields of each unbounded source an operator may give, with the most characters
# each may have: every value is bounded here, before the orchestrator's checks read it
# (paths as orchestrator/pipeline/inputs.py's MAX_PATH_CHARS, names as its stream names).
SOURCE_FIELDS: dict[str, dict[str, int]] = {
    "folder": {
        "folder": 1000,
        "pattern": 200,
        "stable_s": 32,
        "clean": 16,
        "archive": 1000,
        "checkpoint": 200,
    },
    "stream": {
        "stream": 200,
        "group": 200,
        "start": 16,
        "linger_s": 32,
        "partitions": 8,
        "idle_s": 32,
        "url": 500,
    },
}


def effective_policy(pipeline: Pipeline, policy_name: str | None) -> dict[str, Any]:
    """The chosen named policy (or the pipeline's own) plus the pipeline's overrides,
    as ``manage.py run_pipeline --policy`` computes it."""
    if policy_name:
        base = Policy.objects.filter(name=policy_name).first()
        if base is None:
            known = ", ".join(Policy.objects.values_list("name", flat=True))
            raise ActionError(f"unknown policy {shown(policy_name)} (known: {known})")
    else:
        base = pipeline.base_policy()
    return {**base.values(), **(pipeline.policy_overrides or {})}


def input_roots() -> list[Path]:
    return [Path(p).resolve() for p in settings.INPUT_ROOTS]


def checked_input_files(raw: str) -> list[str]:
    """The files an input path (or glob) from the browser names, every one resolved and
    inside the configured input folders: an operator must not turn any file the server
    can read into a run's input (orchestrator/pipeline/inputs.py ``confined_files``)."""
    try:
        return service.confined_files(
            raw, input_roots(), follow_symlinks=settings.INPUT_FOLLOW_SYMLINKS
        )
    except service.InputError as exc:
        raise ActionError(str(exc)) from None


def sample_schema(body: Any, user: User) -> service.Sample:
    """The schema the first records of an input file suggest (an operator's: it reads
    a file below the input folders, as a run would)."""
    require(user, "operator", action="sample_input")
    if not isinstance(body, Mapping):
        raise ActionError("the body must be an object: path and format")
    path, fmt = body.get("path"), body.get("format", "jsonl")
    if not isinstance(path, str) or not isinstance(fmt, str):
        raise ActionError("path and format must be text")
    try:
        return service.sample_schema(
            path, fmt, input_roots(), follow_symlinks=settings.INPUT_FOLLOW_SYMLINKS
        )
    except service.InputError as exc:
        raise ActionError(str(exc)) from None


def bounded_source(raw: Any) -> tuple[str, dict[str, str | float]]:
    """The kind of an unbounded source and its fields, each a string or a number of
    bounded length; empty values are left out (the source's defaults apply)."""
    if not isinstance(raw, Mapping):
        raise ActionError("source must be an object: a kind (folder or stream) and its fields")
    kind = raw.get("kind")
    if not isinstance(kind, str) or kind not in SOURCE_FIELDS:
        raise ActionError(
            f"source.kind must be one of {', '.join(SOURCE_FIELDS)}, not {shown(kind)}"
        )
    limits = SOURCE_FIELDS[kind]
    fields: dict[str, str | float] = {}
    for name, value in raw.items():
        if name == "kind" or value is None or value == "":
            continue
        if name not in limits:
            raise ActionError(
                f"a {kind} source has no field {shown(name)}; its fields are {', '.join(limits)}"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ActionError(f"source.{name} must be a string or a number")
        if len(str(value)) > limits[name]:
            raise ActionError(
                f"source.{name} has {len(str(value))} characters; at most {limits[name]}"
            )
        fields[name] = value
    return kind, fields


def checked_source(raw: Any, fmt: str) -> service.UnboundedSpec:
    """A landing folder (inside the input roots, like any console input) or a Redis
    stream (on the console's Redis or one the administrator listed) from what the
    operator sent; ``fmt`` is what the pipeline's source node reads."""
    kind, fields = bounded_source(raw)
    try:
        if kind == "folder":
            return service.check_landing(fields, fmt=fmt, roots=input_roots())
        return service.check_stream(
            fields, default_url=settings.REDIS_URL, allowed_urls=settings.BPCONSOLE_STREAM_URLS
        )
    except service.InputError as exc:
        raise ActionError(f"source: {exc}") from None


def source_format(topology: Mapping[str, Any]) -> str:
    """The format the pipeline's source node reads (a landing folder's files are in it)."""
    source = next((n for n in topology["nodes"] if n["kind"] == "source"), None)
    return str(((source or {}).get("params") or {}).get("format", "jsonl"))


def run_inputs(request: RunRequest, topology: Mapping[str, Any]) -> dict[str, Any]:
    """What ``service.create_run`` reads, from exactly one of the request's inputs."""
    given = [request.generator, request.input_path, request.source]
    if sum(1 for g in given if g) != 1:
        raise ActionError(
            "give exactly one of an input path (or glob), a generator spec and a source "
            "(a landing folder or a Redis stream)"
        )
    if request.generator:
        return {"generator": request.generator.strip()}
    if request.input_path:
        return {"input_path": checked_input_files(request.input_path)}
    return {"source": checked_source(request.source, source_format(topology))}


def start_run(request: RunRequest, user: User) -> Any:
    """Create and start a run of a saved pipeline; raises :class:`ActionError`."""
    pipeline = Pipeline.objects.filter(name=request.pipeline).first()
    require(user, "operator", action="start_run", data={"pipeline": request.pipeline})
    if pipeline is None:
        raise ActionError(f"there is no pipeline {shown(request.pipeline)}", status=404)
    topology = export_document(pipeline)
    inputs = run_inputs(request, topology)
    values = effective_policy(pipeline, request.policy)
    quota = quota_of(user)
    try:
        run = service.create_run(
            topology=topology,
            policy=values,
            pipeline_id=pipeline.pk,
            user=user,
            max_active=quota.active_runs if quota else None,
            **inputs,
        )
    except service.RunQuotaExceeded as exc:
        raise over_quota(user, "start_run", exc) from None
    except (service.InputError, service.GeneratorError, service.RunError) as exc:
        raise ActionError(str(exc)) from None
    except service.PolicyError as exc:
        raise ActionError(f"the policy does not validate: {exc}") from None
    _hand_over(run, user)
    log.info("%s started run %s of %s", user.get_username(), run.pk, pipeline.name)
    return run


def _hand_over(run: Any, user: User) -> None:
    try:
        service.start_run(run)
    except Exception as exc:  # the broker is unreachable: the run cannot start
        log.exception("run %s could not be handed to a worker", run.pk)
        service.set_status(
            run.pk, "cancelled", user=user, reason=f"could not be handed to a worker: {exc}"
        )
        raise ActionError(
            f"run {run.pk} could not be handed to a worker ({exc}); "
            "is the Celery broker (Redis) up?",
            status=503,
        ) from None


def create_lab(
    pipeline_name: str, user: User, *, generator: str | None = None, run_id: int | None = None
) -> Any:
    """Simulate every policy on a workload of the pipeline (a generator spec or one of
    its completed runs), in a worker; returns the pending lab."""
    pipeline = Pipeline.objects.filter(name=pipeline_name).first()
    require(user, "operator", action="run_policy_lab", data={"pipeline": pipeline_name})
    if pipeline is None:
        raise ActionError(f"there is no pipeline {shown(pipeline_name)}", status=404)
    quota = quota_of(user)
    try:
        lab = service.create_lab(
            pipeline_id=pipeline.pk,
            topology=export_document(pipeline),
            policy=pipeline.effective_policy_values(),
            generator=generator,
            run_id=run_id,
            user=user,
            max_active=quota.active_labs if quota else None,
        )
    except service.LabQuotaExceeded as exc:
        raise over_quota(user, "run_policy_lab", exc) from None
    except service.LabRefused as exc:
        raise ActionError(f"the lab was not started: {exc}") from None
    try:
        service.start_lab(lab)
    except Exception as exc:  # the broker is unreachable
        log.exception("lab %s could not be handed to a worker", lab.pk)
        lab.delete()
        raise ActionError(
            f"the lab could not be handed to a worker ({exc}); is the Celery broker (Redis) up?",
            status=503,
        ) from None
    log.info("%s started lab %s of %s", user.get_username(), lab.pk, pipeline.name)
    return lab


def get_lab(lab_id: int) -> Any:
    try:
        return service.get_lab(lab_id)
    except service.LabNotFound as exc:
        raise ActionError(str(exc), status=404) from None


def start_lab_run(lab_id: int, arm: str, user: User) -> Any:
    """A live run of the lab's workload with the lab's policy ``arm``: its curve is drawn
    over the prediction."""
    require(user, "operator", action="start_run", data={"lab": lab_id, "policy": arm[:40]})
    lab = get_lab(lab_id)
    if lab.status != "done":
        raise ActionError(f"lab {lab.pk} is {lab.status}; a run starts from a finished lab", 409)
    if lab.pipeline_id is None:
        raise ActionError(f"lab {lab.pk}'s pipeline was deleted", status=404)
    values = service.arm_policy(lab, arm)
    if values is None:
        known = ", ".join(a["name"] for a in lab.result["arms"])
        raise ActionError(f"lab {lab.pk} has no policy {shown(arm)}; it has {known}")
    quota = quota_of(user)
    try:
        run = service.create_run(
            topology=lab.topology,
            policy=values,
            pipeline_id=lab.pipeline_id,
            user=user,
            lab=lab,
            lab_arm=arm,
            max_active=quota.active_runs if quota else None,
            **_lab_inputs(lab),
        )
    except service.RunQuotaExceeded as exc:
        raise over_quota(user, "start_run", exc) from None
    except (service.InputError, service.GeneratorError, service.RunError) as exc:
        raise ActionError(str(exc)) from None
    _hand_over(run, user)
    log.info("%s started run %s from lab %s (%s)", user.get_username(), run.pk, lab.pk, arm)
    return run


def _lab_inputs(lab: Any) -> dict[str, Any]:
    """The lab's workload as a run's input: the same generator fields, or the input of
    the run it replayed (its files checked against the input folders again)."""
    if lab.workload["kind"] == "generator":
        return {"generator": lab.workload["generator"]}
    replayed = get_run(lab.workload["run"])
    spec = replayed.input_spec
    if spec.get("generator"):
        return {"generator": spec["generator"]}
    return {"input_path": [f for path in spec["paths"] for f in checked_input_files(path)]}


def control_run(run_id: int, verb: str, user: User) -> Any:
    """pause, resume, stop or cancel a run."""
    if verb not in RUN_CONTROLS:
        raise ActionError(f"unknown run control {shown(verb)}; use {', '.join(RUN_CONTROLS)}")
    run = get_run(run_id)
    require(user, "operator", action=f"{verb}_run", run_id=run.pk)
    require_own_run(user, run, action=f"{verb}_run")
    try:
        return service.set_status(run.pk, RUN_CONTROLS[verb], user=user)
    except service.RunError as exc:
        raise ActionError(str(exc), status=409) from None


def node_action(run_id: int, node: Any, user: User, *, stop: bool) -> str:
    """ "migrate this branch's data now" (or stop) for ``node``; unknown nodes are a 400."""
    action = "stop_migrating" if stop else "migrate"
    run = get_run(run_id)
    require(user, "operator", action=action, run_id=run.pk, data={"node": str(node)[:100]})
    require_own_run(user, run, action=action)
    names = [n["name"] for n in run.topology["nodes"]]
    if node is None:
        raise ActionError(f"the request names no 'node': one of {', '.join(names)}")
    if not isinstance(node, str) or node not in names:
        raise ActionError(
            f"run {run.pk} has no node {shown(node)}; its nodes are {', '.join(names)}"
        )
    if not run.is_active:
        raise ActionError(f"run {run.pk} is {run.status}; nothing to migrate", status=409)
    try:
        service.request_migration(run.pk, node, stop=stop, user=user)
    except service.RunError as exc:
        raise ActionError(str(exc), status=409) from None
    what = "stop migrating from" if stop else "migrate the data of"
    return f"asked to {what} {node}; the balancer acts on its next tick"


# -- hot migration and rescale (docs/spec/hot-rescale.md) -----------------------------

# What each adjustment is aimed at: an operator instance, or a stage to grow.
ADJUSTMENT_TARGETS = {"hot_migrate": "node", "add_instance": "stage", "remove_instance": "node"}
# Node and stage names have at most 100 characters, workers' names are host names (255).
MAX_TARGET_CHARS = 255


def live_workers() -> list[dict[str, Any]]:
    """The live Spark workers an instance can be placed on, by name."""
    return [
        {"name": name, "host": info.get("host", ""), "pid": info.get("pid")}
        for name, info in service.live_workers().items()
    ]


def adjust(
    run_id: int, action: Any, user: User, *, node: Any = "", stage: Any = "", worker: Any = ""
) -> str:
    """Hot-migrate, add or remove an operator instance of a running run.

    400 for an unknown action, node, stage or a worker that is not live; 409 when the
    run is not active. The run's driver carries it out on its next tick.
    """
    run = get_run(run_id)
    known = isinstance(action, str) and action in ADJUSTMENT_TARGETS
    target = {"node": node, "stage": stage, "worker": worker}
    require(
        user,
        "operator",
        action=action if known else "adjust",
        run_id=run.pk,
        data={k: str(v)[:100] for k, v in target.items() if v},
    )
    require_own_run(user, run, action=action if known else "adjust")
    if not known:
        raise ActionError(f"unknown action {shown(action)}; use {', '.join(ADJUSTMENT_TARGETS)}")
    for field, value in target.items():
        if not isinstance(value, str):
            raise ActionError(f"{field} must be a string, got {type(value).__name__}")
        if len(value) > MAX_TARGET_CHARS:
            # No node, stage or worker has such a name: refused here, not echoed back.
            raise ActionError(f"{field} has {len(value)} characters; at most {MAX_TARGET_CHARS}")
    needed = ADJUSTMENT_TARGETS[action]
    if not target[needed]:
        what = "an operator instance" if needed == "node" else "an operator stage"
        raise ActionError(f"{action} needs {needed!r}: {what} of run {run.pk}")
    if not run.is_active:
        raise ActionError(f"run {run.pk} is {run.status}; nothing to adjust", status=409)
    try:
        return service.request_adjustment(
            run.pk, action, node=node, stage=stage, worker=worker, user=user
        )
    except service.RunError as exc:
        # The run may have ended since the check above: that is a conflict, not bad input.
        raise ActionError(str(exc), status=400 if get_run(run.pk).is_active else 409) from None


# -- pipelines --------------------------------------------------------------------------

HEALTH = {
    "running": "ok",
    "completed": "ok",
    "stopping": "ok",
    "pending": "warn",
    "paused": "warn",
    "failed": "bad",
    "cancelled": "idle",
}


def health_of(last_run: Any) -> str:
    """The pipeline's health dot: ok (green), warn (amber), bad (red), idle (grey)."""
    return "idle" if last_run is None else HEALTH.get(last_run.status, "idle")


def save_pipeline(doc: Any, user: User, *, name: str | None = None) -> tuple[Pipeline, bool]:
    """Validate and save a pipeline document (create or update); nothing is saved when
    it is invalid (raises ``TopologyError`` with located problems).

    ``name``: the pipeline being edited; a document naming another pipeline is refused,
    so an edit never overwrites a different pipeline by accident. Operators edit
    topologies; only admins change which policy a pipeline uses and its overrides.
    """
    require(user, "operator", action="edit_pipeline", data={"pipeline": name or ""})
    from webapp.console.topology_io import save_document
    from webapp.console.validation import Problem, TopologyError

    if name is not None and isinstance(doc, dict) and doc.get("name") != name:
        raise TopologyError([Problem("name", f"renaming is not supported: keep {name!r}")])
    if isinstance(doc, dict) and not has_role(user, "admin"):
        policy, overrides = doc.get("policy") or None, doc.get("policy_overrides") or {}
        # A name, policy or overrides of the wrong type is not a policy change but an
        # invalid document: save_document answers it with located problems (400) and
        # saves nothing, so there is nothing to compare (and dict() of a list or a
        # string would raise).
        well_typed = (
            isinstance(doc.get("name"), str)
            and (policy is None or isinstance(policy, str))
            and isinstance(overrides, Mapping)
        )
        if well_typed:
            stored = Pipeline.objects.filter(name=doc["name"]).first()
            before = (
                (stored.policy.name if stored and stored.policy else None),
                dict(stored.policy_overrides or {}) if stored else {},
            )
            if before != (policy, dict(overrides)):
                require(
                    user, "admin", action="change_pipeline_policy", data={"pipeline": doc["name"]}
                )
    return save_document(doc)
