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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

# Variables a process manager sets in every rank it starts: MPICH/Hydra and
# Intel MPI (PMI_*), Open MPI (OMPI_*), PMIx (srun --mpi=pmix, prte).
_LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


# How long a failing rank waits between writing its error and MPI_Abort: the
# launcher forwards a rank's stderr asynchronously, and an immediate Abort can
# tear the job down before the error reached the terminal (seen with Hydra on a
# loaded 2-core machine: the whole traceback lost).
ABORT_GRACE_S = 0.5


def abort_job(mpi_comm, code: int = 1) -> None:
    """Flush this rank's output, give the launcher :data:`ABORT_GRACE_S` to forward it, then ``Abort``."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    time.sleep(ABORT_GRACE_S)
    mpi_comm.Abort(code)


def under_mpi_launcher(env: Mapping[str, str] = os.environ) -> bool:
    """True inside a rank started by mpiexec, mpirun or srun."""
    return any(v in env for v in _LAUNCHER_RANK_VARS + _LAUNCHER_SIZE_VARS)


def under_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    """True inside a process started by ``torchrun`` (torch.distributed's elastic launcher), not by MPI."""
    if under_mpi_launcher(env):
        return False
    return "TORCHELASTIC_RUN_ID" in env or all(v in env for v in ("LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR"))


def env_rank(env: Mapping[str, str] = os.environ) -> int:
    """This rank's number from the launcher's environment (torchrun's ``RANK`` too; 0 outside a launcher).

    Known before MPI is initialised, so errors found while parsing options
    are printed by rank 0 only.
    """
    names = _LAUNCHER_RANK_VARS + (("RANK",) if under_torchrun(env) else ())
    for v in names:
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

    return flavor_of_version_text(MPI.Get_library_version())


def flavor_of_version_text(text: str) -> str:
    """``"openmpi"``, ``"mpich"`` or ``"other"`` from an MPI library's or launcher's version text."""
    text = text.lower()
    if "open mpi" in text or "open-rte" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text or "mvapich" in text:
        return "mpich"
    return "other"


_LAUNCHER_FLAVORS: dict[str, str] = {}


def launcher_flavor(mpiexec: str) -> str:
    """The flavour of the ``mpiexec`` that will start the job, from its ``--version``.

    The launcher decides which options are understood (``--oversubscribe``,
    ``--allow-run-as-root`` are Open MPI's; Hydra rejects them), and it can
    come from another MPI than the library mpi4py loaded.  Falls back to
    the library's flavour (:func:`mpi_flavor`) when the launcher says nothing
    recognisable.
    """
    if mpiexec not in _LAUNCHER_FLAVORS:
        try:
            out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20,
                                 stdin=subprocess.DEVNULL)
            flavor = flavor_of_version_text(out.stdout + out.stderr)
        except (OSError, subprocess.SubprocessError):
            flavor = "other"
        _LAUNCHER_FLAVORS[mpiexec] = flavor if flavor != "other" else mpi_flavor()
    return _LAUNCHER_FLAVORS[mpiexec]


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


def has_remote_shell() -> bool:
    """Whether ``ssh`` or ``rsh`` is on PATH (Open MPI's launcher wants one)."""
    return bool(shutil.which("ssh") or shutil.which("rsh"))


