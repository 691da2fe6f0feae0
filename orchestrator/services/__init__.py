"""The services a console needs, on one machine or a cluster.

Owns: the embedded PostgreSQL, Redis and ZooKeeper (``embedded``), the launcher that
starts what is not configured (``launcher``), ``make run``'s processes (``runconsole``)
and their restarts with backoff (``supervisor``), and health: each service's check
(``health``) and the Spark workers' heartbeats (``heartbeat``).

May import: nothing of the orchestrator: it is the floor the other rooms stand on.
"""
