"""The completed-fraction figure (like the published Figures 7 and 8).

matplotlib is imported inside :func:`plot_completion` only, with the file-only ``Agg``
backend, so the simulator and its tests never need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def plot_completion(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    path: Path,
    *,
    title: str,
    bound_s: float,
) -> None:
    """One line per policy: share of the volume completed at each sample; the fluid
    bound as a vertical line."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=120)
    for label, points in curves.items():
        times = [t for t, _ in points]
        shares = [100 * f for _, f in points]
        axes.plot(times, shares, marker="o", markersize=2.5, linewidth=1.4, label=label)
    axes.axvline(bound_s, color="grey", linestyle="--", linewidth=1, label="fluid bound")
    axes.set_xlabel("time (s)")
    axes.set_ylabel("completed (%)")
    axes.set_ylim(0, 101)
    axes.set_xlim(left=0)
    axes.set_title(title)
    axes.grid(visible=True, alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
