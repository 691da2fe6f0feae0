"""Where each upstream sends its traffic, fenced by the run's epoch.

Owns ``runs/<run>/routes/<node>`` (JSON ``{"epoch": e, "routes": {...}}``: the
upstream's traffic shares per downstream and migration overrides) and
``runs/<run>/epoch`` (a decimal integer), and :class:`StaleEpochError`: a routing write
older than the run's epoch or the stored routes' is refused, so a paused old owner never
undoes a newer owner's routing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Literal, overload

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from orchestrator.zk.session import ControlPlaneError, decode, encode
from orchestrator.zk.znodes import MAX_CAS_ATTEMPTS, Subscription, Znodes


class StaleEpochError(ControlPlaneError):
    """A routing write carried an epoch older than the run's or the stored routes'.

    The writer is a paused old owner (or lost a race to a newer one): it must stop
    acting on its view of the run instead of retrying.
    """

    def __init__(self, run: str, node: str, epoch: int, newer: int) -> None:
        super().__init__(
            f"routes of {run}/{node}: epoch {epoch} is stale, epoch {newer} already holds"
        )
        self.run = run
        self.node = node
        self.epoch = epoch
        self.newer = newer


class RouteZnodes(Znodes):
    def __init__(self, client: KazooClient, root: str | None = None) -> None:
        super().__init__(client, root)
        # routes path -> (epoch znode version, highest epoch seen, routes znode version)
        # after our last write of it: what the one-round-trip write checks against
        self._route_versions: dict[str, tuple[int, int, int]] = {}

    def _epoch_path(self, run: str) -> str:
        return f"{self.run_path(run)}/epoch"

    # -- routes (epoch-fenced) ------------------------------------------------------

    def write_routes(self, run: str, node: str, routes: Mapping[str, Any], epoch: int) -> None:
        """Store ``node``'s traffic shares, fenced by ``epoch``.

        Refused with :class:`StaleEpochError` when the stored routes carry a higher epoch
        or the run's epoch has moved past ``epoch``: a paused old owner must not undo a
        newer owner's routing. The write is a multi-op of a version check on the run's
        epoch znode and a versioned set (or create) of the routes, so a concurrent writer
        or epoch bump makes it re-read and re-decide instead of overwriting.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        path = self._child(run, "routes", node)
        payload = encode({"epoch": epoch, "routes": dict(routes)})
        if self._write_routes_fast(run, path, payload, epoch):
            return
        self.client.retry(self.client.ensure_path, self._folder(run, "routes"))
        for _ in range(MAX_CAS_ATTEMPTS):
            if self.client.retry(self._try_write_routes, run, node, path, payload, epoch):
                return
        raise ControlPlaneError(f"routes of {run}/{node}: too many concurrent writers")

    def _write_routes_fast(self, run: str, path: str, payload: bytes, epoch: int) -> bool:
        """One round trip when nothing moved since our own last write of ``path``: the
        same epoch-znode and routes versions, checked in one multi-op. Any change (a new
        epoch, another writer) fails the check, and the full path re-reads and decides."""
        known = self._route_versions.get(path)
        if known is None:
            return False
        epoch_version, floor, routes_version = known
        if epoch < floor:
            return False  # the full path re-reads and refuses with the newer epoch

        tx = self.client.transaction()
        tx.check(self._epoch_path(run), epoch_version)
        tx.set_data(path, payload, version=routes_version)
        try:
            results = self.client.retry(tx.commit)
        except KazooException:
            return False
        if any(isinstance(r, Exception) for r in results):
            self._route_versions.pop(path, None)
            return False
        self._route_versions[path] = (epoch_version, max(floor, epoch), results[1].version)
        return True

    def _try_write_routes(self, run: str, node: str, path: str, payload: bytes, epoch: int) -> bool:
        run_epoch, epoch_stat = self._epoch_with_stat(run, create=True)
        if epoch < run_epoch:
            raise StaleEpochError(run, node, epoch, run_epoch)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            stat = None
        else:
            stored = int(decode(data, path).get("epoch", 0))
            if epoch < stored:
                raise StaleEpochError(run, node, epoch, stored)
        tx = self.client.transaction()
        tx.check(self._epoch_path(run), epoch_stat.version)
        if stat is None:
            tx.create(path, payload)
        else:
            tx.set_data(path, payload, version=stat.version)
        results = tx.commit()
        if not self._committed(results, path):
            return False
        written = 0 if stat is None else results[1].version
        self._route_versions[path] = (epoch_stat.version, max(run_epoch, epoch), written)
        return True

    def read_routes(self, run: str, node: str) -> tuple[dict[str, Any], int] | None:
        """``(routes, epoch)`` as last written, or None if never written."""
        value = self._read_json(self._child(run, "routes", node))
        return None if value is None else _routes_of(value)

    def watch_routes(
        self,
        run: str,
        node: str,
        callback: Callable[[tuple[dict[str, Any], int] | None], None],
    ) -> Subscription:
        """Call ``callback((routes, epoch) or None)`` now and after every change."""
        path = self._child(run, "routes", node)
        return self._watch_data(
            path, lambda value: callback(None if value is None else _routes_of(value))
        )

    # -- the run's epoch ------------------------------------------------------------

    def current_epoch(self, run: str) -> int:
        """The run's epoch; 0 before the first :meth:`next_epoch`."""
        return self._epoch_with_stat(run, create=False)[0]

    def next_epoch(self, run: str) -> int:
        """Atomically increment and return the run's epoch (versioned set, retried on a
        lost race). Monotonic; a connection loss at the wrong moment may skip a value."""
        for _ in range(MAX_CAS_ATTEMPTS):
            # kazoo has no type information: retry() returns what the call returns.
            bumped: int | None = self.client.retry(self._try_bump_epoch, run)
            if bumped is not None:
                return bumped
        raise ControlPlaneError(f"epoch of {run}: too many concurrent increments")

    def raise_epoch(self, run: str, at_least: int) -> int:
        """Move the run's epoch up to ``at_least`` (never down); returns the epoch. The
        ledger's epoch is the source of truth; this keeps ZooKeeper's fence in step."""
        for _ in range(MAX_CAS_ATTEMPTS):
            current, stat = self._epoch_with_stat(run, create=True)
            if current >= at_least:
                return current
            try:
                self.client.retry(
                    self.client.set,
                    self._epoch_path(run),
                    str(at_least).encode(),
                    version=stat.version,
                )
            except BadVersionError:
                continue
            return at_least
        raise ControlPlaneError(f"epoch of {run}: too many concurrent increments")

    def _try_bump_epoch(self, run: str) -> int | None:
        path = self._epoch_path(run)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            try:
                self.client.create(path, b"1", makepath=True)
            except NodeExistsError:
                return None
            return 1
        value = _parse_epoch(data, path) + 1
        try:
            self.client.set(path, str(value).encode(), version=stat.version)
        except BadVersionError:
            return None
        return value

    # With ``create`` the znode exists once the call returns, so there is always a stat.
    @overload
    def _epoch_with_stat(self, run: str, *, create: Literal[True]) -> tuple[int, ZnodeStat]: ...
    @overload
    def _epoch_with_stat(
        self, run: str, *, create: Literal[False]
    ) -> tuple[int, ZnodeStat | None]: ...
    def _epoch_with_stat(self, run: str, *, create: bool) -> tuple[int, ZnodeStat | None]:
        path = self._epoch_path(run)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            if not create:
                return 0, None
            with contextlib.suppress(NodeExistsError):
                self.client.create(path, b"0", makepath=True)
            data, stat = self.client.get(path)
        return _parse_epoch(data, path), stat


def _routes_of(value: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    return dict(value.get("routes", {})), int(value.get("epoch", 0))


def _parse_epoch(data: bytes, path: str) -> int:
    try:
        return int(data.decode("ascii").strip() or 0)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlPlaneError(f"{path}: epoch is not an integer: {data[:40]!r}") from exc
