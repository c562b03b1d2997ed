"""Starting ranks: detect an MPI launcher, or build the ``mpiexec`` command.

``mpisparse ... -n W`` outside MPI re-runs the same command line under
``mpiexec -n W``; under ``mpiexec``/``mpirun``/``srun`` it runs as one rank
of that job and only checks that the job has ``W`` ranks.  Building the
command is a pure function (:func:`build_mpiexec_command`) so tests can
assert the argument list.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

# Variables a process manager sets in every rank it starts: MPICH/Hydra and
# Intel MPI (PMI_*), Open MPI (OMPI_*), PMIx (srun --mpi=pmix, prte).
_LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def under_mpi_launcher(env: Mapping[str, str] = os.environ) -> bool:
    """True inside a rank started by mpiexec, mpirun or srun."""
    return any(v in env for v in _LAUNCHER_RANK_VARS + _LAUNCHER_SIZE_VARS)


def env_rank(env: Mapping[str, str] = os.environ) -> int:
    """This rank's number from the launcher's environment (0 outside MPI).

    Known before MPI is initialised, so errors found while parsing options
    are printed by rank 0 only.
    """
    for v in _LAUNCHER_RANK_VARS:
        if v in env:
            try:
                return int(env[v])
            except ValueError:
                pass
    return 0


def mpi_flavor() -> str:
    """``"openmpi"``, ``"mpich"`` or ``"other"``: the MPI mpi4py is built on.

    Reads the library version string without initialising MPI.
    """
    import mpi4py

    mpi4py.rc.initialize = False
    from mpi4py import MPI

    text = MPI.Get_library_version().lower()
    if "open mpi" in text:
        return "openmpi"
    if "mpich" in text or "intel(r) mpi" in text or "mvapich" in text:
        return "mpich"
    return "other"


def find_mpiexec(env: Mapping[str, str] = os.environ) -> str:
    """``$MPISPARSE_MPIEXEC``, else the mpiexec beside this Python, else on PATH."""
    if env.get("MPISPARSE_MPIEXEC"):
        return env["MPISPARSE_MPIEXEC"]
    sibling = Path(sys.executable).with_name("mpiexec")
    if sibling.exists():
        return str(sibling)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise RuntimeError(
            "no mpiexec found: install the MPI wheel (pip install mpich), put your site's "
            "mpiexec on PATH, or set MPISPARSE_MPIEXEC"
        )
    return found


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def build_mpiexec_command(n: int, args: Sequence[str], *, mpiexec: str = "mpiexec",
                          python: str = sys.executable, flavor: str = "mpich",
                          as_root: bool = False, timeout: int | None = None) -> LaunchPlan:
    """The command that runs ``mpisparse ARGS`` on ``n`` ranks.

    Open MPI refuses to run as root without ``--allow-run-as-root`` and more
    ranks than cores without ``--oversubscribe``; MPICH's Hydra needs
    neither.  ``timeout`` bounds the whole job (``MPIEXEC_TIMEOUT`` for Hydra,
    ``--timeout`` for Open MPI).  Ranks run ``python -m mpisparse``, which
    aborts the whole job when any rank raises.
    """
    if n < 1:
        raise ValueError(f"-n is {n}; the number of ranks must be >= 1")
    argv = [mpiexec, "-n", str(n)]
    env: dict[str, str] = {}
    if flavor == "openmpi":
        if as_root:
            argv.append("--allow-run-as-root")
        argv.append("--oversubscribe")
        if timeout:
            argv += ["--timeout", str(int(timeout))]
    elif timeout:
        env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    argv += [python, "-m", "mpisparse", *args]
    return LaunchPlan(argv, env)


def relaunch(n: int, args: Sequence[str], *, timeout: int | None = None) -> int:
    """Run ``mpisparse ARGS`` under ``mpiexec -n n``; returns its exit code."""
    plan = build_mpiexec_command(
        n, args, mpiexec=find_mpiexec(), flavor=mpi_flavor(),
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0, timeout=timeout,
    )
    env = dict(os.environ, **plan.env, MPISPARSE_SPAWNED="1")
    try:
        return subprocess.call(plan.argv, env=env)
    except KeyboardInterrupt:
        return 130
