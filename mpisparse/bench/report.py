"""The tables, CSV rows and plots of the ``mpisparse bench`` suites and ``mpisparse reproduce``.

They are views of results and live in :mod:`mpisparse.results`; the suites
import them from here.
"""

from __future__ import annotations

from ..results import (PNG_SIGNATURE, Column, Panel, Series, check_plot_support, columns_of, format_rows,
                       plot_panels, plot_phase_bars, result_row, write_csv)

__all__ = ["Column", "Panel", "Series", "check_plot_support", "columns_of", "format_rows", "plot_panels",
           "plot_phase_bars", "result_row", "write_csv", "PNG_SIGNATURE"]
