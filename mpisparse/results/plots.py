"""Plots of results (PNG, matplotlib imported lazily with the ``Agg`` backend).

* :func:`plot_phase_bars`: per-phase time per step, one stacked bar per run (``bench step --plot``);
* :func:`plot_history`: loss and accuracy against iterations and time (``train --plot``);
* :class:`Series`, :class:`Panel`, :func:`plot_panels`: the line plots of the bench suites;
* :func:`check_plot_support` fails early, before any MPI job starts, when matplotlib is missing.

Honest axes: times and bytes get log axes where they span orders of
magnitude (:data:`LOG_SPAN`, or where a panel asks for one); a zero on a log
axis is drawn at the axis bottom as an open triangle labelled ``0``
(:func:`mark_zeros`), never dropped and never drawn as 1; stacked bars stay
linear.  Legends sit outside the data, to the right of their axes.  Every
function returns its (closed) figure, so a caller or a test can inspect the
axes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .timing import PHASES
from .files import json_ready
from .schema import RunResult

__all__ = ["LOG_SPAN", "PNG_SIGNATURE", "Panel", "Series", "check_plot_support", "mark_zeros", "plot_history",
           "plot_panels", "plot_phase_bars", "spans_decades"]

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


# --------------------------------------------------------------------------- honest axes
#: positive values whose largest / smallest reaches this get a log axis
LOG_SPAN = 100.0
#: how a zero is shown on a log axis: a marker on the axis bottom, labelled "0"
ZERO_MARKER = "v"


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def spans_decades(values: Sequence[Any], span: float = LOG_SPAN) -> bool:
    """True when the positive values span ``span`` (x100) or more: worth a log axis."""
    pos = [float(v) for v in values if _finite(v) and v > 0]
    return len(pos) >= 2 and max(pos) / min(pos) >= span


def _use_log_y(ax, values: Sequence[Any]) -> bool:
    """A log y axis if any value is positive (else linear: a log axis has nothing to show)."""
    if any(_finite(v) and v > 0 for v in values):
        ax.set_yscale("log", nonpositive="mask")
        return True
    return False


def mark_zeros(ax, xs: Sequence[Any], ys: Sequence[Any], color: Any = "k") -> int:
    """On a log y axis, draw each ``y == 0`` at the axis bottom: an open triangle and the label ``0``.

    A log axis cannot place zero; dropping the point (matplotlib's default)
    or drawing it at 1 would misreport it.  Returns the number of zeros drawn.
    """
    from matplotlib.transforms import blended_transform_factory

    tr = blended_transform_factory(ax.transData, ax.transAxes)
    n = 0
    for x, y in zip(xs, ys):
        if _finite(y) and y <= 0:
            ax.plot([x], [0.0], ZERO_MARKER, transform=tr, color=color, mfc="none", ms=8, clip_on=False, zorder=5)
            ax.annotate("0", (x, 0.0), xycoords=tr, xytext=(0, 7), textcoords="offset points", ha="center",
                        fontsize=7, color=color)
            n += 1
    return n


def _legend_outside(ax, **kw: Any) -> None:
    """The legend to the right of the axes, outside the data."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, frameon=False, **kw)


def _save(fig, path: str | os.PathLike, dpi: int = 100) -> None:
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def plot_panels(path: str | os.PathLike, panels: Sequence[Panel], title: str = "", cols: int | None = None):
    """Draw ``panels`` side by side (``cols`` per row) into the PNG ``path``; returns the (closed) figure.

    Log axes where the panel asks (times and bytes); a zero on a log y axis
    is drawn at the axis bottom (:func:`mark_zeros`), never dropped or moved
    to 1.  Legends sit to the right of each axes, outside the data.
    """
    plt = _pyplot()
    n = max(1, len(panels))
    cols = cols or min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.9 * rows), squeeze=False, layout="constrained")
    for ax, panel in zip(axes.flat, panels):
        logy = panel.logy and _use_log_y(ax, [y for s in panel.series + panel.references for y in s.y])
        for s in panel.series:
            if s.x:
                (line,) = ax.plot(s.x, s.y, s.style, label=s.label, lw=1.2, ms=4)
                if logy:
                    mark_zeros(ax, s.x, s.y, color=line.get_color())
        for s in panel.references:
            ax.plot(s.x, s.y, "--", label=s.label, lw=0.9, color="0.45")
        if panel.logx:
            ax.set_xscale("log", base=2 if panel.xticks else 10)
        if panel.xticks:
            ax.set_xticks(panel.xticks)
            ax.set_xticklabels([f"{t:g}" for t in panel.xticks])
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel + (" (log)" if logy else ""))
        ax.grid(alpha=0.3, which="both" if logy else "major")
        _legend_outside(ax)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    _save(fig, path)
    return fig


