"""Outputs of ``mpisparse train``: per-step CSV log and the PNG plot."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

CSV_COLUMNS = ("scheme", "epoch", "batch", "iteration", "loss", "step_seconds", "wall_seconds",
               "bytes", "density", "skipped")


class CsvLog:
    """Appends one row per step (rank 0's view); flushed per row so a kill loses nothing."""

    def __init__(self, path: str | Path, append: bool = False):
        self.path = Path(path)
        new = not (append and self.path.exists())
        self._f = open(self.path, "a" if not new else "w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        if new:
            self._w.writeheader()

    def row(self, scheme: str, rec: dict[str, Any]) -> None:
        self._w.writerow({"scheme": scheme, **rec})
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def plot_history(runs: list[dict[str, Any]], steps: dict[str, list[dict[str, Any]]], path: str | Path) -> None:
    """Loss and accuracy (or perplexity) against iterations and wall-clock time, one line per scheme."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for run in runs:
        name = run["scheme"]
        log = steps.get(name, [])
        hist = run["metrics"]["per_epoch"]
        if log:
            axes[0][0].plot([r["iteration"] for r in log], [r["loss"] for r in log], label=name, lw=0.8)
            axes[0][1].plot([r["wall_seconds"] for r in log], [r["loss"] for r in log], label=name, lw=0.8)
        key = "test_accuracy" if hist and "test_accuracy" in hist[0] else "test_perplexity"
        scale = 100.0 if key == "test_accuracy" else 1.0
        axes[1][0].plot([h["iteration"] for h in hist], [scale * h[key] for h in hist], "o-", label=name)
        axes[1][1].plot([h["wall_seconds"] for h in hist], [scale * h[key] for h in hist], "o-", label=name)
    ylabel = "test accuracy (%)" if key == "test_accuracy" else "test perplexity"
    for ax, (xl, yl) in zip(axes.flat, [("iteration", "train loss (rank 0)"), ("wall-clock s", "train loss (rank 0)"),
                                        ("iteration", ylabel), ("wall-clock s", ylabel)]):
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend()
    first = runs[0]
    fig.suptitle(f"{first['config']['model']} on {first['config']['data']}, W={first['world_size']}, "
                 f"density {first['density_target']:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
