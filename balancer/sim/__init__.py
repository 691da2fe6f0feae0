"""The virtual-time simulator and the reference benchmark (docs/simulation.md).

``workload`` generates seeded traffic, ``engine`` runs it through a topology with the
real balancer decisions (``control`` wires them), ``bound`` computes what no policy can
beat, ``bench`` compares the policies, ``cli`` is the command line.
"""
