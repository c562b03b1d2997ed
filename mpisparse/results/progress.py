"""Progress of long runs, on a terminal and in logs.

Rank 0 reports; the other ranks stay quiet.  On a terminal a live status
line is redrawn in place (``rich``'s progress bar).  Off a terminal -- under
``mpiexec`` (stderr is a pipe), in a SLURM log -- one plain line is printed
every ``interval`` seconds (``--progress-interval``, default 10), so a long
run shows it is alive and how far it is::

    [train dense] epoch 3/20 step 120/560 21% | 35.2 steps/s | ETA 0:00:12 | loss 0.1234

``--no-progress`` turns both off.  The clock and the stream can be given,
so the throttling is tested without waiting.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

__all__ = ["DEFAULT_INTERVAL", "Progress", "format_eta"]

#: seconds between two status lines off a terminal
DEFAULT_INTERVAL = 10.0


def format_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Progress of ``total`` units of work labelled ``label``.

    ``update(done, what="...", **fields)`` after each unit: ``what`` locates
    the unit (e.g. ``epoch 3/20``), ``fields`` are shown as ``key value``
    (floats with 4 significant digits).  ``close()`` ends the line and, off a
    terminal, prints a last status line if the run took more than one interval.
    """

    def __init__(self, label: str, total: int, *, interval: float = DEFAULT_INTERVAL, enabled: bool = True,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 tty: bool | None = None):
        self.label, self.total = label, max(int(total), 0)
        self.interval = float(interval)
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.enabled = bool(enabled) and self.total > 0
        self.tty = bool(self.stream.isatty()) if tty is None else bool(tty)
        self.start = clock()
        self.last_print = self.start
        self.done = 0
        self.lines = 0
        self._live: Any = None
        self._task: Any = None
        self._last_text = ""

    # ------------------------------------------------------------ formatting
    def rate(self) -> float | None:
        elapsed = self.clock() - self.start
        return self.done / elapsed if elapsed > 0 and self.done else None

    def status(self, what: str = "", **fields: Any) -> str:
        r = self.rate()
        eta = (self.total - self.done) / r if r else None
        parts = [f"[{self.label}]" + (f" {what}" if what else "")
                 + f" step {self.done}/{self.total} {100 * self.done // max(self.total, 1)}%",
                 f"{r:.1f} steps/s" if r else "- steps/s", f"ETA {format_eta(eta)}"]
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        return " | ".join(parts)

    # -------------------------------------------------------------- updates
    def update(self, done: int, what: str = "", **fields: Any) -> None:
        if not self.enabled:
            return
        self.done = min(int(done), self.total)
        self._last_text = self.status(what, **fields)
        if self.tty:
            self._draw(what, fields)
            return
        now = self.clock()
        if now - self.last_print >= self.interval:
            self._print(self._last_text)
            self.last_print = now

    def close(self) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif not self.tty and self.lines and self.done and self.last_print < self.clock():
            self._print(self._last_text)
        self.enabled = False

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
        self.lines += 1

    def _draw(self, what: str, fields: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeRemainingColumn

        if self._live is None:
            self._live = Bar(TextColumn("[bold]{task.description}"), BarColumn(),
                             TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                             TextColumn("{task.fields[extra]}"), console=Console(file=self.stream),
                             transient=True)
            self._live.start()
            self._task = self._live.add_task(self.label, total=self.total, extra="")
        extra = " ".join([what] + [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in fields.items()]).strip()
        self._live.update(self._task, completed=self.done, extra=extra)
