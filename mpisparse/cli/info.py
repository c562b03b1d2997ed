"""``mpisparse info``: the MPI library, world size, CUDA-awareness, versions, GPUs."""

from __future__ import annotations

import click

from . import output
from .options import cuda_aware_option, mpi_options, writable_file
from .session import maybe_relaunch, open_comm

__all__ = ["info"]


@click.command()
@mpi_options
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, callback=writable_file,
              help="Also write the report as JSON to this file.")
@cuda_aware_option
def info(nprocs, timeout, json_path, cuda_aware) -> None:
    """MPI library, world size, CUDA-awareness, library versions, GPUs."""
    maybe_relaunch(nprocs, timeout)
    from ..mpi.info import collect_info

    comm = open_comm(nprocs, cuda_aware=cuda_aware, gpu=True)  # the rank -> GPU mapping is what it reports
    report = collect_info(comm)
    if comm.rank == 0:
        output.info_outputs(report, json_path)
