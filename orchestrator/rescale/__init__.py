"""Hot migration and rescale on the ledger (docs/spec/hot-rescale.md, ADR 4).

Owns, one module per step of the spec: the plan of a change and where data goes while
the graph changes (``plan``), starting a rescale: graph-state updates and markers
injected at the subgraph's sources (``start``), each instance's alignment in its own
claim and the tails' reports (``alignment``), completion, rollback and what a rescale
cost (``completion``), and the driver-side control that starts, watches and finishes a
rescale (``control``, :class:`~orchestrator.rescale.control.RescaleControl`). Each step
is one PostgreSQL transaction and an event on the run's timeline.

One rescale is stored as an ``orchestrator.models.Adjustment`` row: the model, its table,
its migrations, the ``adjust_*`` event kinds, the ZooKeeper folder ``adjust/<version>/``
and the API's ``adjustment`` fields keep their historical name.

May import: ``balancer`` (the plan), ``sparkjobs`` (operators' catalog, key groups),
``orchestrator.models``, ``orchestrator.ledger``, ``orchestrator.pipeline``,
``orchestrator.zk``.
"""
