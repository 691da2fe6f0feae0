"""The ZooKeeper control plane of a run (ARCHITECTURE.md, "ZooKeeper layout").

Owns: the kazoo session, backpressure flags and node state, routes and epochs, command
queues, locks and the worker registry.

May import: ``kazoo``, ``orchestrator.pipeline``. Never the ledger: flags are advisory,
the ledger is the truth.
"""
