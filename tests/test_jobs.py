"""SLURM templates (``mpisparse jobs``) and ``bin/scaling-sweep``.

Rendering is checked as text and with ``bash -n``.  The job scripts are also
run for real with stand-ins for ``srun``/``mpirun``/``scontrol``
(tests/slurm_stub/: srun runs the step under MPICH's mpiexec, which forwards
USR1 to the ranks as srun does): SIGUSR1 to the batch script -> checkpoint,
exit 0, ``scontrol requeue``; the requeued script resumes with ``--resume``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HERE
from mpisparse import jobs
from mpisparse.cli import cli as mpisparse_cli
from mpisparse.cli.jobs import args_checker
from mpisparse.mpi.launch import find_mpiexec, launcher_flavor

ROOT = HERE.parent
STUBS = HERE / "slurm_stub"
MPISPARSE = [sys.executable, "-m", "mpisparse"]
BASE = {"nodes": 2, "time": "01:00:00"}
#: --args against the rendered command, with click's parser (what `mpisparse jobs render` passes to render)
CHECK_ARGS = args_checker(mpisparse_cli)
TRAIN = {**BASE, "args": "--model mlp --data digits"}


def cli(*args, check=False):
    return subprocess.run([*MPISPARSE, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=check)


def bash_n(text: str) -> None:
    p = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


# --------------------------------------------------------------------------- rendering
@pytest.mark.parametrize("name", sorted(jobs.TEMPLATES))
@pytest.mark.parametrize("launcher", jobs.LAUNCHERS)
@pytest.mark.parametrize("gpus", [0, 4])
def test_every_template_renders_to_valid_bash(name, launcher, gpus):
    given = {**(TRAIN if name == "train" else BASE), "launcher": launcher, "gpus_per_node": gpus}
    text = jobs.render(name, given)
    bash_n(text)
    assert not jobs.PLACEHOLDER.search(text)
    assert text.startswith("#!/bin/bash\n")
    # every #SBATCH line comes before the first command
    lines = text.splitlines()
    first_cmd = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first_cmd for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --time=01:00:00\n" in text
    assert "#SBATCH --signal=B:USR1@120\n" in text
    # only the templates that requeue themselves ask for it unless --requeue is given
    assert ("#SBATCH --requeue\n" in text) == (name in ("train", "sweep"))
    jobs.check_header(text)
    assert "trap on_usr1 USR1" in text
    command = jobs.TEMPLATES[name].command
    assert f'mpisparse {command} "${{ARGS[@]}}"' in text
    if launcher == "srun":
        assert ('srun --mpi=pmix --kill-on-bad-exit=1 --nodes="$nodes" --ntasks=$((nodes * TASKS_PER_NODE))'
                in text)
        assert "mpirun" not in text
    else:
        assert 'mpirun -n $((nodes * TASKS_PER_NODE)) --host "$hosts"' in text
        assert "srun " not in text
    if gpus:
        assert f"#SBATCH --gpus-per-node={gpus}\n" in text and f"#SBATCH --ntasks-per-node={gpus}\n" in text
        assert "export CUDA_VISIBLE_DEVICES=${gpus[l % ${#gpus[@]}]}" in text
    else:
        assert "#SBATCH --gpus-per-node" not in text and "#SBATCH --ntasks-per-node=1\n" in text
        assert "RANK=()" in text


def test_train_template_requeues_and_resumes():
    text = jobs.render("train", {**TRAIN, "checkpoint_dir": "$SCRATCH/ck"})
    assert 'CHECKPOINT="$SCRATCH/ck"' in text
    assert '--checkpoint "$CHECKPOINT" "${RESUME[@]}"' in text and "RESUME=(--resume)" in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
    assert 'kill -USR1 "$STEP_PID"' in text  # the warning is handed on as USR1: train checkpoints on it


def test_options_appear_and_optional_lines_drop():
    text = jobs.render("bench", {**BASE, "account": "proj1", "partition": "gpu", "job_name": "b1",
                                 "output": "logs/%x-%j.out", "setup": ("module load mpi", "source v/bin/activate"),
                                 "srun_mpi": "pmi2", "launcher_args": "--cpu-bind=cores", "signal_before": 300,
                                 "args": "--model vgg16 --scheme topk"})
    for line in ("#SBATCH --account=proj1", "#SBATCH --partition=gpu", "#SBATCH --job-name=b1",
                 "#SBATCH --output=logs/%x-%j.out", "#SBATCH --signal=B:USR1@300", "\nmodule load mpi\n",
                 "\nsource v/bin/activate\n", "srun --mpi=pmi2 --kill-on-bad-exit=1", "--cpu-bind=cores",
                 "ARGS=(--model vgg16 --scheme topk)", 'kill -TERM "$STEP_PID"'):
        assert line in text, line
    plain = jobs.render("bench", {**BASE, "srun_mpi": "default"})
    assert "--account" not in plain and "--partition" not in plain
    assert "srun --kill-on-bad-exit=1" in plain


def test_gres_sbatch_lines_and_requeue_on_request():
    text = jobs.render("bench", {**BASE, "gres": "gpu:a100:4", "sbatch": ("--constraint=a100", "#SBATCH --mem=0"),
                                 "args": "--model vgg16 --scheme topk --iters $ITERS"})
    jobs.check_header(text)
    assert "#SBATCH --gres=gpu:a100:4\n" in text and "--gpus-per-node" not in text
    assert "#SBATCH --ntasks-per-node=4\n" in text and "export CUDA_VISIBLE_DEVICES=" in text  # one GPU per rank
    assert "#SBATCH --constraint=a100\n#SBATCH --mem=0\n" in text
    assert "#SBATCH --requeue" not in text and "scontrol requeue" not in text
    asked = jobs.render("bench", {**BASE, "requeue": True})
    assert "#SBATCH --requeue\n" in asked and 'scontrol requeue "$SLURM_JOB_ID"' in asked
    assert "--requeue" in asked.splitlines()[2]  # the header's render command says so too
    assert jobs.gres_gpus("gpu:2,nvme:1") == 2 and jobs.gres_gpus("nvme:1") == 0 and jobs.gres_gpus("gpu") == 1
    cpu = jobs.render("bench", {**BASE, "gres": "nvme:1"})
    assert "#SBATCH --gres=nvme:1\n" in cpu and "RANK=()" in cpu


def test_header_check_names_the_bad_line():
    with pytest.raises(jobs.RenderError, match=r"line 3 '#SBATCH -N 2' is not '#SBATCH --option\[=value\]'"):
        jobs.check_header("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH -N 2\necho hi\n")
    with pytest.raises(jobs.RenderError, match=r"'#SBATCH' on line 3, after the first command \(line 2\)"):
        jobs.check_header("#!/bin/bash\necho hi\n#SBATCH --nodes=2\n")
    jobs.check_header("#!/bin/bash\n# a comment\n\n#SBATCH --comment=two words\nset -u\n# SBATCH off\n")


def test_templates_are_jinja2_with_strict_undefined():
    import jinja2

    env = jobs.environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("train.sbatch.in").render(title="x")


def test_time_formats():
    assert jobs.time_seconds("30") == 1800
    assert jobs.time_seconds("30:15") == 1815
    assert jobs.time_seconds("2:00:00") == 7200
    assert jobs.time_seconds("1-2") == 93600
    assert jobs.time_seconds("1-02:30") == 95400
    assert jobs.time_seconds("1-02:30:05") == 95405
    with pytest.raises(ValueError, match="allowed: minutes"):
        jobs.time_seconds("1h")


@pytest.mark.parametrize("given, message", [
    ({"args": "--model mlp"}, "template train needs --nodes, --time"),
    ({}, "template train needs --nodes, --time, --args"),
    ({**TRAIN, "results": "r"}, "template train does not take --results"),
    ({**TRAIN, "nodes": "0"}, "--nodes is '0'; allowed: an integer >= 1"),
    ({**TRAIN, "time": "1:00"}, "must be longer than --signal-before (120 s)"),
    ({**TRAIN, "time": "soon"}, "--time is 'soon'"),
    ({**TRAIN, "gpus_per_node": 2, "tasks_per_node": 4}, "--tasks-per-node 4 exceeds --gpus-per-node 2"),
    ({**TRAIN, "launcher": "aprun"}, "--launcher is 'aprun'; allowed: srun, mpirun"),
    ({**TRAIN, "args": "train --model mlp"}, "--args starts with 'train'"),
    ({**TRAIN, "args": "--model mlp --resume"}, "--args has --resume"),
    ({**TRAIN, "args": "-n 4"}, "--args has -n"),
    ({**TRAIN, "args": "--model 'mlp"}, "is not valid shell words"),
    ({**TRAIN, "args": "--model mlp --json a)b"}, "the rendered script is not valid bash"),
    ({**TRAIN, "args": "--model ) mlp"}, "--args: unexpected argument 'mlp' (mpisparse train takes options only)"),
    ({**TRAIN, "args": "--modle mlp"}, "--args: No such option '--modle'"),
    ({**TRAIN, "args": "--model"}, "--args: Option '--model' requires an argument"),
    ({**TRAIN, "args": "--no-memory=yes"}, "--args: Option '--no-memory' does not take a value"),
    ({**TRAIN, "args": "--model alexnet"}, "--args: --model 'alexnet' is not one of mlp, cnn"),
    ({**TRAIN, "gres": "gpu:4", "gpus_per_node": 4}, "--gres gpu:4 and --gpus-per-node 4: give one of them"),
    ({**TRAIN, "gres": "gpu 4"}, "--gres is 'gpu 4'; allowed: SLURM's name[:type][:count]"),
    ({**TRAIN, "gres": "gpu:2", "tasks_per_node": 4}, "--tasks-per-node 4 exceeds --gres gpu:2 (2 GPUs)"),
    ({**TRAIN, "sbatch": ("constraint=a100",)}, "--sbatch 'constraint=a100'; allowed: one '--option'"),
    ({**TRAIN, "sbatch": ("--mem=4G\n#SBATCH --x",)}, "--sbatch '--mem=4G\\n#SBATCH --x'; allowed"),
    ({**TRAIN, "sbatch": ("--nodes=3",)}, "--sbatch '--nodes=3': the template sets --nodes itself"),
    ({**TRAIN, "checkpoint_dir": 'a"b'}, "--checkpoint-dir is"),
])
def test_render_errors_name_the_problem(given, message):
    with pytest.raises(jobs.RenderError) as e:
        jobs.render("train", given, check_args=CHECK_ARGS)  # what `mpisparse jobs render` checks
    assert message in str(e.value) and "\n" not in str(e.value)


def test_sweep_densities_are_checked():
    with pytest.raises(jobs.RenderError, match=r"--densities has '2'"):
        jobs.render("sweep", {**BASE, "densities": "0.01 2"})
    with pytest.raises(jobs.RenderError, match=r"--args has --density"):
        jobs.render("sweep", {**BASE, "args": "--density 0.1"})


def test_cli_list_and_render():
    p = cli("jobs", "list", check=True)
    for name, t in jobs.TEMPLATES.items():
        assert f"{name:<7}{t.description}" in p.stdout
    for option in ("--nodes", "--time", "--account", "--partition", "--tasks-per-node", "--gpus-per-node",
                   "--setup", "--launcher", "--args", "--job-name", "--output", "--densities", "--checkpoint-dir",
                   "--gres", "--sbatch", "--requeue"):
        assert option in p.stdout
    p = cli("jobs", "render", "train", "--nodes", "2", "--time", "2:00:00", "--setup", "module load x",
            "--setup", "source y", "--args", "--model mlp --scheme topk", check=True)
    assert p.stdout == jobs.render("train", {"nodes": "2", "time": "2:00:00", "setup": ("module load x", "source y"),
                                             "args": "--model mlp --scheme topk"})
    # the header says how to render the same script again
    assert "mpisparse jobs render train --nodes 2 --time 2:00:00 --setup 'module load x'" in p.stdout
    p = cli("jobs", "render", "bench", "--nodes", "1", "--time", "10", "--gres", "gpu:2", "--sbatch", "--mem=0",
            "--requeue", check=True)
    assert p.stdout == jobs.render("bench", {"nodes": "1", "time": "10", "gres": "gpu:2", "sbatch": ("--mem=0",),
                                             "requeue": True})
    assert "jobs render bench --nodes 1 --time 10 --gres gpu:2 --sbatch --mem=0 --requeue`" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["train", "--nodes", "2"], "Error: template train needs --time, --args"),
    (["nope", "--nodes", "1", "--time", "10"], "Error: no job template 'nope'; templates: train, bench, sweep"),
    (["bench", "--nodes", "1", "--time", "10", "--densities", "0.1"], "Error: template bench does not take --densities"),
    (["bench", "--nodes", "1", "--time", "10", "--args", "--scheme topk --qqqq 1"],
     "Error: --args: No such option '--qqqq'. (mpisparse bench step)"),
    (["bench", "--nodes", "1", "--time", "10", "--sbatch", "--bad opt"],
     "Error: --sbatch '--bad opt'; allowed: one '--option' or '--option=value' (SLURM's long form)"),
])
def test_cli_render_errors_are_one_line(args, message):
    p = cli("jobs", "render", *args)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == message


def test_examples_in_jobs_dir_are_up_to_date():
    """jobs/ holds what `mpisparse jobs examples jobs/` writes; regenerate after changing a template."""
    expected = jobs.render_examples()
    for fname, (name, given) in jobs.EXAMPLES.items():  # their --args are valid options of the command
        assert jobs.render(name, given, check_args=CHECK_ARGS) == expected[fname]
    on_disk = {p.name: p.read_text() for p in (ROOT / "jobs").glob("*.sbatch")}
    assert set(on_disk) == set(expected), "run: mpisparse jobs examples jobs/"
    for name, text in expected.items():
        assert on_disk[name] == text, f"jobs/{name} is stale: run `mpisparse jobs examples jobs/`"


def test_templates_are_package_data():
    cfg = (ROOT / "setup.cfg").read_text()
    assert "mpisparse = templates/jobs/*.sbatch.in" in cfg
    names = {p.name for p in (ROOT / "mpisparse" / "templates" / "jobs").glob("*.sbatch.in")}
    assert names == {"_header.sbatch.in"} | {f"{n}.sbatch.in" for n in jobs.TEMPLATES}


def test_scaling_sweep_help_and_errors():
    p = subprocess.run([str(ROOT / "bin" / "scaling-sweep"), "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "usage: bin/scaling-sweep" in p.stdout
    p = subprocess.run([str(ROOT / "bin" / "scaling-sweep"), "--densities", "0 0.1"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == "scaling-sweep: --densities has '0'; allowed: numbers in (0, 1]"


# --------------------------------------------------------------------------- the scripts, run
def _job_env(tmp_path: Path, nodes: int = 1, restart: int = 0) -> dict:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_")) or k == "MPI_LOCALNRANKS":
            del env[k]
    env.update({
        "PATH": f"{STUBS}:{Path(sys.executable).parent}:{env.get('PATH', '')}",
        "STUB_MPIEXEC": find_mpiexec(), "STUB_LOG": str(tmp_path / "stub.log"), "MPIEXEC_TIMEOUT": "120",
        "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "t", "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_RESTART_COUNT": str(restart),
    })
    if launcher_flavor(env["STUB_MPIEXEC"]) == "openmpi" and os.geteuid() == 0:
        # the stand-ins call the real mpiexec as a site's launcher would; Open MPI wants this as root
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _run_job(script: Path, env: dict, timeout: int = 150) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, cwd=script.parent,
                          timeout=timeout)


@pytest.mark.mpi
def test_usr1_checkpoints_requeues_and_the_requeued_job_resumes(tmp_path):
    """The batch script's trap path for real: USR1 -> train checkpoints and exits 0 -> requeue -> --resume."""
    ck = tmp_path / "ck"
    out = tmp_path / "train.json"
    script = tmp_path / "train.sbatch"
    script.write_text(jobs.render("train", {
        "nodes": 1, "tasks_per_node": 2, "time": "10:00", "checkpoint_dir": str(ck),
        "args": f"--model mlp --data digits --scheme topk --epochs 6 --batch-size 16 --json {out}"}))
    env = _job_env(tmp_path)
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (ck / "LATEST").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "training ended before the first checkpoint"
        first = (ck / "LATEST").read_text()
        proc.send_signal(signal.SIGUSR1)  # what SLURM's --signal=B:USR1@S does: the batch shell only
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stdout + stderr
    assert "SIGUSR1: the time limit is 120 s away; sending USR1 to the job step" in stderr
    assert "signal received: checkpoint written" in stdout
    assert "requeueing job 4242" in stdout
    log = (tmp_path / "stub.log").read_text().splitlines()
    assert log[0].startswith("srun --mpi=pmix --kill-on-bad-exit=1 --nodes=1 --ntasks=2 --ntasks-per-node=2 ")
    assert log[0].endswith(f"--checkpoint {ck}") and log[-1] == "scontrol requeue 4242"
    assert (ck / "LATEST").read_text() != first  # written on the signal, mid-training
    assert not out.exists()  # stopped before the end

    # the requeued job: same script, same job id; it finds the checkpoint and resumes
    p = _run_job(script, _job_env(tmp_path, restart=1))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"resuming from the checkpoint in {ck}" in p.stdout
    assert (tmp_path / "stub.log").read_text().splitlines()[-1].endswith(f"--checkpoint {ck} --resume")
    res = json.loads(out.read_text())
    assert [r["epoch"] for r in res["metrics"]["per_epoch"]] == [1, 2, 3, 4, 5, 6]


