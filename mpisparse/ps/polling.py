"""Waiting for a message or a send without spinning a shared core.

MPI's blocking ``Probe`` and ``Send`` poll the network in a tight loop.
With one core per rank that is the fastest way to wait; a parameter-server
job often has more ranks than cores (a server beside its workers), and
then a spinning server steals the core a worker needs to make progress.
:class:`Poller` waits with ``Iprobe`` / ``Testall`` instead: a few polls
back to back, then sleeps that grow from ``min_sleep`` to ``max_sleep``
(reset as soon as something arrives).  ``max_sleep = 0`` spins (the MPI
behaviour); the default is chosen by the world size against the cores
(``os.sched_getaffinity``) and overridden by ``MPISPARSE_PS_POLL``
(``spin`` or a maximal sleep in microseconds, e.g. ``200``).
"""

from __future__ import annotations

import os
import time

SPIN_POLLS = 50
DEFAULT_MAX_SLEEP_US = 200.0


def default_max_sleep(world: int) -> float:
    """Seconds: 0 (spin) with a core per rank, else :data:`DEFAULT_MAX_SLEEP_US`."""
    env = os.environ.get("MPISPARSE_PS_POLL", "").strip().lower()
    if env:
        if env == "spin":
            return 0.0
        try:
            us = float(env)
        except ValueError:
            raise ValueError(f"MPISPARSE_PS_POLL is {env!r}; use 'spin' or a sleep in microseconds") from None
        if us < 0:
            raise ValueError(f"MPISPARSE_PS_POLL is {env!r}; it must be >= 0")
        return us * 1e-6
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    local = int(os.environ.get("MPI_LOCALNRANKS", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", world)))
    return 0.0 if local <= cores else DEFAULT_MAX_SLEEP_US * 1e-6


class Poller:
    def __init__(self, comm, max_sleep: float | None = None):
        self.comm = comm
        self.max_sleep = default_max_sleep(comm.size) if max_sleep is None else float(max_sleep)
        self.min_sleep = min(10e-6, self.max_sleep)

    def probe(self, source: int | None = None, tag: int | None = None) -> tuple[int, int, int]:
        """Like ``comm.probe``: block until a matching message is there; returns (source, tag, bytes)."""
        if self.max_sleep <= 0:
            return self.comm.probe(source, tag)
        sleep = self.min_sleep
        polls = 0
        while True:
            hit = self.comm.iprobe(source, tag)
            if hit is not None:
                return hit
            polls += 1
            if polls > SPIN_POLLS:
                time.sleep(sleep)
                sleep = min(2 * sleep, self.max_sleep)

    def wait(self, pending: list) -> None:
        """Complete non-blocking sends."""
        if self.max_sleep <= 0 or not pending:
            self.comm.waitall(pending)
            return
        sleep = self.min_sleep
        polls = 0
        while not self.comm.test_all(pending):
            polls += 1
            if polls > SPIN_POLLS:
                time.sleep(sleep)
                sleep = min(2 * sleep, self.max_sleep)