@dataclass
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def build_mpiexec_command(n: int, args: Sequence[str], *, mpiexec: str = "mpiexec",
                          python: str = sys.executable, flavor: str = "mpich",
                          as_root: bool = False, timeout: int | None = None,
                          remote_shell: bool = True) -> LaunchPlan:
    """The command that runs ``mpisparse ARGS`` on ``n`` ranks.

    Open MPI refuses to run as root without ``--allow-run-as-root`` and more
    ranks than cores without ``--oversubscribe``; MPICH's Hydra needs
    neither.  ``timeout`` bounds the whole job (``MPIEXEC_TIMEOUT`` for Hydra,
    ``--timeout`` for Open MPI).  Ranks run ``python -m mpisparse``, which
    aborts the whole job when any rank raises.  ``remote_shell`` False (no
    ``ssh``/``rsh`` on this machine) empties Open MPI's remote-shell agent.
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
        if not remote_shell:
            # no ssh/rsh (a container): Open MPI's rsh launcher fails at start-up even for a
            # job on this one host unless its agent is empty
            env["OMPI_MCA_plm_rsh_agent"] = ""
            env["PRTE_MCA_plm_ssh_agent"] = ""
    elif timeout:
        env["MPIEXEC_TIMEOUT"] = str(int(timeout))
    argv += [python, "-m", "mpisparse", *args]
    return LaunchPlan(argv, env)


#: the folder where ranks of a ``-n`` re-launch say they started (:func:`report_started`)
LAUNCH_DIR = "MPISPARSE_LAUNCH_DIR"


class LaunchError(RuntimeError):
    """The launcher could not be started, or it started no rank."""


def relaunch(n: int, args: Sequence[str], *, timeout: int | None = None, started: dict | None = None) -> int:
    """Run ``mpisparse ARGS`` under ``mpiexec -n n``; returns its exit code (``started["ranks"]``: how many
    ranks said they started, :func:`report_started`).

    Signals to this process are passed on to the job (see
    :mod:`mpisparse.mpi.signals`).  A launch that exits 0 although no rank of
    this job started (``MPISPARSE_MPIEXEC=/bin/true``, a launcher that
    ignored the command) raises :class:`LaunchError`: never a silent 0.
    """
    import tempfile

    from .signals import run_launcher

    try:
        mpiexec = find_mpiexec()
    except RuntimeError as e:
        raise LaunchError(str(e)) from None
    flavor = launcher_flavor(mpiexec)
    plan = build_mpiexec_command(
        n, args, mpiexec=mpiexec, flavor=flavor,
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0, timeout=timeout,
        remote_shell=has_remote_shell(),
    )
    started_dir = tempfile.mkdtemp(prefix="mpisparse-launch-")
    # a value the user set for the agent wins
    env = dict(os.environ, **{k: v for k, v in plan.env.items() if k not in os.environ}, MPISPARSE_SPAWNED="1")
    env[LAUNCH_DIR] = started_dir
    try:
        code = run_launcher(plan.argv, env)
        reported = len(os.listdir(started_dir))
    except OSError as e:
        raise LaunchError(f"cannot start {mpiexec}: {e.strerror or e}; set MPISPARSE_MPIEXEC to a working "
                          "mpiexec") from None
    finally:
        shutil.rmtree(started_dir, ignore_errors=True)
    if started is not None:
        started["ranks"] = reported
    if code == 0 and reported == 0:
        raise LaunchError(
            f"{mpiexec} -n {n} exited 0 but started no rank of this job; MPISPARSE_MPIEXEC or PATH must name the "
            f"mpiexec of the MPI that mpi4py uses ({mpi_flavor()})")
    return code


def report_started(env: Mapping[str, str] = os.environ) -> None:
    """In a rank of a ``-n`` re-launch: tell the wrapper this rank started (see :func:`relaunch`)."""
    folder = env.get(LAUNCH_DIR)
    if folder and under_mpi_launcher(env):
        try:
            with open(os.path.join(folder, str(os.getpid())), "w"):
                pass
        except OSError:  # a rank on another host: the folder is the wrapper's
            pass


# MPI launchers' own world size, then batch systems' and other frameworks' (used only when no MPI launcher
# variable is set: an mpiexec inside a Slurm allocation or a torchrun job decides the MPI job's size).
_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launcher_mismatch(mpi_size: int, env: Mapping[str, str] = os.environ) -> str | None:
    """One line when the launcher's environment says the job has more processes than MPI's world has.

    A launcher from another MPI than the library mpi4py loaded, ``srun``
    without a PMI plugin, or ``torchrun`` start processes that each come up
    as a one-rank MPI world and would silently train alone.  None when the
    sizes agree (or nothing says otherwise).
    """
    fix_mpi = (f"launch with the mpiexec of the MPI mpi4py uses ({_flavor_or_other()}), e.g. "
               "mpisparse ... -n W, or srun --mpi=pmi2/pmix")
    for var in _MPI_SIZE_VARS:
        n = _int_env(env, var)
        if n is not None and n > mpi_size:
            return f"{var}={n} says the job has {n} processes but MPI's world has {mpi_size}: {fix_mpi}"
    for var in _MPI_RANK_VARS:
        r = _int_env(env, var)
        if r is not None and r >= mpi_size:
            return (f"{var}={r} says this is process {r} but MPI's world has {mpi_size} "
                    f"rank{'s' if mpi_size != 1 else ''}: {fix_mpi}")
    if any(v in env for v in _MPI_SIZE_VARS + _MPI_RANK_VARS):
        return None
    for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        n = _int_env(env, var)
        if n is not None and n > mpi_size and "SLURM_STEP_ID" in env:
            return (f"{var}={n} says srun started {n} tasks but MPI's world has {mpi_size}: srun gave the tasks "
                    f"no MPI environment; use srun --mpi=pmi2 or --mpi=pmix (or mpiexec -n {n} in the allocation)")
    n = _int_env(env, "WORLD_SIZE")
    if n is not None and n > mpi_size:
        return (f"WORLD_SIZE={n} says the job has {n} processes but MPI's world has {mpi_size}: torchrun-style "
                f"launchers do not start an MPI job; use mpisparse ... -n {n} (or mpiexec -n {n}), or unset "
                "WORLD_SIZE")
    return None


def _int_env(env: Mapping[str, str], var: str) -> int | None:
    try:
        return int(env[var])
    except (KeyError, ValueError):
        return None


def _flavor_or_other() -> str:
    try:
        return mpi_flavor()
    except Exception:  # noqa: BLE001 - only for a message
        return "unknown"
