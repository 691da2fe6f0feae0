"""A run's driver, on a control worker, and how runs are started and steered.

Owns: the driver's loop (``driver``) over its collaborators: the source's pacing
(``pacer``), batch dispatch (``dispatch``), measuring the nodes (``observer``), the live
implementation of ``balancer.runtime.Runtime`` (``runtime``), one handler per action type
(``actions``) and the state they act on (``controls``, ``flags``, ``route_store``,
``timeline``), operators' commands and stepwise signals (``commands``), the end of a run
(``completion``); the live snapshot (``snapshot``) and its reporter (``reporter``), the
generated input (``generation``), starting, stopping and steering runs (``lifecycle``),
and messages to browsers (``publisher``).

May import: every other room of the orchestrator (and ``orchestrator.models``) and
``balancer``; not the app surface above it: a created run gets its driver from
``orchestrator.tasks.start_run``. Nothing imports it but the Django app surface
(``tasks``, ``service``).
"""
