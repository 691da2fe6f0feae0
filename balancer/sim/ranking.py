"""Whether a simulator ranks policies as their live runs do.

A live run's completion varies from round to round (watermark's, on the policies
bench: 21.4 to 27.0 s over one run's rounds), so two policies whose rounds overlap are
not ranked by the measurement: which median is lower turns with the next round. A pair
counts as ranked live only when every round of one finished before every round of the
other (with three rounds each, two policies alike in truth are set apart so in 1 run
of 10), and a prediction has the live ranking when it orders every such pair the same
way. The order of the medians is reported beside it, so a reader sees both.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RankingCheck:
    separated: tuple[tuple[str, str], ...]  # (faster, slower), every round apart
    overlapping: tuple[tuple[str, str], ...]  # pairs the live rounds do not rank
    misordered: tuple[tuple[str, str], ...]  # separated pairs predicted the other way
    medians_in_order: bool  # the predictions sort the policies as the live medians do

    @property
    def same_ranking(self) -> bool:
        return not self.misordered


def check_ranking(
    live_rounds: Mapping[str, Sequence[float]],
    predicted: Mapping[str, float],
) -> RankingCheck:
    """Raises ValueError when a policy has no round or no prediction."""
    names = sorted(live_rounds)
    if any(not live_rounds[n] for n in names) or set(predicted) != set(names):
        raise ValueError("every policy needs its live rounds and one prediction")
    separated, overlapping = [], []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if max(live_rounds[a]) < min(live_rounds[b]):
                separated.append((a, b))
            elif max(live_rounds[b]) < min(live_rounds[a]):
                separated.append((b, a))
            else:
                overlapping.append((a, b))
    misordered = [(fast, slow) for fast, slow in separated if predicted[fast] >= predicted[slow]]
    return RankingCheck(
        tuple(separated),
        tuple(overlapping),
        tuple(misordered),
        sorted(names, key=lambda n: statistics.median(live_rounds[n]))
        == sorted(names, key=lambda n: predicted[n]),
    )
