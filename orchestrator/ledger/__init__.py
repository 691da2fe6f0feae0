"""The durable data plane in PostgreSQL: every state change of data is one transaction.

Owns: segments and their claims and leases (``segments``), the sink's merge and key
state (``keystate``), result rows (``results``), failed batches (``failures``), the
run's event rows (``events``), what a run took in and its coverage must tile
(``ingested``), event-time windows and the sink's watermark (``windows``,
``window_view``), the deletion of segment files and rows no one needs any more
(``retention``), what a finished run measured, for the simulator to replay it
(``calibration``), and which pipeline owns each sink table and Parquet folder
(``sink_owners``).

May import: ``orchestrator.models``, ``orchestrator.pipeline``, ``orchestrator.sink``
(the targets closed windows are written to), and pure definitions of
``balancer`` (``units``; the simulator's replay, which ``calibration`` fills) and
``sparkjobs`` (key groups, merged partials). Never the
control plane (``zk``), hot rescale (``rescale``) or anything that runs a process: the protocols are
built on the ledger, not the other way round.
"""
