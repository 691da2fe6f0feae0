"""The control side of hot rescale, run by a run's driver (docs/spec/hot-rescale.md).

It turns requests into adjustments (an operator's "hot-migrate to worker", "add
instance", "remove instance"; the balancer's scale-out request and key-group move; a
worker that vanished from ZooKeeper), records every step under
``runs/<run>/adjust/<version>/`` in ZooKeeper, completes an adjustment once every tail
has reported, and rolls it back when it outlives the policy's ``adjust_timeout_s``. The
steps themselves are ledger transactions (``start``, ``alignment``, ``completion``);
instances align in their own workers' claims.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery.utils import worker_direct
from django.utils import timezone
from kombu import Queue

from balancer.model import ScaleOutRequest
from balancer.policy import Policy
from balancer.sizing import (
    MAX_INSTANCES_PER_STAGE,
    StageSize,
    others_measured,
    spare_without,
)
from orchestrator.ledger.events import record_event
from orchestrator.models import Adjustment, Event, Instance, Run
from orchestrator.rescale.alignment import align_waiting, tails_reported
from orchestrator.rescale.completion import complete, rollback
from orchestrator.rescale.elastic import ElasticAsk, Idle, newest
from orchestrator.rescale.plan import Change, NewInstance, RescaleError, stage_members
from orchestrator.rescale.start import begin
from orchestrator.zk.control_plane import ControlPlane

log = logging.getLogger(__name__)

_DEFAULT_POLICY = Policy()
COMMANDS = ("hot_migrate", "add_instance", "remove_instance")


def _concurrency(info: Mapping[str, Any]) -> int:
    """A worker's registered concurrency; one for a worker that registered none (an
    older one) or anything but a positive integer."""
    value = info.get("concurrency", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


class RescaleControl:
    """A run's rescales as its driver runs them: one at a time, placed on live workers."""

    def __init__(
        self,
        run_id: int,
        control: ControlPlane,
        *,
        epoch: int,
        source: str,
        timeout_s: float,
        placement: str = "pooled",
        scale_in_busy: float = _DEFAULT_POLICY.scale_in_busy,
        scale_in_after_s: float = _DEFAULT_POLICY.scale_in_after_s,
    ) -> None:
        self.run_id = run_id
        # "placed": every operator instance gets a live Spark worker of its own
        # (:meth:`place`); "pooled": only those a hot rescale placed have one.
        self.placement_mode = placement
        # The policy's scale-in window (:meth:`consider_scale_in`).
        self.scale_in_busy = scale_in_busy
        self.scale_in_after_s = scale_in_after_s
        self.key = str(run_id)
        self.control = control
        self.epoch = epoch
        self.source = source
        self.timeout_s = timeout_s
        self.live: dict[str, dict[str, Any]] = {}
        self._workers_changed = threading.Event()
        self.placement: dict[str, str] = {}
        self.last_auto_scale = float("-inf")
        self.last_key_move = float("-inf")
        # An adjustment a previous driver of the run began goes on under this one.
        self.current: Adjustment | None = Adjustment.objects.filter(
            run_id=run_id, status=Adjustment.Status.RUNNING
        ).first()
        # Placed mode: the run's own workers, asked of the elastic pool; a scale-out
        # waiting for its workers (its stage, reason and instance count); how long the
        # run was idle.
        self.elastic = ElasticAsk(run_id, control)
        self.waiting_for_worker: tuple[str, str, int] | None = None
        self.idle = Idle(scale_in_busy)
        self.subscription = control.watch_workers(self._note_workers)
        self._workers_changed.set()
        self._load_placement()
        # Placed before the run's first batch is sent, so that none runs elsewhere.
        self.live = control.live_workers()
        self.place()

    def close(self) -> None:
        self.subscription.cancel()

    def _note_workers(self, _names: set[str]) -> None:
        # kazoo's thread: only note it; the driver's tick reads the workers.
        self._workers_changed.set()

    def _load_placement(self) -> None:
        self.placement = dict(
            Instance.objects.filter(run_id=self.run_id)
            .exclude(worker="")
            .exclude(status=Instance.Status.RETIRED)
            .values_list("name", "worker")
        )

    # -- where batches go -------------------------------------------------------------

    def queue_for(self, node: str) -> Queue | None:
        """The placed worker's own queue, or None for the shared ``spark`` queue."""
        worker = self.placement.get(node) or ""
        info = self.live.get(worker)
        if info is None:
            return None
        return worker_direct(info.get("name", worker))

    def worker_of(self, node: str) -> str:
        """The live worker ``node`` is placed on, or "" (any Spark worker)."""
        worker = self.placement.get(node) or ""
        return worker if worker in self.live else ""

    def spark_workers(self) -> dict[str, dict[str, Any]]:
        return {name: info for name, info in self.live.items() if "spark" in info.get("queues", [])}

    def spark_slots(self) -> int:
        """How many batches the live Spark workers run at once (each registers its
        pool's concurrency; one if none is known yet)."""
        return max(1, sum(_concurrency(info) for info in self.spark_workers().values()))

    def _least_loaded(self, exclude: set[str] | frozenset[str] = frozenset()) -> str:
        candidates = sorted(set(self.spark_workers()) - set(exclude))
        if not candidates:
            return ""
        load = {w: 0 for w in candidates}
        for worker in self.placement.values():
            if worker in load:
                load[worker] += 1
        return min(candidates, key=lambda w: (load[w], w))

    # -- requests ---------------------------------------------------------------------

    def command(self, command: Mapping[str, Any]) -> bool:
        """An operator's request from the console or the API; True if it started."""
        who = command.get("user", "an operator")
        kind = command.get("command")
        try:
            if kind == "hot_migrate":
                change = self._migrate(
                    command["node"],
                    command.get("worker", ""),
                    who,
                    "migrate",
                    f"{who} asked to hot-migrate {command['node']}",
                )
            elif kind == "add_instance":
                reason = f"{who} asked for one more instance"
                if self.placement_mode == "placed" and not command.get("worker"):
                    # Placed: the new instance gets a worker of its own, a live one
                    # or one asked of the elastic pool.
                    self._check_stage(command["stage"])
                    free = self._free_workers(command["stage"])
                    if not free:
                        return self._ask_for_workers(command["stage"], reason, 1)
                    command = {**command, "worker": free[0]}
                change = self._add(command["stage"], [command.get("worker", "")], reason)
            else:
                change = Change(
                    "scale_in",
                    removed=(command["node"],),
                    reason=f"{who} asked to remove {command['node']}",
                )
            return self._begin(change)
        except RescaleError as err:
            record_event(
                self.run_id,
                "adjust_refused",
                f"{kind} refused: {err}",
                node=command.get("node", command.get("stage", "")),
                actor=Event.Actor.USER,
                data=dict(command),
            )
            return False

    def scale_out(self, request: ScaleOutRequest, now: float) -> bool:
        """The balancer's scale-out request, of as many instances as it sized
        (balancer/sizing.py), up to the stage's maximum: at most one per timeout, none
        while another adjustment runs. In placed mode each new instance needs a worker
        none of its stage runs on: the free live ones first, the rest asked of the
        elastic pool at once (:meth:`_ask_for_workers`)."""
        if now - self.last_auto_scale < self.timeout_s or self.current is not None:
            return False
        self.last_auto_scale = now
        stage, reason = request.stage, request.reason
        try:
            room = MAX_INSTANCES_PER_STAGE - len(self._check_stage(stage))
            if room <= 0:
                raise RescaleError(
                    f"stage {stage} already has {MAX_INSTANCES_PER_STAGE} instances (at most)"
                )
            count = min(max(1, request.instances), room)
            if self.placement_mode != "placed":
                return self._scale_out_on(stage, [""] * count, reason)
        except RescaleError as err:
            return self._refused(stage, f"scale out refused: {err}", reason)
        free = self._free_workers(stage)
        if len(free) >= count:
            return self._scale_out_on(stage, free[:count], reason)
        return self._ask_for_workers(stage, reason, count)

    def move_key_groups(
        self, stage: str, groups: Mapping[str, tuple[int, int]], reason: str, now: float
    ) -> bool:
        """The balancer's key-group move (balancer/key_moves.py): at most one per
        timeout, none while another adjustment runs; a move the graph no longer fits
        (its members changed meanwhile) is refused with why."""
        if now - self.last_key_move < self.timeout_s or self.current is not None:
            return False
        self.last_key_move = now
        change = Change(
            "key_move",
            regroup={stage: dict(groups)},
            reason=reason,
            actor=Event.Actor.BALANCER,
        )
        try:
            return self._begin(change)
        except RescaleError as err:
            record_event(
                self.run_id,
                "adjust_refused",
                f"key-group move refused: {err}",
                node=stage,
                actor=Event.Actor.BALANCER,
            )
            return False

    def _check_stage(self, stage: str) -> list[str]:
        """``stage``'s members; a stage the pipeline does not have is refused."""
        members = self._members(stage)
        if not members:
            raise RescaleError(f"the pipeline has no stage {stage!r}")
        return members

    def _free_workers(self, stage: str) -> list[str]:
        """The live Spark workers that run none of ``stage``'s instances, by name."""
        members = set(self._members(stage))
        taken = {w for name, w in self.placement.items() if name in members}
        return sorted(set(self.spark_workers()) - taken)

    def _scale_out_on(self, stage: str, workers: list[str], reason: str) -> bool:
        """One adjustment adding an instance of ``stage`` on each of ``workers`` ("":
        any Spark worker)."""
        try:
            return self._begin(self._add(stage, workers, reason, actor=Event.Actor.BALANCER))
        except RescaleError as err:
            return self._refused(stage, f"scale out refused: {err}", reason)

    def _refused(self, stage: str, message: str, reason: str) -> bool:
        record_event(
            self.run_id,
            "adjust_refused",
            message,
            node=stage,
            actor=Event.Actor.BALANCER,
            data={"reason": reason},
        )
        return False

    def _ask_for_workers(self, stage: str, reason: str, count: int) -> bool:
        """Fewer live workers run none of the stage's instances than ``count`` new
        instances need: ask the elastic pool for the rest at once (as many as it has
        room for), and add the instances once they are live (:meth:`tick`); or say
        why not and start nothing."""
        if self.waiting_for_worker is not None:
            return False
        free = self._free_workers(stage)
        room = self.elastic.room()
        if room <= 0:
            refused = self.elastic.refusal() or "the pool has no room"
            if free:
                return self._scale_out_on(
                    stage, free, f"{reason}; {len(free)} of {count} on free workers: {refused}"
                )
            message = f"scale out of {stage} refused: {refused}; nothing was started"
            return self._refused(stage, message, reason)
        asked = min(count - len(free), room)
        self.elastic.grow(f"scale out of {stage}: {reason}", asked)
        self.waiting_for_worker = (stage, reason, len(free) + asked)
        short = f" (the pool had room for {room} only)" if asked < count - len(free) else ""
        record_event(
            self.run_id,
            "worker_asked",
            f"{reason}; {count} new instance(s) of {stage} need workers of their own, "
            f"{len(free)} free: {asked} more worker(s) asked of the pool{short} "
            f"({self.elastic.extra} for this run)",
            node=stage,
            actor=Event.Actor.BALANCER,
            data={
                "stage": stage,
                "asked": asked,
                "instances": len(free) + asked,
                "extra": self.elastic.extra,
                "workers": sorted(self.live),
            },
        )
        return True

    def _scale_out_waiting(self) -> bool:
        """The scale-out waiting for workers, once enough free ones are live."""
        if self.waiting_for_worker is None or self.current is not None:
            return False
        stage, reason, count = self.waiting_for_worker
        free = self._free_workers(stage)
        if len(free) < count:
            return False
        self.waiting_for_worker = None
        return self._scale_out_on(
            stage, free[:count], f"{reason}; on the new worker(s) {', '.join(free[:count])}"
        )

    def consider_scale_in(
        self,
        busy: Mapping[str, float | None],
        now: float,
        sizes: Callable[[], Mapping[str, StageSize]] | None = None,
    ) -> bool:
        """Give one of the run's own workers back: the instance on the newest of them is
        removed, and the run's ask goes down once that adjustment completes
        (:meth:`poll`). With ``sizes`` (the policy's ``scale_out = measured``: each
        stage's size, asked only when the run has a worker to give back) and the
        stage's other workers measured, once the stage has taken its target without
        that worker's rate, with headroom, for the policy's ``scale_in_after_s``
        (balancer.sizing.spare_without); otherwise once every operator instance stayed
        busy less than ``scale_in_busy`` of the time that long. True when one began."""
        if self.placement_mode != "placed" or self.elastic.extra <= 0:
            self.idle = Idle(self.scale_in_busy)
            return False
        operators = self._operators()
        placed = {n: w for n, w in self.placement.items() if n in operators and w in self.live}
        if not placed:
            return False
        worker = newest(self.live, set(placed.values()))
        name = sorted(n for n, w in placed.items() if w == worker)[0]
        sized = sizes() if sizes is not None else {}
        size = next((z for z in sized.values() if name in z.members), None)
        if size is not None and others_measured(size, name):
            spare = spare_without(size, name)
            held_s = self.idle.hold(spare is not None, now)
            why = f"for {held_s:.0f} s {spare}"
        else:  # not sized by measurement, or not measured yet: the busy shares
            held_s = self.idle.update({n: b for n, b in busy.items() if n in operators}, now)
            why = f"every instance under {self.scale_in_busy:.0%} busy for {held_s:.0f} s"
        if self.current is not None or held_s < self.scale_in_after_s:
            return False
        if len(self._members(self._stage_of(name))) < 2:
            return False
        self.idle = Idle(self.scale_in_busy)
        change = Change(
            "scale_in",
            removed=(name,),
            reason=(
                f"{why}: {name} leaves {worker}, the newest worker the run has an instance "
                "on, and one Spark worker goes back to the pool"
            ),
            actor=Event.Actor.BALANCER,
            gives_back_worker=True,
        )
        try:
            return self._begin(change)
        except RescaleError as err:
            record_event(self.run_id, "adjust_refused", f"scale in refused: {err}", node=name)
            return False

    def _stage_of(self, name: str) -> str:
        return str(
            Instance.objects.filter(run_id=self.run_id, name=name)
            .values_list("stage", flat=True)
            .first()
            or name
        )

    def ended(self) -> None:
        """The run ended: its workers go back to the pool."""
        if self.elastic.extra:
            self.elastic.clear()

    def _members(self, stage: str) -> list[str]:
        return stage_members(Run.objects.only("topology").get(pk=self.run_id).topology, stage)

    def _new_name(self, stage: str, planned: tuple[NewInstance, ...] = ()) -> str:
        """``<stage>-<n>``, unused by any instance the run ever had or is about to get."""
        taken = set(Instance.objects.filter(run_id=self.run_id).values_list("name", flat=True))
        taken |= {p.name for p in planned}
        index = len(taken)
        while f"{stage}-{index}" in taken:
            index += 1
        return f"{stage}-{index}"

    def _check_worker(self, worker: str) -> str:
        if worker and worker not in self.spark_workers():
            live = ", ".join(sorted(self.spark_workers())) or "none"
            raise RescaleError(f"worker {worker!r} is not a live Spark worker (live: {live})")
        return worker

    def _add(
        self,
        stage: str,
        workers: list[str],
        reason: str,
        *,
        actor: str = Event.Actor.USER,
    ) -> Change:
        """A scale-out adding an instance of ``stage`` on each of ``workers`` ("": any
        Spark worker), within the stage's maximum."""
        members = self._check_stage(stage)
        if len(members) + len(workers) > MAX_INSTANCES_PER_STAGE:
            raise RescaleError(
                f"stage {stage} has {len(members)} instances and {len(workers)} more "
                f"would pass its maximum of {MAX_INSTANCES_PER_STAGE}"
            )
        added: list[NewInstance] = []
        for worker in workers:
            name = self._new_name(stage, tuple(added))
            added.append(NewInstance(name, stage, self._check_worker(worker)))
        return Change("scale_out", added=tuple(added), reason=reason, actor=actor)

    def _migrate(self, node: str, worker: str, who: str, kind: str, reason: str) -> Change:
        instance = Instance.objects.filter(run_id=self.run_id, name=node).first()
        if instance is None or instance.status == Instance.Status.RETIRED:
            raise RescaleError(f"the run has no live instance {node!r}")
        target = self._check_worker(worker) or self._least_loaded({instance.worker})
        new = NewInstance(self._new_name(instance.stage), instance.stage, target)
        actor = Event.Actor.USER if kind == "migrate" else Event.Actor.SYSTEM
        return Change(kind, added=(new,), removed=(node,), reason=reason, actor=actor)

    def _begin(self, change: Change) -> bool:
        adjustment = begin(self.run_id, change, epoch=self.epoch, source=self.source)
        self.current = adjustment
        self._load_placement()
        plan = adjustment.plan
        try:
            self.control.write_adjustment(
                self.key,
                adjustment.version,
                {
                    "plan": {
                        "kind": change.kind,
                        "reason": change.reason,
                        **{
                            k: plan[k]
                            for k in (
                                "changed_stages",
                                "added",
                                "removed",
                                "subgraph",
                                "sources",
                                "tails",
                                "connect",
                                "disconnect",
                            )
                        },
                    },
                    "state": {"status": "running", "started_at": adjustment.started_at.isoformat()},
                },
            )
            self.control.write_adjustment(
                self.key, adjustment.version, plan["updates"], under="updates"
            )
        except Exception:
            log.warning(
                "run %s: could not record adjustment %s in ZooKeeper",
                self.run_id,
                adjustment.version,
                exc_info=True,
            )
        return True

    # -- progress ---------------------------------------------------------------------

    def poll(self) -> bool:
        """Every loop of the driver while an adjustment runs: align the instances that
        can (the step an instance's own claim would take, taken for it when it is idle
        or its next batch is still queued), report tails that did, and complete the
        adjustment once every tail has reported. True when the run's graph changed."""
        adjustment = self.current
        if adjustment is None:
            return False
        for step in align_waiting(self.run_id, adjustment.version):
            if step.tail:
                self.control.report_tail(self.key, step.version, step.instance, {"by": "driver"})
        if not set(adjustment.plan["tails"]) <= self._tails(adjustment):
            return False
        done = complete(adjustment.pk)
        self.current = None
        self._record_state(done)
        self._load_placement()
        if done.plan.get("gives_back_worker"):
            self.elastic.shrink(f"{', '.join(done.plan['removed'])} removed after underload")
        return True

    def tick(self) -> bool:
        """Roll back an adjustment that outlived the policy's timeout, move instances off
        vanished workers. True when the run's graph changed."""
        changed = False
        if self._workers_changed.is_set():
            self._workers_changed.clear()
            self.live = self.control.live_workers()
            changed |= self._failover()
            self.place()
        changed |= self._scale_out_waiting()
        adjustment = self.current
        if adjustment is None:
            return changed
        age = (timezone.now() - adjustment.started_at).total_seconds()
        if age <= self.timeout_s:
            return changed
        missing = sorted(set(adjustment.plan["tails"]) - self._tails(adjustment))
        if not missing:
            return self.poll()  # the last tail reported just now
        done = rollback(
            adjustment.pk,
            f"not complete after {self.timeout_s:g} s (adjust_timeout_s); "
            f"tails not reported: {', '.join(missing)}",
        )
        self.current = None
        self._record_state(done)
        self._load_placement()
        return True

    def _tails(self, adjustment: Adjustment) -> set[str]:
        """Tails that reported in ZooKeeper. A tail aligned in the ledger whose worker
        died before it could report is reported for it: the ledger is the truth."""
        reported = self.control.adjustment_tails(self.key, adjustment.version)
        for name in tails_reported(adjustment):
            if name not in reported:
                self.control.report_tail(
                    self.key, adjustment.version, name, {"by": "driver", "from": "ledger"}
                )
                reported.add(name)
        return reported

    def _record_state(self, adjustment: Adjustment) -> None:
        try:
            self.control.write_adjustment(
                self.key,
                adjustment.version,
                {
                    "state": {"status": adjustment.status, **adjustment.outcome},
                },
            )
        except Exception:
            log.warning(
                "run %s: could not record adjustment %s's end",
                self.run_id,
                adjustment.version,
                exc_info=True,
            )

    def _failover(self) -> bool:
        """Instances placed on a worker whose liveness znode vanished move to live ones."""
        dead = {name: worker for name, worker in self.placement.items() if worker not in self.live}
        if not dead:
            return False
        # Their queued batches must run somewhere now: anywhere, until the move is done.
        Instance.objects.filter(run_id=self.run_id, name__in=dead).update(worker="")
        self._load_placement()
        for worker in sorted(set(dead.values())):
            record_event(
                self.run_id,
                "worker_lost",
                f"worker {worker} vanished from ZooKeeper; its instances "
                f"{', '.join(sorted(n for n, w in dead.items() if w == worker))} move",
                data={"worker": worker},
            )
        if self.current is not None:
            return True  # the running adjustment completes or rolls back first
        removed = tuple(sorted(n for n in dead if self._is_operator(n)))
        if not removed:
            return True
        added: list[NewInstance] = []
        for name in removed:
            stage = Instance.objects.get(run_id=self.run_id, name=name).stage
            target = self._least_loaded(set(dead.values()))
            added.append(NewInstance(self._new_name(stage, tuple(added)), stage, target))
        try:
            self._begin(
                Change(
                    "failover",
                    added=tuple(added),
                    removed=removed,
                    reason=f"worker(s) {', '.join(sorted(set(dead.values())))} lost",
                    actor=Event.Actor.SYSTEM,
                )
            )
        except RescaleError as err:
            record_event(self.run_id, "adjust_refused", f"failover refused: {err}")
        return True

    def place(self) -> None:
        """In placed mode, each active operator instance without a live Spark worker
        gets one: the worker with the fewest of its stage's instances, then the fewest
        instances, so that a stage's instances spread over the workers. Its next batch
        runs there; one in flight finishes where it runs (the lease says who completes
        it). Waits while an adjustment runs: the adjustment places its own instances."""
        workers = sorted(self.spark_workers())
        if self.placement_mode != "placed" or self.current is not None or not workers:
            return
        placed = {name: w for name, w in self.placement.items() if w in workers}
        instances = (
            Instance.objects.filter(run_id=self.run_id, status=Instance.Status.ACTIVE)
            .order_by("stage", "name")
            .values_list("name", "stage")
        )
        operators = self._operators()
        stage_of = {name: stage for name, stage in instances if name in operators}
        moved: dict[str, str] = {}
        for name, stage in stage_of.items():
            if name in placed:
                continue
            peers = [w for n, w in placed.items() if stage_of.get(n) == stage]
            load = list(placed.values())
            worker = min(workers, key=lambda w: (peers.count(w), load.count(w), w))
            placed[name] = moved[name] = worker
        if not moved:
            return
        for name, worker in moved.items():
            Instance.objects.filter(run_id=self.run_id, name=name).update(worker=worker)
        self._load_placement()
        record_event(
            self.run_id,
            "placed",
            "placed on Spark workers: "
            + ", ".join(f"{name} on {worker}" for name, worker in sorted(moved.items())),
            data={"placement": moved},
        )

    def _operators(self) -> set[str]:
        run = Run.objects.only("topology").get(pk=self.run_id)
        return {n["name"] for n in run.topology["nodes"] if n["kind"] == "operator"}

    def _is_operator(self, name: str) -> bool:
        return name in self._operators()
