"""The ZooKeeper control plane of a run (docs/architecture.md, "The control plane").

Owns, behind one facade (``control_plane.ControlPlane``): the kazoo session and its
connection state (``session``), paths and the shared reads, writes and watches
(``znodes``), backpressure flags and node state (``node_state``), routes and epochs
(``routes``), the signal and command queues (``queues``), the worker registry and the
driver lock (``workers``), hot rescale's records (``rescale_rounds``) and the elastic
Spark workers' asks and state (``spark_pool``).

May import: ``kazoo``, ``orchestrator.pipeline``, ``orchestrator.services`` (how a client
authenticates). Never the ledger: flags are advisory,
the ledger is the truth.
"""