def plot_phase_bars(path: str | os.PathLike, results: Sequence[RunResult | dict[str, Any]], title: str = "",
                    label: Callable[[dict[str, Any]], str] | None = None):
    """Per-phase time per step as stacked bars, one bar per result, beside bytes per rank; returns the figure.

    The breakdown of DEFT Fig. 7: each bar stacks a run's phases (mean over
    ranks of ms per step, so a bar adds up to the mean rank's step; the
    contract's ``phases`` are max over ranks and would not add up), with a
    mark at the slowest rank's step.  The stack stays on a linear axis (on a
    log axis the segments' heights would not add up); when the steps span
    two decades or more (:data:`LOG_SPAN`) a log panel of the step times is
    added beside it.  The bytes panel (bytes sent per rank per step) is log
    when the values span two decades, with zeros (one rank sends nothing)
    drawn at its bottom as an open triangle labelled 0.
    """
    plt = _pyplot()
    results = json_ready(list(results))
    label = label or (lambda r: r["scheme"])
    names = [label(r) for r in results]
    steps = [r.get("step_seconds", 0.0) * 1e3 for r in results]
    sent = [float(r.get("bytes_sent_per_rank", 0.0)) for r in results]
    log_steps = spans_decades(steps)
    phases = [p for p in PHASES if any(p in r.get("phases", {}) for r in results)]
    ncols = 3 if log_steps else 2
    fig, axes = plt.subplots(1, ncols, figsize=(max(9.0, 1.4 * len(results) * ncols + 5), 4.4),
                             gridspec_kw={"width_ratios": [3, 2, 2][:ncols]}, layout="constrained")
    ax, bx = axes[0], axes[-1]
    bottom = [0.0] * len(results)
    cmap = plt.get_cmap("tab20")
    for i, p in enumerate(phases):
        vals = [r.get("phases_mean_over_ranks", r.get("phases", {})).get(p, 0.0) * 1e3 for r in results]
        ax.bar(names, vals, bottom=bottom, label=p, color=cmap(i % 20))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(names, steps, "k_", ms=30, mew=2, label="step (slowest rank)")
    ax.set_ylabel("ms per step (phases: mean over ranks)")
    ax.set_title("per-phase time", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    _legend_outside(ax)
    if log_steps:
        sx = axes[1]
        sx.bar(names, steps, color="0.35")
        sx.set_yscale("log", nonpositive="mask")
        mark_zeros(sx, range(len(names)), steps)
        sx.set_ylabel("ms per step, slowest rank (log)")
        sx.set_title("step time", fontsize=10)
        sx.grid(axis="y", alpha=0.3, which="both")
    bx.bar(names, sent, color="0.5")
    if spans_decades(sent) or (any(v > 0 for v in sent) and any(v <= 0 for v in sent)):
        bx.set_yscale("log", nonpositive="mask")
        mark_zeros(bx, range(len(names)), sent)
        bx.set_ylabel("bytes sent per rank per step (log)")
    else:
        bx.set_ylabel("bytes sent per rank per step")
    bx.set_title("bytes", fontsize=10)
    bx.grid(axis="y", alpha=0.3)
    for a in axes:
        a.tick_params(axis="x", labelrotation=30, labelsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    _save(fig, path)
    return fig


def plot_history(runs: Sequence[RunResult | dict[str, Any]], steps: dict[str, list[dict[str, Any]]],
                 path: str | Path):
    """Loss and accuracy (or perplexity) against iterations and wall-clock time, one line per scheme.

    ``steps``: scheme -> its per-step log records (``train``'s ``step_log``).
    The loss axes are log when the losses span two decades (:data:`LOG_SPAN`);
    accuracy stays linear (a percentage), perplexity is log when it spans
    two decades.  One legend, outside the axes.  Returns the figure.
    """
    plt = _pyplot()
    runs = json_ready(list(runs))
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), layout="constrained")
    losses: list[float] = []
    metric: list[float] = []
    key = "test_accuracy"
    for run in runs:
        name = run["scheme"]
        log = [r for r in steps.get(name, []) if _finite(r.get("loss"))]
        hist = run["metrics"]["per_epoch"]
        if log:
            axes[0][0].plot([r["iteration"] for r in log], [r["loss"] for r in log], label=name, lw=0.8)
            axes[0][1].plot([r["wall_seconds"] for r in log], [r["loss"] for r in log], label=name, lw=0.8)
            losses += [r["loss"] for r in log]
        key = "test_accuracy" if hist and "test_accuracy" in hist[0] else "test_perplexity"
        scale = 100.0 if key == "test_accuracy" else 1.0
        axes[1][0].plot([h["iteration"] for h in hist], [scale * h[key] for h in hist], "o-", label=name)
        axes[1][1].plot([h["wall_seconds"] for h in hist], [scale * h[key] for h in hist], "o-", label=name)
        metric += [scale * h[key] for h in hist]
    log_loss = spans_decades(losses)
    log_metric = key == "test_perplexity" and spans_decades(metric)
    ylabel = "test accuracy (%)" if key == "test_accuracy" else "test perplexity"
    loss_label = "train loss (rank 0)"
    for ax, (xl, yl), log in zip(axes.flat, [("iteration", loss_label), ("wall-clock s", loss_label),
                                             ("iteration", ylabel), ("wall-clock s", ylabel)],
                                 [log_loss, log_loss, log_metric, log_metric]):
        if log:
            ax.set_yscale("log", nonpositive="mask")
            for line in ax.get_lines():
                mark_zeros(ax, line.get_xdata(), line.get_ydata(), color=line.get_color())
        ax.set_xlabel(xl)
        ax.set_ylabel(yl + (" (log)" if log else ""))
        ax.grid(alpha=0.3, which="both" if log else "major")
    _legend_outside(axes[0][1], title="scheme")
    first = runs[0]
    fig.suptitle(f"{first['config']['model']} on {first['config']['data']}, W={first['world_size']}, "
                 f"density {first['density_target']:g}")
    _save(fig, path, dpi=90)
    return fig
