"""The Spark worker's side: one operator batch from claim to completion.

Owns: batch execution (``batch``), the threads beside a running batch that keep its
lease (``lease``) and stop its Spark jobs when the run stops (``stopwatch``), and the
plain reference job over a run's input (``plain_job``).

May import: ``sparkjobs``, ``orchestrator.ledger``, ``orchestrator.rescale``,
``orchestrator.pipeline``, ``orchestrator.services``.
"""
