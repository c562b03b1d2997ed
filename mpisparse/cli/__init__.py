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

from .main import cli, main
from .session import open_comm

__all__ = ["cli", "main", "open_comm"]

# Each command's module is imported when that command runs: `train` does not pay for `bench`'s imports.
cli.lazy.update({
    "info": "mpisparse.cli.info:info",
    "bench": "mpisparse.cli.bench:bench",
    "train": "mpisparse.cli.train:train",
    "jobs": "mpisparse.cli.jobs:jobs",
    "reproduce": "mpisparse.cli.reproduce:reproduce",
    "advise": "mpisparse.cli.advise:advise",
    "advise-steps": "mpisparse.cli.advise:advise_steps",
})
