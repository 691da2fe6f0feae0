"""Starting a rescale (docs/spec/hot-rescale.md section 2, steps 1 and 2), in one ledger
transaction.

Owns: the run's instance rows (:func:`ensure_instances`) and :func:`begin`: plan the
change (``plan``), store every instance's graph-state update (which markers it waits
for, where it forwards them, whether it is behind a barrier), switch the run to the new
graph version, and inject the markers at the subgraph's sources. The run's source lives
in the driver: when it is a source of the subgraph it aligns right here (``alignment``).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from balancer.rescale import AdjustmentPlan
from orchestrator.ledger.events import record_event
from orchestrator.models import Adjustment, Instance, Run
from orchestrator.rescale.alignment import align, send_marker
from orchestrator.rescale.plan import Change, RescaleError, is_keyed, plan_change

CONTROL = "control"  # the upstream name of a marker injected by the control side


def ensure_instances(run: Run) -> None:
    """One instance row per node of the run (idempotent: a new driver calls it too)."""
    existing = set(Instance.objects.filter(run=run).values_list("name", flat=True))
    Instance.objects.bulk_create(
        [
            Instance(
                run=run,
                name=n["name"],
                stage=n.get("stage") or n["name"],
                config=run.config_version,
                target=run.config_version,
            )
            for n in run.topology["nodes"]
            if n["name"] not in existing
        ],
        ignore_conflicts=True,
    )


def begin(run_id: int, change: Change, *, epoch: int, source: str) -> Adjustment:
    """Plan and start a rescale, or raise :class:`RescaleError` changing nothing.

    ``source`` is the run's source node: it lives in the driver, so when it is a source
    of the subgraph it takes the injected marker and aligns right here.
    """
    now = timezone.now()
    with transaction.atomic():
        # FOR NO KEY UPDATE: a worker's claim holds an instance this transaction locks
        # below, and its rows check the run they reference when it commits (FOR KEY
        # SHARE), which FOR UPDATE would hold up: a deadlock. Only the end of a run locks
        # it FOR UPDATE, to wait for the merges in flight (segments._refuse_ended).
        run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
        if run.epoch != epoch:
            raise RescaleError(f"run {run_id}: driver epoch {epoch} is no longer current")
        running = Adjustment.objects.filter(run=run, status=Adjustment.Status.RUNNING).first()
        if running is not None:
            raise RescaleError(
                f"adjustment {running.version} ({running.kind}) is still under way; "
                "one adjustment at a time"
            )
        before = run.topology
        plan, after, plan_json = plan_change(before, change)
        version = run.config_version + 1
        adjustment = Adjustment.objects.create(
            run=run,
            version=version,
            kind=change.kind,
            reason=change.reason,
            before=before,
            after=after,
            plan=plan_json,
            placement={a.name: a.worker for a in change.added},
        )
        subgraph = set(plan.subgraph)
        union_edges = {(e["from"], e["to"]) for e in before["edges"]} | set(plan.connect)
        Instance.objects.bulk_create(
            [
                Instance(
                    run=run,
                    name=a.name,
                    stage=a.stage,
                    worker=a.worker,
                    status=Instance.Status.JOINING,
                    config=run.config_version,
                )
                for a in change.added
            ]
        )
        for inst in (
            Instance.objects.select_for_update().filter(run=run, name__in=subgraph).order_by("name")
        ):
            inst.target = version
            inst.expect = (
                [CONTROL]
                if inst.name in plan.sources
                else sorted(u for u, d in union_edges if d == inst.name and u in subgraph)
            )
            inst.forward = sorted(d for u, d in union_edges if u == inst.name and d in subgraph)
            inst.tail = inst.name in plan.tails
            # Only a changed keyed stage must not touch data from after the markers
            # before its state is handed over; every other instance keeps processing
            # both sides (the order of stateless work does not change its result).
            inst.barrier = inst.name in plan.v_changed and is_keyed(
                after if inst.name in plan.added else before, inst.name
            )
            if inst.name in plan.removed:
                inst.status = Instance.Status.RETIRING
            inst.save()
        run.topology = after
        run.config_version = version
        run.save(update_fields=["topology", "config_version"])
        record_event(
            run_id,
            "adjust_planned",
            _describe(change, plan),
            data=plan_json,
            actor=change.actor,
            user=change.user,
        )
        injected = sorted(plan.sources)
        for name in injected:
            if name != source:
                send_marker(run_id, CONTROL, name, version, now)
        record_event(
            run_id,
            "adjust_markers",
            f"adjustment {version}: graph-state updates sent to "
            f"{len(plan_json['updates'])} instance(s); markers injected at {', '.join(injected)}",
            data={"version": version, "sources": injected},
        )
        if source in plan.sources:
            inst = Instance.objects.select_for_update().get(run=run, name=source)
            align(inst, now)
    return adjustment


def _describe(change: Change, plan: AdjustmentPlan) -> str:
    parts = []
    if plan.added:
        parts.append(f"add {', '.join(sorted(plan.added))}")
    if plan.removed:
        parts.append(f"remove {', '.join(sorted(plan.removed))}")
    for stage, groups in change.regroup.items():
        parts.append(
            f"key slots of {stage} to "
            + ", ".join(f"{m} [{low}, {high})" for m, (low, high) in groups.items())
        )
    return (
        f"{change.kind.replace('_', ' ')}: {' and '.join(parts)}"
        f" ({change.reason or 'no reason given'}); subgraph {', '.join(plan.subgraph)}"
    )
