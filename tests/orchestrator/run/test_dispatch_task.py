"""A driver is one Celery task that runs for days, sending a batch task every few
hundred milliseconds: nothing of those batches may stay attached to it."""

from __future__ import annotations

import uuid

import pytest
from celery._state import _task_stack

from orchestrator import tasks
from orchestrator.run.dispatch import BatchRequest

pytestmark = pytest.mark.integration


def test_a_batch_sent_by_a_driver_is_not_kept_by_the_driver_task(services) -> None:
    # Given the driver task running in a worker (Celery's own stack of current tasks)
    queue = f"test.nobody.{uuid.uuid4().hex[:8]}"
    tasks.drive_run.push_request(id="driver", called_directly=False, children=[])
    _task_stack.push(tasks.drive_run)
    try:
        # When it sends batches
        for _ in range(3):
            tasks._dispatch(1, BatchRequest("aggregate_a", {}, queue, {}, None))
        # Then none is appended to its request's children (Celery's default), which
        # would grow by one result per batch for as long as the run goes on
        assert tasks.drive_run.request.children == []
    finally:
        _task_stack.pop()
        tasks.drive_run.pop_request()
        with tasks.drive_run.app.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
