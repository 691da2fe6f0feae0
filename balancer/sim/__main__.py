"""``python -m balancer.sim ...``: see :mod:`balancer.sim.cli`."""

import sys

from balancer.sim.cli import main

raise SystemExit(main(sys.argv[1:]))
