"""Where a windowed run's closed windows go: its result table, a PostgreSQL table the
pipeline names, or Parquet files below the sink root, each window written exactly once
(``targets``).

May import: ``orchestrator.pipeline`` (folders opened beneath a root, ``beneath``),
nothing else of the orchestrator (settings, ``sparkjobs`` definitions): the ledger
calls a target inside its transaction, never the other way round.
"""
