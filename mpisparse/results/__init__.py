"""Results of runs: the typed :class:`RunResult` and its views.

* :mod:`.schema` -- :class:`RunResult` (its docstring is the JSON schema) and :data:`SCHEMA_VERSION`;
* :mod:`.build` -- the reductions over ranks the runtimes build their results with;
* :mod:`.tables` -- the printed tables (:func:`format_run`, :func:`format_comparison`, ...);
* :mod:`.files` -- JSON (atomic), CSV rows, the per-step CSV log of ``train``;
* :mod:`.plots` -- the PNGs;
* :mod:`.provenance` -- the ``provenance`` block every result carries.

Front ends call :func:`format_run` after each run and :func:`write_results`
once at the end (rank 0).  Nothing here imports MPI or torch.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .files import CsvLog, Fallback, columns_of, json_ready, path_problem, result_row, write_csv, write_json
from .plots import PNG_SIGNATURE, Panel, Series, check_plot_support, plot_history, plot_panels, plot_phase_bars
from .provenance import gather_provenance
from .schema import SCHEMA_VERSION, RunResult
from .tables import (Column, format_comparison, format_ps_report, format_rows, format_run, format_table,
                     format_train_comparison, mp_summary)

__all__ = ["Column", "CsvLog", "Fallback", "PNG_SIGNATURE", "Panel", "RunResult", "SCHEMA_VERSION", "Series",
           "check_plot_support", "columns_of", "format_comparison", "format_ps_report", "format_rows", "format_run",
           "format_table", "format_train_comparison", "gather_provenance", "json_ready", "mp_summary", "path_problem",
           "plot_history", "plot_panels", "plot_phase_bars", "result_row", "write_csv", "write_json", "write_results"]

Path = str | os.PathLike


def write_results(results: Sequence[RunResult], *, command: str, json_path: Path | None = None,
                  csv_path: Path | None = None, plot_path: Path | None = None,
                  steps: dict[str, list[dict[str, Any]]] | None = None,
                  echo: Callable[[str], Any] | None = None) -> None:
    """The files of a command's results (rank 0): ``--json``, ``--csv`` and ``--plot``.

    JSON: one object for one result, a list for several.  CSV: one row per
    result (``bench step``; ``train``'s per-step log is a :class:`CsvLog`).
    Plot: ``bench step`` draws :func:`plot_phase_bars`, ``train``
    :func:`plot_history` from ``steps`` (scheme -> per-step log records).
    ``echo`` is told where a plot went.  A file that cannot be written is
    named in a warning on stderr and the results are printed to stdout as
    JSON instead (:class:`Fallback`): they are never lost.
    """
    obj = results[0] if len(results) == 1 else list(results)
    fb = Fallback(obj)
    fb.attempt("--json", json_path, lambda: write_json(json_path, obj))
    fb.attempt("--csv", csv_path, lambda: write_csv(csv_path, [result_row(r) for r in results]))

    def plot() -> None:
        if command == "train":
            plot_history(results, steps or {}, plot_path)
        else:
            r0 = results[0]
            plot_phase_bars(plot_path, results, title=f"{r0.config.get('model', '')}, W={r0.world_size}, "
                                                      f"density {r0.density_target:g}")
        if echo is not None:
            echo(f"plot written to {plot_path}")

    fb.attempt("--plot", plot_path, plot)
