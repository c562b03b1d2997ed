"""The per-rank, per-phase timeline of a run in the Chrome trace-event format.

``--trace FILE`` writes one JSON object ``{"traceEvents": [...]}`` that
Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open: one process per
rank (``pid`` = rank, named ``rank R``), one complete event (``"ph": "X"``)
per timed step (``cat`` ``step``, name ``step N``) and per phase inside it
(``cat`` ``phase``, the phase's name from :data:`mpisparse.results.timing.PHASES`),
``ts``/``dur`` in microseconds since the earliest event of the run.  Ranks
on one host share its clock; across hosts the clocks are only as close as
the hosts' time synchronisation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

__all__ = ["trace_events", "trace_path", "write_trace"]


def trace_path(path: str | None, scheme: str, several: bool) -> str | None:
    """``--trace PATH`` of one scheme's run: PATH itself, or ``STEM-SCHEME.SUFFIX`` when a command runs
    several schemes (one trace file each)."""
    if path is None or not several:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{scheme}{p.suffix}"))


def trace_events(spans_by_rank: Sequence[Sequence[tuple[str, float, float, int]]]) -> list[dict[str, Any]]:
    """Chrome trace events from each rank's ``(name, start, end, step)`` spans (seconds since the epoch)."""
    starts = [s[1] for spans in spans_by_rank for s in spans]
    t0 = min(starts) if starts else 0.0
    events: list[dict[str, Any]] = []
    for rank, spans in enumerate(spans_by_rank):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for name, start, end, step in spans:
            is_step = name == "step"
            events.append({"name": f"step {step}" if is_step else name, "cat": "step" if is_step else "phase",
                           "ph": "X", "pid": rank, "tid": 0, "ts": round((start - t0) * 1e6, 3),
                           "dur": round(max(end - start, 0.0) * 1e6, 3), "args": {"step": step}})
    return events


def write_trace(path: str | os.PathLike, comm, timer) -> None:
    """Collective: gather every rank's spans of ``timer`` (a tracing :class:`~mpisparse.results.timing.PhaseTimer`);
    rank 0 writes ``path``."""
    local = [(n, timer.wall(a), timer.wall(b), s) for n, a, b, s in (timer.spans or [])]
    everyone = comm.allgather_obj(local)
    if comm.rank == 0:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"traceEvents": trace_events(everyone), "displayTimeUnit": "ms"}) + "\n")
        os.replace(tmp, path)
