"""The policy lab: every balancing policy simulated on one workload of a pipeline, so
that an operator picks one from predicted completion curves before a live run.

Owns: the replay a lab simulates, from a generator spec or a completed run's recorded
input, with the runtime fitted to the pipeline's completed run closest to it in size
(``replays``); asking for a lab and what it shows (``labs``); and running the
simulation in a bounded process of its own and keeping its outcome (``simulation``).

May import: ``orchestrator.models``, ``orchestrator.ledger`` (the calibration from a
run's ledger), ``orchestrator.pipeline`` (the generator's packets), and ``balancer``'s
simulator. Never the control plane or a run's driver: a lab changes no run.
"""
