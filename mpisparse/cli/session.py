"""Running a command as MPI ranks: ``-n`` re-launch, the communicator, the configuration agreement.

:func:`mpisparse.cli.main.main` records the command line in :data:`ARGV`;
:func:`maybe_relaunch` re-runs it under ``mpiexec -n W`` outside MPI.
"""

from __future__ import annotations

from typing import Any, Sequence

import click

from ..mpi.launch import LaunchError, launcher_mismatch, relaunch, under_mpi_launcher

__all__ = ["ARGV", "agree_on_config", "maybe_relaunch", "open_comm"]

#: the command line this process was started with (re-used by -n)
ARGV: list[str] = []
#: set by a torchrun job once its process group is destroyed and its output written: :func:`mpisparse.cli.main.main`
#: then ends the process without the interpreter's teardown, where torch's C++ threads of a gloo job were seen to
#: abort it (``terminate called without an active exception``, SIGABRT, no Python frame left: ``deft`` under
#: ``torchrun --nproc-per-node 2`` beside two busy processes on 2 cores, 1 run in 12 and 1 in 17)
END_WITHOUT_TEARDOWN = False


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


def open_comm(nprocs: int | None, check: bool = False, cuda_aware: bool | None = None, *,
              configs: Sequence[Any] = (), hierarchical: bool = False, gpu: bool = False):
    """The communicator a command runs on; ``configs`` are first compared across ranks.

    A launcher that started processes MPI does not see as one job is refused
    first (each would train alone).  The comparison runs on a plain
    communicator, before ``check`` or ``cuda_aware`` (which are part of the
    configurations) change how any collective runs: ranks that disagree on
    them fail instead of hanging.  ``hierarchical``: two-level collectives
    (:class:`mpisparse.mpi.hierarchy.HierarchicalCommunicator`).  ``gpu``: the job
    puts arrays on GPUs, so each rank's GPU is selected (by local rank)
    before anything allocates on one, and a CUDA-aware library is probed.
    Without it no CUDA call is made: a host job on a GPU node creates no CUDA
    context (one cost each rank 268 MiB of host memory on an H100 host).
    """
    from mpi4py import MPI

    from ..mpi.comm import Communicator
    from ..mpi.device import assign_device

    mismatch = launcher_mismatch(MPI.COMM_WORLD.Get_size())
    if mismatch is not None:
        raise click.UsageError(mismatch)
    plain = Communicator(cuda_aware=False)
    if nprocs is not None and plain.size != nprocs:
        raise click.UsageError(f"-n {nprocs} was given but the MPI job has {plain.size} ranks")
    if configs:
        agree_on_config(plain, configs)
    if gpu:
        assign_device(plain)  # GPU by local rank, before any probe allocates on one
    comm = Communicator(check=check, cuda_aware=cuda_aware, host_only=not gpu)
    if hierarchical:
        from ..mpi.hierarchy import HierarchicalCommunicator

        comm = HierarchicalCommunicator(comm)
    return comm


def open_torch_dist(device: str, configs: Sequence[Any] = ()):
    """The communicator of a ``torchrun`` job: ``torch.distributed`` (gloo on CPU; NCCL and gloo for ``--device cuda``)
    initialised from torchrun's environment, wrapped as :class:`mpisparse.torch.dist.TorchDistCommunicator`;
    ``configs`` are compared across ranks first.  No MPI is started."""
    import torch.distributed as dist

    from ..torch.dist import TorchDistCommunicator

    if not dist.is_initialized():
        if device == "cuda":
            from ..mpi.device import assign_torchrun_device

            try:
                assign_torchrun_device()  # this worker's GPU (CuPy's and torch's current device)
            except ValueError as e:
                raise click.UsageError(str(e)) from None
        # CUDA tensors through NCCL, the small host tensors (counts, objects) through gloo
        dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo")
    comm = TorchDistCommunicator()
    if configs:
        agree_on_config(comm, configs)
    return comm


def agree_on_config(comm, configs: Sequence[Any]) -> None:
    """Fail on every rank, naming the differences, if ranks disagree on any field of ``configs``."""
    from ..config import check_agreement

    check_agreement(comm, configs)
