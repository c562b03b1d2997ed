"""Running a command as MPI ranks: ``-n`` re-launch, the communicator, the configuration agreement.

:func:`mpisparse.cli.main.main` records the command line in :data:`ARGV`;
:func:`maybe_relaunch` re-runs it under ``mpiexec -n W`` outside MPI.
"""

from __future__ import annotations

from typing import Any, Sequence

import click

from ..launch import LaunchError, launcher_mismatch, relaunch, under_mpi_launcher

__all__ = ["ARGV", "agree_on_config", "maybe_relaunch", "open_comm"]

#: the command line this process was started with (re-used by -n)
ARGV: list[str] = []


def maybe_relaunch(nprocs: int | None, timeout: int | None) -> bool:
    """Re-run this command under mpiexec when asked for W ranks outside MPI.

    Returns False when this process should go on and run as a rank.
    """
    if nprocs is None or under_mpi_launcher():
        return False
    # srun without an MPI plugin or torchrun started several copies of this command: each would
    # start its own mpiexec -n W
    mismatch = launcher_mismatch(1)
    if mismatch is not None:
        raise click.ClickException(mismatch)
    try:
        code = relaunch(nprocs, ARGV, timeout=timeout)
    except LaunchError as e:
        raise click.ClickException(str(e)) from None
    raise SystemExit(code)


def open_comm(nprocs: int | None, check: bool = False, cuda_aware: bool | None = None):
    from mpi4py import MPI

    from ..comm import Communicator
    from ..device import assign_device

    # a launcher that started processes MPI does not see as one job: each would train alone
    mismatch = launcher_mismatch(MPI.COMM_WORLD.Get_size())
    if mismatch is not None:
        raise click.UsageError(mismatch)
    assign_device(Communicator(cuda_aware=False))  # GPU by local rank, before any probe allocates on one
    comm = Communicator(check=check, cuda_aware=cuda_aware)
    if nprocs is not None and comm.size != nprocs:
        raise click.UsageError(f"-n {nprocs} was given but the MPI job has {comm.size} ranks")
    return comm


def agree_on_config(comm, configs: Sequence[Any]) -> None:
    """Fail on every rank, naming the differences, if ranks disagree on any field of ``configs``."""
    from ..config import check_agreement

    check_agreement(comm, configs)
