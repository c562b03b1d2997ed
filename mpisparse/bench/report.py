"""Shared outputs of the ``mpisparse bench`` suites and ``mpisparse reproduce``.

* :func:`result_row` flattens a per-run result object (DESIGN.md section 2)
  into one flat row: the contract's scalar keys, ``model``, and one
  ``phase_<name>_ms`` column per measured phase;
* :class:`Column` and :func:`format_rows` make the fixed-width text tables
  the suites print;
* :func:`write_csv` writes rows with a header (the union of the rows' keys,
  in first-seen order, unless columns are given);
* :class:`Series`, :class:`Panel`, :func:`plot_panels` and
  :func:`plot_phase_bars` draw the PNGs (matplotlib, imported lazily with the
  ``Agg`` backend); :func:`check_plot_support` fails early, before any MPI
  job starts, when ``--plot`` is given without matplotlib.

Nothing here imports MPI; every function is usable on rank 0 alone.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..timing import PHASES

__all__ = ["Column", "Panel", "Series", "check_plot_support", "columns_of", "format_rows", "plot_panels",
           "plot_phase_bars", "result_row", "write_csv", "PNG_SIGNATURE"]

#: the first bytes of every PNG file
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_CONTRACT_SCALARS = ("scheme", "world_size", "density_target", "density_actual", "bytes_sent_per_rank",
                     "step_seconds")


# --------------------------------------------------------------------------- rows
def result_row(res: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One flat row of a per-run result object (``extra`` keys after the contract's).

    Phases become ``phase_<name>_ms`` (max over ranks, milliseconds), in the
    order of the phase vocabulary.
    """
    row: dict[str, Any] = {}
    cfg = res.get("config", {})
    if "model" in cfg and "model" not in extra:
        row["model"] = cfg["model"]
    for k in _CONTRACT_SCALARS:
        row[k] = res.get(k)
    if "n" in res:
        row["n"] = res["n"]
    if "k" in res:
        row["k"] = res["k"]
    row.update(extra)
    phases = res.get("phases", {})
    for p in PHASES:
        if p in phases:
            row[f"phase_{p}_ms"] = phases[p] * 1e3
    return row


@dataclass(frozen=True)
class Column:
    """A text-table column: ``key`` of the row, header, and how to show the value."""

    key: str
    header: str
    fmt: str | Callable[[Any], str] = "{}"
    align: str = ">"

    def cell(self, row: dict[str, Any]) -> str:
        v = row.get(self.key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if callable(self.fmt):
            return self.fmt(v)
        try:
            return self.fmt.format(v)
        except (ValueError, TypeError):
            return str(v)


def format_rows(rows: Sequence[dict[str, Any]], columns: Sequence[Column], title: str | None = None) -> str:
    """A fixed-width text table; columns are as wide as their widest cell."""
    cells = [[c.header for c in columns]] + [[c.cell(r) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = [title] if title else []
    for j, line in enumerate(cells):
        parts = []
        for i, (c, text) in enumerate(zip(columns, line)):
            align = "<" if (c.align == "<") else ">"
            parts.append(f"{text:{align}{widths[i]}}")
        out.append("  ".join(parts).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def columns_of(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The union of the rows' keys: first-seen order, ``phase_*_ms`` last in vocabulary order."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    phase_cols = [f"phase_{p}_ms" for p in PHASES if f"phase_{p}_ms" in seen]
    return [k for k in seen if k not in phase_cols] + phase_cols


def write_csv(path: str | os.PathLike, rows: Iterable[dict[str, Any]],
              columns: Sequence[str] | None = None) -> None:
    """Write ``rows`` with a header; nested values (lists, dicts) are left out."""
    rows = [{k: v for k, v in r.items() if not isinstance(v, (list, dict, tuple))} for r in rows]
    if columns is None:
        columns = columns_of(rows)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- plots
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


def plot_phase_bars(path: str | os.PathLike, results: Sequence[dict[str, Any]], title: str = "",
                    label: Callable[[dict[str, Any]], str] | None = None) -> None:
    """Per-phase time per step as stacked bars, one bar per result, beside bytes per rank.

    The breakdown of DEFT Fig. 7: each bar stacks a run's phases (mean over
    ranks of ms per step, so a bar adds up to the mean rank's step; the
    contract's ``phases`` are max over ranks and would not add up), with a
    mark at the slowest rank's step; the right panel shows bytes sent per
    rank per step.
    """
    plt = _pyplot()
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
