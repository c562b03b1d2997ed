"""The ``mpisparse`` command line (click): one module per command group.

=============  ==============================================================
``main``       the group, the console entry point, errors, MPI abort
``info``       ``mpisparse info``
``advise``     ``mpisparse advise`` (the advisor, no MPI) and ``advise-steps``
``bench``      ``mpisparse bench step|exchange|select|scaling`` (``bench_tta``: ``bench tta``)
``train``      ``mpisparse train``
``jobs``       ``mpisparse jobs list|render|examples``
``reproduce``  ``mpisparse reproduce``
``options``    option groups, list parsers, checks of the command line
``session``    ``-n`` re-launch, the communicator, the configuration agreement
``output``     what the commands print and write about their results
=============  ==============================================================

Every command that runs ranks takes ``-n W``: outside MPI it re-runs itself
under ``mpiexec -n W``; under ``mpiexec``/``srun`` it checks the job size.
Nothing outside this package imports it.
"""

from .advise import advise, advise_steps
from .bench import bench
from .bench_tta import bench_tta
from .info import info
from .jobs import jobs
from .main import cli, main
from .reproduce import reproduce
from .session import open_comm
from .train import train

__all__ = ["cli", "main", "open_comm"]

cli.add_command(info)
cli.add_command(bench)
bench.add_command(bench_tta)
cli.add_command(train)
cli.add_command(jobs)
cli.add_command(reproduce)
cli.add_command(advise)
cli.add_command(advise_steps)