@pytest.mark.mpi
def test_sweep_job_runs_every_point_and_skips_done_ones_after_a_requeue(tmp_path):
    script = tmp_path / "sweep.sbatch"
    script.write_text(jobs.render("sweep", {
        "nodes": 2, "time": "10:00", "results": str(tmp_path / "res"), "densities": "0.01",
        "args": "--model ncf --scheme dense --scheme topk --iters 1 --warmup 0"}))
    p = _run_job(script, _job_env(tmp_path, nodes=2))
    assert p.returncode == 0, p.stdout + p.stderr
    for w in (1, 2):
        res = json.loads((tmp_path / "res" / f"W{w}-d0.01.json").read_text())
        assert [r["scheme"] for r in res] == ["dense", "topk"] and res[0]["world_size"] == w
    p = _run_job(script, _job_env(tmp_path, nodes=2, restart=1))
    assert p.returncode == 0 and p.stdout.count("done before: ") == 2


@pytest.mark.mpi
def test_bench_job_with_mpirun(tmp_path):
    script = tmp_path / "bench.sbatch"
    script.write_text(jobs.render("bench", {
        "nodes": 1, "tasks_per_node": 2, "time": "10:00", "launcher": "mpirun", "results": str(tmp_path),
        "args": "--model ncf --scheme topk --iters 1 --warmup 0"}))
    p = _run_job(script, _job_env(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "stub.log").read_text().startswith("scontrol show hostnames node[1-2]\nmpirun -n 2 --host localhost:2 ")
    assert json.loads((tmp_path / "bench-W2.json").read_text())["world_size"] == 2


@pytest.mark.mpi
def test_scaling_sweep_writes_one_json_per_point_and_a_summary(tmp_path):
    if shutil.which("mpisparse", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the mpisparse console script is not installed beside this Python")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1")
    env.pop("PMI_RANK", None)
    args = [str(ROOT / "bin" / "scaling-sweep"), "--ranks", "1 2", "--densities", "0.01", "--model", "ncf",
            "--scheme", "dense", "--scheme", "topk", "--iters", "1", "--warmup", "0", "--out", str(tmp_path),
            "--timeout", "120"]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(x.name for x in tmp_path.glob("*.json")) == ["W1-d0.01.json", "W2-d0.01.json"]
    summary = (tmp_path / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("world_size,density,scheme,step_ms,speedup_vs_dense,bytes_sent_per_rank")
    assert len(summary) == 5
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.count("done before") == 2
