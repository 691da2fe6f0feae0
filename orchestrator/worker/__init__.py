"""The Spark worker's side: one operator batch from claim to completion.

Owns: batch execution (``batch``), the threads beside a running batch that keep its
lease (``lease``) and stop its Spark jobs when the run stops (``stopwatch``), and the
plain reference job over a run's input (``plain_job``).

May import: ``sparkjobs``, ``balancer``'s definitions (``document``, ``units``),
``orchestrator.models``, ``orchestrator.ledger``, ``orchestrator.rescale``,
``orchestrator.pipeline``, ``orchestrator.services``. Never the run (``run``): a batch
knows its run by the ledger, and the batch job's refusals are its own
(``plain_job.BatchJobError``).
"""
