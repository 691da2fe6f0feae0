"""Hot migration and rescale on the ledger (shared/spec/hot-rescale.md, ADR 4).

Owns: applying a rescale plan, aligning instances at a configuration version,
completion and rollback (``protocol``), and the driver-side control that starts,
watches and finishes a rescale (``control``).

May import: ``balancer`` (the plan), ``orchestrator.ledger``, ``orchestrator.pipeline``,
``orchestrator.zk``.
"""
