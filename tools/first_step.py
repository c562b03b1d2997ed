"""Seconds from a rank's process start to its first training step: ``mpiexec -n W python tools/first_step.py train ...``.

Runs the ``mpisparse`` CLI unchanged except that the data-parallel step
(:class:`mpisparse.train.loop.CollectiveStep`) prints, on its first batch,
how long ago the kernel started this process (``/proc/self/stat``, Linux):
imports, MPI's start, the data and the model, everything before the first
step.  docs/performance-log.md quotes it for ``train``'s start-up.
"""

from __future__ import annotations

import os
import sys


def seconds_since_start() -> float:
    """Seconds since the kernel started this process (Linux)."""
    stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    started = int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks after boot
    return float(open("/proc/uptime").read().split()[0]) - started


def main() -> None:
    from mpisparse.cli import main as cli_main
    from mpisparse.train import loop

    first = loop.CollectiveStep.train_batch
    seen = []

    def train_batch(self, *args, **kwargs):
        if not seen:
            seen.append(True)
            print(f"rank {self.comm.rank}: first step {seconds_since_start():.2f} s after the process started",
                  file=sys.stderr, flush=True)
        return first(self, *args, **kwargs)

    loop.CollectiveStep.train_batch = train_batch
    cli_main()


if __name__ == "__main__":
    main()
