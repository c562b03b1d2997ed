"""``train -n W --max-restarts N``: the launcher starts the job again from its last checkpoint when a rank dies.

torchrun's word for it.  The process that the user started (not a rank)
runs ``mpiexec -n W`` (:func:`mpisparse.mpi.launch.relaunch`); when the job
ends with a failure -- a rank killed, a rank's error ending the job, a
launcher that could not start every rank -- it prints one line and starts
the job again, with ``--resume`` once a checkpoint exists in every
``--checkpoint`` folder (``--overwrite-checkpoint`` dropped), at most ``N``
times.  Not restarted: success, a usage error (exit code 2), and a job that
was stopped (SIGINT, SIGTERM, SIGHUP to this process: ``128 + signal``).

``--min-ranks M``: when fewer than ``W`` ranks of a failed launch started
(the ranks say so as they start, see :func:`mpisparse.mpi.launch.report_started`:
a host that is gone), the next start asks for that many, if at least ``M``;
the checkpoint's residuals are redistributed over the new number of ranks
(:mod:`mpisparse.train.reshard`; a parameter-server checkpoint refuses it).

The outcome: exit code 0 once the job completes (whatever the number of
restarts), else the last failure's; a last line ``completed after K
restart(s)`` or ``gave up after K restart(s)``; ``--json`` gets a ``restarts``
key (each result of a list).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Sequence

import click

from ..mpi.launch import LaunchError, launcher_mismatch, relaunch, under_mpi_launcher
from . import session

__all__ = ["check_restart_options", "next_world_size", "restart_argv", "run_with_restarts"]

#: exit codes of a job that was stopped on purpose (the wrapper got SIGINT, SIGTERM or SIGHUP)
_STOPPED = {128 + int(s) for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM))}


def check_restart_options(max_restarts: int, min_ranks: int | None, nprocs: int | None,
                          checkpoint: str | None) -> None:
    """One line (UsageError) for options that cannot restart a job."""
    if min_ranks is not None and not max_restarts:
        raise click.UsageError("--min-ranks applies to restarts: add --max-restarts N")
    if not max_restarts:
        return
    if checkpoint is None:
        raise click.UsageError("--max-restarts needs --checkpoint DIR: a restart continues from the last checkpoint")
    if under_mpi_launcher() and os.environ.get("MPISPARSE_SPAWNED"):
        return  # a rank of the launch that restarts: it trains
    if nprocs is None or under_mpi_launcher():
        raise click.UsageError("--max-restarts needs -n W outside a launcher: mpisparse's own launch restarts the "
                               "job (under srun or mpiexec, let the scheduler requeue it)")
    if min_ranks is not None and min_ranks > nprocs:
        raise click.UsageError(f"--min-ranks is {min_ranks}; allowed range is [1, -n = {nprocs}]")


def next_world_size(n: int, started: int, min_ranks: int | None) -> int | None:
    """The ranks of the next start after a failed one of ``n`` ranks of which ``started`` started; None: none
    can (fewer than ``--min-ranks`` came up)."""
    if min_ranks is None or started >= n or started <= 0:
        return n
    return started if started >= min_ranks else None


def restart_argv(argv: Sequence[str], checkpoints: Sequence[str]) -> list[str]:
    """The command line of a restart: ``--resume`` once every checkpoint folder holds one, without
    ``--overwrite-checkpoint``; else the original line (nothing to resume yet: a fresh start)."""
    if not all((Path(d) / "LATEST").is_file() for d in checkpoints):
        return list(argv)
    out = [a for a in argv if a != "--overwrite-checkpoint"]
    return out if "--resume" in out else [*out, "--resume"]


def _with_n(argv: Sequence[str], n: int) -> list[str]:
    """``argv`` with its ``-n``/``--nprocs`` value replaced by ``n`` (the ranks check it against the job)."""
    out = list(argv)
    for i, a in enumerate(out):
        if a in ("-n", "--nprocs") and i + 1 < len(out):
            out[i + 1] = str(n)
        elif a.startswith("--nprocs="):
            out[i] = f"--nprocs={n}"
        elif a.startswith("-n") and a[2:].isdigit():
            out[i] = f"-n{n}"
    return out


def _note_json(json_path: str | None, restarts: int) -> None:
    if not json_path or not Path(json_path).is_file():
        return
    data = json.loads(Path(json_path).read_text())
    for rec in data if isinstance(data, list) else [data]:
        if isinstance(rec, dict):
            rec["restarts"] = restarts
    Path(json_path).write_text(json.dumps(data, indent=2) + "\n")


def run_with_restarts(nprocs: int, timeout: int | None, max_restarts: int, min_ranks: int | None,
                      checkpoints: Sequence[str], json_path: str | None) -> None:
    """Run this command under ``mpiexec -n nprocs``, restarting it on failure (see the module); exits."""
    mismatch = launcher_mismatch(1)
    if mismatch is not None:
        raise click.ClickException(mismatch)
    argv, n, restarts = list(session.ARGV), nprocs, 0
    while True:
        started: dict[str, int] = {}
        try:
            code = relaunch(n, _with_n(argv, n), timeout=timeout, started=started)
        except LaunchError as e:
            raise click.ClickException(str(e)) from None
        if code == 0 or code == 2 or code in _STOPPED:
            break
        nxt = next_world_size(n, started.get("ranks", n), min_ranks)
        if restarts >= max_restarts or nxt is None:
            why = (f"only {started.get('ranks', 0)} of {n} ranks started, fewer than --min-ranks {min_ranks}"
                   if nxt is None else f"--max-restarts {max_restarts} reached")
            click.echo(f"mpisparse: the job failed (exit code {code}); {why}: gave up after {restarts} "
                       f"restart{'s' if restarts != 1 else ''}", err=True)
            raise SystemExit(code)
        restarts += 1
        argv = restart_argv(argv, checkpoints)
        where = ("from the last checkpoint in " + ", ".join(checkpoints) if "--resume" in argv
                 else "from the start (no checkpoint was written yet)")
        fewer = f" on {nxt} ranks ({started.get('ranks')} of {n} started)" if nxt != n else ""
        click.echo(f"mpisparse: the job failed (exit code {code}); restart {restarts}/{max_restarts}{fewer} "
                   f"{where}", err=True)
        n = nxt
    if code == 0:
        _note_json(json_path, restarts)
        click.echo(f"mpisparse: completed after {restarts} restart{'s' if restarts != 1 else ''}", err=True)
    raise SystemExit(code)
