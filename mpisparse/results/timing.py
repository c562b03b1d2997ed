"""Named phase timers and their reduction over ranks.

A step is timed as a whole and split into phases from the fixed vocabulary
:data:`PHASES` (docs/design.md), so every scheme's breakdown reads the
same.  The timer keeps the sums over every timed step and a record of each of
the last :data:`KEEP_STEPS` steps (a long training run would otherwise grow
by one record a step); the reduction gives, per
phase, the mean over ranks and the max over ranks of each rank's mean
seconds per step.  The step time reported is the slowest rank's, because
the step waits for it.  The printed table is
:func:`mpisparse.results.format_table`.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator

PHASES: tuple[str, ...] = (
    "forward", "backward", "compensate", "select", "exchange_indices",
    "exchange_values", "update", "push", "pull", "server_apply",
    "send_activations", "send_gradients", "wait",
)
_NULL = nullcontext()
#: per-step records a timer keeps (the newest); means are over every timed step
KEEP_STEPS = 10_000


class PhaseTimer:
    """Accumulates seconds per phase for each timed step.

    ``enabled=False`` makes every context a no-op.  ``recording=False``
    (warm-up steps) times nothing and keeps nothing.  ``sync`` is called at
    each boundary when set: on a GPU it synchronises the device so a phase's
    time covers its kernels, not only their launch.
    """

    def __init__(self, enabled: bool = True, sync: Callable[[], None] | None = None, *, trace: bool = False):
        self.enabled = enabled
        self.recording = True
        self.sync = sync
        #: the last :data:`KEEP_STEPS` timed steps, oldest first
        self.records: deque[dict[str, float]] = deque(maxlen=KEEP_STEPS)
        #: timed steps so far, and each phase's (and ``step``'s) seconds summed over all of them
        self.steps = 0
        self.totals: dict[str, float] = {}
        self._current: dict[str, float] | None = None
        self._open: list[str] = []  # the phases open now, innermost last
        self._nested: list[float] = []  # per open phase, the seconds of the phases closed inside it
        #: with ``trace``: ``(name, start, end, step)`` of every timed step and phase, in seconds since
        #: the epoch (wall clock at the timer's creation plus the performance counter since), for
        #: :mod:`mpisparse.results.trace`
        self.spans: list[tuple[str, float, float, int]] | None = [] if trace else None
        self._origin = (time.time(), time.perf_counter())

    def wall(self, t: float) -> float:
        """A :func:`time.perf_counter` reading of this timer as seconds since the epoch."""
        return self._origin[0] + (t - self._origin[1])

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def phase(self, name: str):
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are: {', '.join(PHASES)}")
        if not (self.enabled and self.recording) or self._current is None:
            return _NULL
        return self._phase(name)

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """A phase's time excludes the phases nested in it (each counts once, in the innermost): the
        library's exchange runs at the end of ``backward()``, inside a caller's ``backward`` phase."""
        t0 = self._now()
        self._open.append(name)
        self._nested.append(0.0)
        try:
            yield
        finally:
            self._open.pop()
            inner = self._nested.pop()
            cur = self._current
            if cur is not None:
                t1 = self._now()
                cur[name] = cur.get(name, 0.0) + (t1 - t0) - inner
                if self._nested:
                    self._nested[-1] += t1 - t0
                if self.spans is not None:
                    self.spans.append((name, t0, t1, self.steps))

    def carve(self, name: str, seconds: float) -> None:
        """Move ``seconds`` of the innermost open phase to phase ``name`` (a wait measured inside it, e.g.
        the barrier before a collective with ``bench step --separate-wait``); nothing outside a timed step."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are: {', '.join(PHASES)}")
        cur = self._current
        if cur is None or not (self.enabled and self.recording):
            return
        if self._open:
            cur[self._open[-1]] = cur.get(self._open[-1], 0.0) - seconds
        cur[name] = cur.get(name, 0.0) + seconds

    @contextmanager
    def step(self) -> Iterator[dict[str, float]]:
        """Time one whole step; phases timed inside it belong to it."""
        if not (self.enabled and self.recording):
            yield {}
            return
        record: dict[str, float] = {}
        self._current = record
        t0 = self._now()
        try:
            yield record
        finally:
            t1 = self._now()
            record["step"] = t1 - t0
            self._current = None
            if self.spans is not None:
                self.spans.append(("step", t0, t1, self.steps))
            self.steps += 1
            for k, v in record.items():
                self.totals[k] = self.totals.get(k, 0.0) + v
            self.records.append(record)  # the oldest drops out past KEEP_STEPS

    def means(self) -> dict[str, float]:
        """Mean seconds per timed step (all of them, not only the kept records) of each phase seen, and of
        ``step``."""
        if self.steps == 0:
            return {}
        out = {k: self.totals[k] / self.steps for k in PHASES if k in self.totals}
        out["step"] = self.totals["step"] / self.steps
        return out


def reduce_over_ranks(comm, local: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{name: {"mean": .., "max": ..}}`` over ranks of each rank's value.

    A name some rank lacks counts as 0 there (that rank had no such phase).
    """
    everyone = comm.allgather_obj(local)
    names = [k for k in list(PHASES) + ["step"] if any(k in d for d in everyone)]
    names += sorted({k for d in everyone for k in d} - set(names))
    return {
        k: {
            "mean": sum(d.get(k, 0.0) for d in everyone) / len(everyone),
            "max": max(d.get(k, 0.0) for d in everyone),
        }
        for k in names
    }
