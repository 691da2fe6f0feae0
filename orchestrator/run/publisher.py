"""The one way workers talk to browsers: a message to the run's Channels group."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def publish(run_id: int, message: dict[str, Any]) -> None:
    """Send ``message`` (a typed dict with a ``type`` field) to every viewer of the run.

    A failure to publish never stops the run: the view catches up on the next tick.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            run_group(run_id), {"type": "run.message", "message": message}
        )
    except Exception:
        log.warning("run %s: could not publish to the live view", run_id, exc_info=True)
