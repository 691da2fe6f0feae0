"""Every upstream's routing table: applied at once in the driver (the source and the
dispatch read it), written to ZooKeeper by the reporter thread, fenced by the epoch,
and read back by the next driver.

The next driver takes over the traffic shares, not the migrations. A migration is kept
by the balancer that decided it, which ends it once its heavy branch is relieved (an
operator's, pinned here, by the operator); a new driver's balancer starts without that
state, so a migration read back would never end, whatever the branches' levels: a light
branch that has since filled keeps taking its peer's data while the peer idles. The new
balancer migrates what its own observation finds heavy; an operator asks again. Shares
need no such watching: they give every branch its part, and the water level moves them
on from the levels it sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from balancer.topology import Topology
from orchestrator.pipeline.routes import Routes
from orchestrator.zk.control_plane import ControlPlane, StaleEpochError

RouteTables = dict[str, dict[str, Any]]


class RouteStore:
    def __init__(self, control: ControlPlane, run_key: str) -> None:
        self.control = control
        self.run_key = run_key
        self.routes: dict[str, Routes] = {}
        self.epoch = 0  # the epoch the driver took the run with: its writes are fenced by it
        self.stored: RouteTables = {}
        # Migrations an operator started: they last until an operator stops them.
        self.pinned: set[str] = set()
        # Set in the reporter thread when a newer driver fenced this one out.
        self.superseded = False

    def get(self, node: str) -> Routes:
        return self.routes.get(node, Routes())

    def set(self, node: str, routes: Routes) -> None:
        self.routes[node] = routes

    def tables(self) -> RouteTables:
        return {node: routes.to_json() for node, routes in self.routes.items()}

    def restore(self, topology: Topology) -> dict[str, Mapping[str, Mapping[str, float]]]:
        """The shares the previous driver of the run left in ZooKeeper; returns the
        migrations it left, by upstream, which end here (see the module docstring)."""
        ended: dict[str, Mapping[str, Mapping[str, float]]] = {}
        for node in topology.order:
            stored = self.control.read_routes(self.run_key, node)
            if stored is None:
                continue
            left = Routes.from_json(stored[0])
            self.routes[node] = Routes(left.shares)
            if left.migrations:
                ended[node] = left.migrations
        return ended

    def store(self, tables: RouteTables) -> None:
        """In the reporter thread: write the tables that changed since the last write."""
        for node, table in tables.items():
            if self.stored.get(node) == table:
                continue
            try:
                self.control.write_routes(self.run_key, node, table, self.epoch)
            except StaleEpochError:
                self.superseded = True  # a newer driver owns the run; the loop stops
                return
            self.stored[node] = table

    def prune(self, topology: Topology) -> None:
        """Forget routes to and from nodes a hot rescale retired."""
        for node, routes in list(self.routes.items()):
            if not topology.has_node(node):
                del self.routes[node]
                continue
            live = set(topology.downstreams(node))
            shares = {k: v for k, v in (routes.shares or {}).items() if k in live}
            migrations = {
                heavy: {light: s for light, s in moves.items() if light in live}
                for heavy, moves in routes.migrations.items()
                if heavy in live
            }
            self.routes[node] = Routes(shares or None, migrations)
