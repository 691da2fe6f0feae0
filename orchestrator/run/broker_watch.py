"""Has Redis, the Celery broker and result backend, restarted since the last look?

The embedded Redis keeps nothing on disk, so a restart loses every batch message still
queued and every result not yet read: a driver would otherwise wait out
``BPCONSOLE_QUEUED_BATCH_S`` before presuming them lost. Redis gives each start of the
server a new ``run_id`` (``INFO server``); a changed one means everything sent before
is gone.
"""

from __future__ import annotations

import redis


class BrokerWatch:
    def __init__(self, url: str) -> None:
        # One client for the driver's life, asked twice a second: its pooled connection
        # is dropped on an error and made again at the next look.
        self.client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        self.run_id: str | None = None

    def _current(self) -> str | None:
        try:
            return str(self.client.info("server")["run_id"])
        except redis.RedisError:
            self.client.connection_pool.disconnect()
            return None  # down (or restarting): nothing to say until it answers

    def restarted(self) -> bool:
        """True once after each restart seen; the first look only learns the run id."""
        current = self._current()
        if current is None:
            return False
        before, self.run_id = self.run_id, current
        return before is not None and before != current
