"""Where a run's data comes from: bounded files, a landing folder, a Redis stream.

Every source cuts its input into chunks whose origin (file index, offset, length) the
ledger records with the source's position in one transaction, so a restarted driver
resumes exactly where the committed data ends (docs/runtime.md, "Sources").

Owns: the one interface the pacer reads through (``base``), the specs a run stores
(``spec``), each kind of source (``files``, ``landing``, ``stream``), opening the one a
run reads (``opener``) and writing out what an unbounded run took in (``replay``).

May import: ``orchestrator.models``, ``orchestrator.ledger`` (the epoch fence, events,
what a run took in) and ``orchestrator.pipeline`` (input files and chunks). Never the
run's driver, the control plane or the workers: a source only reads and numbers data.
"""
