"""A run's driver, on a control worker, and how runs are started and steered.

Owns: the driver's loop (``driver``), the live snapshot (``snapshot``) and its reporter
(``reporter``), the generated input (``generation``), starting, stopping and steering
runs (``lifecycle``), and messages to browsers (``publisher``).

May import: every other room of the orchestrator and ``balancer``. Nothing imports it but
the Django app surface (``tasks``, ``service``).
"""
