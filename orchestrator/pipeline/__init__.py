"""A run's pipeline as data: its graph, routes, input files and the built-in generator.

Owns: the pipeline document as the runtime reads it (``graph``: a run's frozen
:class:`~orchestrator.pipeline.graph.RunGraph` per configuration; the document's shape
and defaults are ``balancer.document``), where an upstream sends a segment (``routes``),
input files confined to their roots and cut into chunks (``inputs``), paths opened
beneath a root by descriptor, never through a symbolic link (``beneath``), the seeded
generator (``generator``), the Redis keys of the streams on the console's Redis
(``streams``), and where a run's files live, with the console's own folders no input
may lie in (``layout``).

May import: ``balancer``, ``sparkjobs`` (pure parts), Django settings. Nothing else of
the orchestrator: every other room reads the pipeline through here.
"""
