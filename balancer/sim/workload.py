"""Seeded, bursty and skewed traffic for the simulator (docs/simulation.md, "Workload").

The source emits ``volume_bytes`` in packets of ``packet_bytes``, each tagged with the
branch that should process it (a downstream of the source). Two independent processes
shape the stream, each drawn from its own child of one ``numpy`` ``SeedSequence``:

* **Bursts** (the source rate jumps up and down): the source alternates between a low
  and a high rate, ``high = burst_ratio * low``, chosen so that their mean is
  ``mean_rate_bps``; each phase lasts an exponentially distributed time of mean
  ``burst_mean_s``; the first phase (low or high) is drawn too. Within a phase packets
  are evenly spaced.
* **Skew** (one tag dominates for a while, then another): time is cut into episodes of
  exponential length with mean ``skew_mean_s``; each episode has a dominant tag, drawn
  uniformly among the tags other than the previous episode's. During an episode the
  dominant tag has probability ``dominance`` and the others share the rest in proportion
  to the base ``weights``. ``dominance = 0`` turns skew off: every packet follows
  ``weights``.

Each packet's tag is an independent draw from its episode's mix. Every draw consumes its
generator in stream order, so the same seed gives the same packets for every policy and
a smaller volume is a prefix of a larger one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from balancer.units import MB


@dataclass(frozen=True)
class WorkloadSpec:
    """The parameters of a workload; the reference calibration is in ``reference.py``."""

    volume_bytes: float
    mean_rate_bps: float
    packet_bytes: float = MB
    burst_ratio: float = 1.0
    burst_mean_s: float = 10.0
    dominance: float = 0.0
    skew_mean_s: float = 20.0
    weights: Mapping[str, float] = field(default_factory=dict)  # empty = equal weights

    def __post_init__(self) -> None:
        if self.volume_bytes < self.packet_bytes or self.packet_bytes <= 0:
            raise ValueError("the volume must hold at least one packet of positive size")
        if self.mean_rate_bps <= 0 or self.burst_ratio < 1:
            raise ValueError("the mean rate must be positive and the burst ratio >= 1")
        if not 0.0 <= self.dominance < 1.0:
            raise ValueError("dominance must lie in [0, 1)")
        if self.burst_mean_s <= 0 or self.skew_mean_s <= 0:
            raise ValueError("phase and episode means must be positive")


@dataclass(frozen=True)
class Workload:
    """The packets: arrival time at the source and tag, in emission order."""

    tags: tuple[str, ...]
    packet_bytes: float
    arrivals: np.ndarray  # seconds, non-decreasing
    tag_index: np.ndarray  # index into ``tags`` per packet

    @property
    def packets(self) -> int:
        return len(self.arrivals)

    @property
    def volume_bytes(self) -> float:
        return self.packets * self.packet_bytes

    def bytes_per_tag(self) -> dict[str, float]:
        counts = np.bincount(self.tag_index, minlength=len(self.tags))
        return {t: float(c) * self.packet_bytes for t, c in zip(self.tags, counts, strict=True)}


def generate(spec: WorkloadSpec, tags: Sequence[str], seed: int) -> Workload:
    """The packets of ``spec`` tagged among ``tags`` (the source's downstreams)."""
    if not tags:
        raise ValueError("a workload needs at least one tag")
    burst_rng, skew_rng, tag_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    count = int(spec.volume_bytes // spec.packet_bytes)
    arrivals = _arrivals(spec, count, burst_rng)
    mixes, boundaries = _episodes(spec, tuple(tags), float(arrivals[-1]), skew_rng)
    episode = np.searchsorted(boundaries, arrivals, side="right")
    cumulative = np.cumsum(mixes, axis=1)[episode]
    draws = tag_rng.random(count)[:, None]
    # The first tag whose cumulative probability exceeds the draw; the min() guards the
    # last column against a cumulative sum that rounds to just below 1.
    tag_index = np.minimum((draws >= cumulative).sum(axis=1), len(tags) - 1)
    return Workload(tuple(tags), spec.packet_bytes, arrivals, tag_index.astype(np.int64))


def _arrivals(spec: WorkloadSpec, count: int, rng: np.random.Generator) -> np.ndarray:
    """Packet k leaves when the source's cumulative output reaches ``k * packet_bytes``."""
    low = 2 * spec.mean_rate_bps / (1 + spec.burst_ratio)
    rates = (low, spec.burst_ratio * low)
    phase = int(rng.integers(2))
    starts, sent, phase_rates = [0.0], [0.0], []
    needed = (count - 1) * spec.packet_bytes
    while sent[-1] <= needed:
        duration = rng.exponential(spec.burst_mean_s)
        phase_rates.append(rates[phase])
        starts.append(starts[-1] + duration)
        sent.append(sent[-1] + duration * rates[phase])
        phase = 1 - phase
    offsets = np.arange(count) * spec.packet_bytes
    index = np.searchsorted(np.array(sent), offsets, side="right") - 1
    # numpy's stubs type fancy indexing as Any; the result is one float per packet.
    arrivals: np.ndarray = (
        np.array(starts)[index] + (offsets - np.array(sent)[index]) / np.array(phase_rates)[index]
    )
    return arrivals


def _episodes(
    spec: WorkloadSpec, tags: tuple[str, ...], horizon: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per episode the tag mix, and the episode start times after the first."""
    base = np.array([spec.weights.get(t, 1.0 if not spec.weights else 0.0) for t in tags])
    base = base / base.sum()
    if spec.dominance == 0.0 or len(tags) == 1:
        return base[None, :], np.empty(0)
    mixes: list[np.ndarray] = []
    boundaries: list[float] = []
    dominant, time = -1, 0.0
    while True:
        choices = [i for i in range(len(tags)) if i != dominant]
        dominant = choices[int(rng.integers(len(choices)))]
        others = base.copy()
        others[dominant] = 0.0
        mix = (1 - spec.dominance) * others / others.sum()
        mix[dominant] = spec.dominance
        mixes.append(mix)
        time += rng.exponential(spec.skew_mean_s)
        if time > horizon:
            return np.array(mixes), np.array(boundaries)
        boundaries.append(time)
