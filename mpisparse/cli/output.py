"""What the commands print and write about their results: tables, comparisons, JSON, CSV, plots, progress.

The one module of the CLI that knows the result objects' keys; the
commands hand it their results and the output paths.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ..results import (CsvLog, Fallback, format_comparison, format_run, format_train_comparison, write_csv,
                       write_json, write_results)

__all__ = ["exchange_outputs", "finish_step", "finish_train", "info_outputs", "print_step_result",
           "print_train_header", "print_train_result", "progress", "scaling_outputs", "select_outputs", "train_log",
           "train_progress", "train_step_log"]


# --------------------------------------------------------------------------- info
def info_outputs(report: dict[str, Any], json_path: str | None) -> None:
    """``info`` (rank 0)."""
    from ..mpi.info import format_info

    click.echo(format_info(report))
    Fallback(report).attempt("--json", json_path, lambda: write_json(json_path, report))


# --------------------------------------------------------------------------- bench step
def print_step_result(res) -> None:
    """``bench step``: one scheme's per-phase table (rank 0)."""
    click.echo(format_run(res, "bench step"))


def finish_step(results: list, json_path: str | None, csv_path: str | None, plot_path: str | None) -> None:
    """``bench step``: the comparison of several schemes, --json, --csv, --plot (rank 0)."""
    if len(results) > 1:
        click.echo("\n" + format_comparison(results))
    write_results(results, command="bench step", json_path=json_path, csv_path=csv_path, plot_path=plot_path,
                  echo=click.echo)


#: ``--progress-interval`` and ``--no-progress`` of the running command (set by :func:`configure_progress`)
_PROGRESS = {"interval": 10.0, "enabled": True}


def configure_progress(interval: float = 10.0, enabled: bool = True) -> None:
    """The command's progress options, for every progress callback it makes."""
    _PROGRESS.update(interval=float(interval), enabled=bool(enabled))


def progress(comm, label: str):
    """``report(done, total, **fields)`` on rank 0 (None elsewhere, or with ``--no-progress``): a live bar on
    a terminal, a status line every ``--progress-interval`` seconds off one (:class:`mpisparse.results.progress.Progress`)."""
    if comm.rank != 0 or not _PROGRESS["enabled"]:
        return None
    from ..results.progress import Progress

    state: dict[str, Any] = {}

    def report(done: int, total: int, what: str = "", **fields: Any) -> None:
        bar = state.get("bar")
        if bar is None or bar.total != total:
            bar = state["bar"] = Progress(label, total, interval=_PROGRESS["interval"])
        bar.update(done, what, **fields)
        if done >= total:
            bar.close()

    return report


# --------------------------------------------------------------------------- bench exchange, scaling, select
def _suite_outputs(results: list[dict[str, Any]], table: str, row, plot, json_path: str | None,
                   csv_path: str | None, plot_path: str | None) -> None:
    """A bench suite's printed table, --json, --csv (``row`` per result) and --plot (rank 0).

    A file that cannot be written: a warning, and the results on stdout as JSON (:class:`Fallback`).
    """
    click.echo(table)
    fb = Fallback(results)
    fb.attempt("--json", json_path, lambda: write_json(json_path, results))
    fb.attempt("--csv", csv_path, lambda: write_csv(csv_path, [row(r) for r in results]))

    def draw() -> None:
        plot(plot_path, results)
        click.echo(f"plot written to {plot_path}")

    fb.attempt("--plot", plot_path, draw)


def exchange_outputs(results: list[dict[str, Any]], json_path: str | None, csv_path: str | None,
                     plot_path: str | None) -> None:
    """``bench exchange`` (rank 0)."""
    from ..bench.exchange import exchange_row, format_exchange, plot_exchange

    _suite_outputs(results, format_exchange(results), exchange_row, plot_exchange, json_path, csv_path, plot_path)


