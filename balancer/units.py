"""Units of size and rate, defined once for the balancer, the simulator and the runtime.

Sizes are binary (a pipeline document's ``buffer_mb: 64`` is 64 MiB). Rates in a
document (``max_rate_mbps``, ``bandwidth_mbps``) are megabits per second; the runtime
reads one Mb/s as :data:`MEGABIT` bytes per second (10^6 bits), the simulator's
reference experiment as :data:`SPEC_MEGABIT` (see its note below).
"""

from __future__ import annotations

KB = 1024
MB = 1024 * KB
GB = 1024 * MB

# Bytes per second in one Mb/s: 10^6 bits, as networks count them. What a pipeline's
# emulated rates and bandwidths mean in a live run.
MEGABIT = 1_000_000 / 8

# Bytes per second in one Mb/s as the published experiment counts it: the spec quotes
# 5 GB at 125 Mb/s as "about 328 s", i.e. 5 * 1024 * 8 / 125, the same M in MB and Mb.
# Only the simulator's replay of that experiment uses it (docs/simulation.md, "Units").
SPEC_MEGABIT = MB / 8
