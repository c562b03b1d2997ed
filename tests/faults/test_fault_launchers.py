"""Launchers that do not start one MPI job: a one-line error and a non-zero exit, never a silent 0.

A launcher from another MPI than mpi4py's library, ``srun`` without a PMI
plugin and ``torchrun`` start processes that each see a one-rank MPI world;
an ``MPISPARSE_MPIEXEC`` that runs nothing starts no rank at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpisparse.mpi.launch import launcher_mismatch, mpi_flavor

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["train", "--model", "mlp", "--data", "synthetic", "--epochs", "1"]
_LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID", "SLURM_PROCID", "WORLD_SIZE", "RANK",
                "MPISPARSE_MPIEXEC", "MPISPARSE_SPAWNED")


def run(args, env=None, argv0=None, timeout=120):
    full = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    full.update(OMP_NUM_THREADS="1", **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cmd = (argv0 or []) + [sys.executable, "-m", "mpisparse", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=ROOT, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("env, var", [
    ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2"),
    ({"SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}, "SLURM_NTASKS=2"),
    ({"PMI_SIZE": "2", "PMI_RANK": "0"}, "PMI_SIZE=2"),
])
def test_a_world_mpi_does_not_see_is_a_one_line_error(env, var):
    p = run(TRAIN, env)
    assert p.returncode != 0, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if var in ln]
    assert len(lines) == 1, p.stderr
    assert "MPI's world has 1" in lines[0] and ("use " in lines[0] or "launch with" in lines[0]), lines[0]
    assert "epoch" not in p.stdout  # it did not train alone


def test_mpiexec_that_starts_nothing_is_an_error_not_exit_0():
    p = run(["train", "-n", "2", *TRAIN[1:]], {"MPISPARSE_MPIEXEC": "/bin/true"})
    assert p.returncode != 0
    assert p.stdout == ""
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "/bin/true -n 2 exited 0 but started no rank" in err[0], p.stderr


def test_srun_without_mpi_refuses_to_start_one_mpiexec_per_task():
    p = run(["train", "-n", "2", *TRAIN[1:]],
            {"SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
             "MPISPARSE_MPIEXEC": "/bin/true"})
    assert p.returncode != 0
    assert "SLURM_STEP_NUM_TASKS=2 says srun started 2 tasks but MPI's world has 1" in p.stderr, p.stderr


def test_mismatch_rules():
    assert launcher_mismatch(2, {"PMI_SIZE": "2", "PMI_RANK": "1"}) is None
    assert launcher_mismatch(1, {}) is None
    # mpiexec inside a Slurm allocation or a torchrun job decides the MPI job's size
    assert launcher_mismatch(2, {"PMI_SIZE": "2", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}) is None
    assert launcher_mismatch(2, {"OMPI_COMM_WORLD_SIZE": "2", "WORLD_SIZE": "4"}) is None
    # a batch script (no job step) may run one process in a bigger allocation
    assert launcher_mismatch(1, {"SLURM_NTASKS": "8"}) is None
    assert "PMIX_RANK=3" in launcher_mismatch(1, {"PMIX_RANK": "3"})
    assert "OMPI_COMM_WORLD_SIZE=4" in launcher_mismatch(2, {"OMPI_COMM_WORLD_SIZE": "4"})


def _other_mpiexec() -> str | None:
    """``$MPISPARSE_TEST_OTHER_MPIEXEC``: the mpiexec of another MPI than mpi4py's (e.g. the other wheel's)."""
    exe = os.environ.get("MPISPARSE_TEST_OTHER_MPIEXEC")
    if not exe or not Path(exe).exists():
        return None
    from mpisparse.mpi.launch import launcher_flavor

    return exe if launcher_flavor(exe) != mpi_flavor() else None


def test_a_foreign_mpiexec_gives_errors_not_w_lonely_runs():
    exe = _other_mpiexec()
    if exe is None:
        pytest.skip("set MPISPARSE_TEST_OTHER_MPIEXEC to the mpiexec of another MPI than mpi4py's")
    from mpisparse.mpi.launch import build_mpiexec_command, launcher_flavor

    plan = build_mpiexec_command(2, [], mpiexec=exe, flavor=launcher_flavor(exe), as_root=os.geteuid() == 0,
                                 timeout=60, remote_shell=False)
    prefix = plan.argv[: plan.argv.index(sys.executable)]
    p = run(TRAIN, plan.env, argv0=prefix)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "epoch" not in p.stdout


@pytest.mark.parametrize("data, model", [("cifar10", "mlp"), ("text", "lstm")])
def test_a_missing_dataset_is_one_line_before_mpi_starts(tmp_path, data, model):
    started = tmp_path / "mpiexec-started"
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\ntouch {started}\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "empty").mkdir()
    for d in (tmp_path / "missing", tmp_path / "empty"):
        p = run(["train", "-n", "2", "--data", data, "--model", model, "--data-dir", str(d), "--epochs", "1"],
                {"MPISPARSE_MPIEXEC": str(fake)})
        assert p.returncode == 2, p.stderr
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1 and "--data-dir" in errors[0] and str(d.name) in errors[0], p.stderr
        assert not started.exists()  # nothing was launched


def test_an_mpi_error_stack_from_a_dead_peer_is_one_line():
    """A killed parameter server makes the workers' next MPI call fail with a multi-line error stack."""
    mpi_flavor()  # imports mpi4py's MPI without initialising MPI in this process
    from mpi4py import MPI

    from mpisparse.cli.main import _one_line

    class Stack(MPI.Exception):
        def __str__(self):
            return ("Fatal error in PMPI_Recv: Unknown error class, error stack:\nPMPI_Recv(173): MPI_Recv failed\n"
                    "MPIDI_CH3U_Receive(...): Communication error with rank 2")

    line = _one_line(Stack(MPI.ERR_OTHER))
    assert "\n" not in line
    assert line.startswith("MPI error: Fatal error in PMPI_Recv") and "another rank of the job may have died" in line
    assert _one_line(ValueError("bad")) == "ValueError: bad"
    assert not MPI.Is_initialized()
