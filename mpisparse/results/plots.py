"""Plots of results (PNG, matplotlib imported lazily with the ``Agg`` backend).

* :func:`plot_phase_bars`: per-phase time per step, one stacked bar per run (``bench step --plot``);
* :func:`plot_history`: loss and accuracy against iterations and time (``train --plot``);
* :class:`Series`, :class:`Panel`, :func:`plot_panels`: the line plots of the bench suites;
* :func:`check_plot_support` fails early, before any MPI job starts, when matplotlib is missing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..timing import PHASES
from .files import json_ready
from .schema import RunResult

__all__ = ["PNG_SIGNATURE", "Panel", "Series", "check_plot_support", "plot_history", "plot_panels",
           "plot_phase_bars"]

#: the first bytes of every PNG file
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_plot_support() -> None:
    """Raise ``RuntimeError`` (one sentence) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib (or '.[train]')") from None


@dataclass
class Series:
    """One line of a panel: ``label`` and its points."""

    label: str
    x: list[float]
    y: list[float]
    style: str = "o-"


@dataclass
class Panel:
    """One axes of a figure."""

    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    logx: bool = False
    logy: bool = False
    #: x values to mark as ticks (e.g. world sizes), or None for matplotlib's own
    xticks: list[float] | None = None
    #: extra reference lines: (label, xs, ys)
    references: list[Series] = field(default_factory=list)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_panels(path: str | os.PathLike, panels: Sequence[Panel], title: str = "",
                cols: int | None = None) -> None:
    """Draw ``panels`` side by side (``cols`` per row) into the PNG ``path``."""
    plt = _pyplot()
    n = max(1, len(panels))
    cols = cols or min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for s in panel.series:
            if s.x:
                ax.plot(s.x, s.y, s.style, label=s.label, lw=1.2, ms=4)
        for s in panel.references:
            ax.plot(s.x, s.y, "--", label=s.label, lw=0.9, color="0.45")
        if panel.logx:
            ax.set_xscale("log", base=2 if panel.xticks else 10)
        if panel.logy:
            ax.set_yscale("log")
        if panel.xticks:
            ax.set_xticks(panel.xticks)
            ax.set_xticklabels([f"{t:g}" for t in panel.xticks])
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(alpha=0.3)
        if panel.series or panel.references:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_phase_bars(path: str | os.PathLike, results: Sequence[RunResult | dict[str, Any]], title: str = "",
                    label: Callable[[dict[str, Any]], str] | None = None) -> None:
    """Per-phase time per step as stacked bars, one bar per result, beside bytes per rank.

    The breakdown of DEFT Fig. 7: each bar stacks a run's phases (mean over
    ranks of ms per step, so a bar adds up to the mean rank's step; the
    contract's ``phases`` are max over ranks and would not add up), with a
    mark at the slowest rank's step; the right panel shows bytes sent per
    rank per step.
    """
    plt = _pyplot()
    results = json_ready(list(results))
    label = label or (lambda r: r["scheme"])
    names = [label(r) for r in results]
    phases = [p for p in PHASES if any(p in r.get("phases", {}) for r in results)]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(results) + 6), 4.2),
                                 gridspec_kw={"width_ratios": [3, 2]})
    bottom = [0.0] * len(results)
    cmap = plt.get_cmap("tab20")
    for i, p in enumerate(phases):
        vals = [r.get("phases_mean_over_ranks", r.get("phases", {})).get(p, 0.0) * 1e3 for r in results]
        ax.bar(names, vals, bottom=bottom, label=p, color=cmap(i % 20))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(names, [r.get("step_seconds", 0.0) * 1e3 for r in results], "k_", ms=30, mew=2,
            label="step (slowest rank)")
    ax.set_ylabel("ms per step (phases: mean over ranks)")
    ax.set_title("per-phase time", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    bx.bar(names, [r.get("bytes_sent_per_rank", 0.0) / 2**20 for r in results], color="0.5")
    bx.set_ylabel("MiB sent per rank per step")
    bx.set_title("bytes", fontsize=10)
    bx.grid(axis="y", alpha=0.3)
    for a in (ax, bx):
        a.tick_params(axis="x", labelrotation=30, labelsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_history(runs: Sequence[RunResult | dict[str, Any]], steps: dict[str, list[dict[str, Any]]],
                 path: str | Path) -> None:
    """Loss and accuracy (or perplexity) against iterations and wall-clock time, one line per scheme.

    ``steps``: scheme -> its per-step log records (``train``'s ``step_log``).
    """
    plt = _pyplot()
    runs = json_ready(list(runs))
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