def scaling_outputs(results: list[dict[str, Any]], json_path: str | None, csv_path: str | None,
                    plot_path: str | None, out_dir: str | None = None) -> None:
    """``bench scaling``; ``out_dir``: where the jobs' own JSON files are (said last)."""
    from ..bench.scaling import format_scaling, plot_scaling, scaling_row

    click.echo("")
    _suite_outputs(results, format_scaling(results), scaling_row, plot_scaling, json_path, csv_path, plot_path)
    if out_dir is not None:
        click.echo(f"each job's JSON is in {out_dir}")


def select_outputs(mode: str, results: list[dict[str, Any]], json_path, csv_path, plot_path) -> None:
    """``bench select``'s --json (a single point stays one object), --csv and --plot."""
    from ..bench.select_sweep import select_outputs as _select_files
    from ..results.provenance import local_provenance

    prov = local_provenance()
    for r in results:
        r.setdefault("provenance", prov)
    obj = results[0] if (mode == "kernels" and len(results) == 1) else results
    fb = Fallback(obj)
    fb.attempt("--json", json_path, lambda: write_json(json_path, obj))
    fb.attempt("--csv", csv_path, lambda: _select_files(mode, results, csv_path, None, echo=click.echo))
    fb.attempt("--plot", plot_path, lambda: _select_files(mode, results, None, plot_path, echo=click.echo))


# --------------------------------------------------------------------------- train
def train_log(comm, csv_path: str | None, resume: bool):
    """``train --csv``: the per-step log (rank 0), or None."""
    return CsvLog(csv_path, append=resume) if (csv_path and comm.rank == 0) else None


def train_step_log(comm, steps: dict[str, list], log, s: str):
    """The per-step callback of scheme ``s`` (rank 0): keeps the record for --plot, writes --csv."""
    steps[s] = []

    def step_log(rec, _s=s):
        steps[_s].append(rec)
        if log is not None:
            log.row(_s, rec)

    return step_log if comm.rank == 0 else None


def print_train_header(comm, s: str, model: str, data: str, density: float, epochs: int) -> None:
    if comm.rank == 0:
        click.echo(f"\n{s}: {model} on {data}, W={comm.size}, density {density:g}, {epochs} epochs")


def print_train_result(res) -> None:
    """``train``: one scheme's per-phase table and final metrics (rank 0)."""
    click.echo(format_run(res, "train"))


def finish_train(results: list, steps: dict[str, list], log, json_path: str | None, plot_path: str | None) -> None:
    """``train``: the comparison of several schemes, --json, the --csv log, --plot (rank 0); with no result
    (every scheme stopped) only the log is closed."""
    if not results:
        if log is not None:
            log.close()
        return
    if len(results) > 1:
        click.echo("\n" + format_train_comparison(results))
    if log is not None:
        log.close()
    write_results(results, command="train", json_path=json_path, plot_path=plot_path, steps=steps, echo=click.echo)


def train_progress(comm, label: str = "train"):
    """Rank 0: epoch summaries always (stdout); per batch, with progress on, a live status line on a terminal
    or a status line every ``--progress-interval`` seconds off one (stderr)."""
    if comm.rank != 0:
        return None
    tty = sys.stderr.isatty()
    from ..results.progress import Progress

    state: dict[str, Any] = {}

    def report(msg: str | None, *, done: int | None = None, total: int | None = None, **fields: Any) -> None:
        if msg is None:
            if tty and _PROGRESS["enabled"]:
                click.echo("\r\033[K", err=True, nl=False)
        elif done is not None and total is not None:  # one batch
            if not _PROGRESS["enabled"]:
                return
            bar = state.get("bar")
            if bar is None or bar.total != total:
                bar = state["bar"] = Progress(label, total, interval=_PROGRESS["interval"], tty=False)
            if tty:
                click.echo("\r\033[K" + msg, err=True, nl=False)
            else:
                bar.update(done, msg, **fields)
        else:
            click.echo(msg)

    return report
