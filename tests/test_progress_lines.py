"""Progress under ``mpiexec`` (stderr not a terminal): a status line every ``--progress-interval`` seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import HERE, mpiexec_prefix

pytestmark = pytest.mark.mpi


def _run(args: list[str], timeout: float = 240) -> tuple[list[tuple[float, str]], int]:
    """Run ``mpisparse ARGS`` on 2 ranks; each stderr line with the time it arrived."""
    prefix, extra = mpiexec_prefix(int(timeout))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent), **extra)
    env.pop("PMI_RANK", None)
    argv = [*prefix, "-n", "2", sys.executable, "-m", "mpisparse", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=HERE.parent)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), ln.rstrip()))
                                              for ln in proc.stderr], daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    return lines, rc


def test_status_lines_at_the_interval_and_none_with_no_progress():
    interval = 1.0
    lines, rc = _run(["bench", "step", "--model", "resnet18", "--scheme", "topk", "--density", "0.01",
                      "--iters", "60", "--warmup", "0", "--progress-interval", str(interval)])
    assert rc == 0, lines[-20:]
    status = [(t, ln) for t, ln in lines if ln.startswith("[topk: step]")]
    assert len(status) >= 2, lines
    # each line says how far, how fast and when it ends
    assert all(" step " in ln and "steps/s" in ln and "ETA " in ln for _, ln in status)
    # the first within 2 intervals of the first step (its rate says how long it has been stepping) ...
    first = status[0][1]
    done = int(first.split(" step ")[1].split("/")[0])
    rate = float(first.split("| ")[1].split(" steps/s")[0])
    assert done / rate <= 2 * interval + 0.5, first
    # ... and then one every interval, never 2 intervals apart
    gaps = [b - a for (a, _), (b, _) in zip(status, status[1:])]
    assert all(g <= 2 * interval + 0.5 for g in gaps), gaps
    quiet, rc = _run(["bench", "step", "--model", "ncf", "--scheme", "topk", "--iters", "5", "--warmup", "0",
                      "--progress-interval", "0.1", "--no-progress"])
    assert rc == 0 and not [ln for _, ln in quiet if ln.startswith("[")], quiet


def test_train_prints_batch_status_lines_off_a_terminal():
    # batch 2: about 360 steps an epoch, over a second of training (at batch 8 a quiet machine ran an epoch in
    # about 0.3 s and printed one status line, or none: a CI run failed on it)
    lines, rc = _run(["train", "--model", "mlp", "--data", "digits", "--scheme", "topk", "--density", "0.05",
                      "--epochs", "2", "--batch-size", "2", "--progress-interval", "0.2"])
    assert rc == 0, lines[-20:]
    status = [ln for _, ln in lines if ln.startswith("[train]")]
    assert status and all("epoch " in ln and " batch " in ln and "loss " in ln for ln in status), lines[-10:]


def test_bench_scaling_passes_its_jobs_progress_lines_on_while_they_run(tmp_path):
    """The driver is not an MPI job: its jobs' status lines come through it, indented, as they are printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "mpisparse", "bench", "scaling", "--worlds", "2", "--densities",
                             "0.01", "--model", "resnet18", "--scheme", "topk", "--iters", "60",
                             "--progress-interval", "0.2", "--out", str(tmp_path / "runs"), "--timeout", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE.parent)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: [lines.append((time.monotonic(), ln.rstrip()))
                                              for ln in proc.stderr], daemon=True)
    reader.start()
    out = proc.communicate(timeout=400)[0]
    reader.join(5)
    assert proc.returncode == 0, [ln for _, ln in lines][-20:]
    # (60 steps at about 26 a second here, CI's pace: about 2.3 s of topk for lines every 0.2 s; with 30 steps
    # and 0.5 s, one line came once)
    status = [(t, ln) for t, ln in lines if ln.startswith("        [topk: step] step ")]
    assert len(status) >= 2, lines
    done_at = t0 + float(out.split("done in ")[1].split(" s")[0])
    assert status[0][0] < done_at  # the first one arrived while the job still ran
    assert "--progress-interval 0.2" in out  # the job was told the interval


def test_bench_scaling_with_no_progress_passes_it_on(tmp_path):
    from click.testing import CliRunner

    from mpisparse.bench.scaling import plan_scaling
    from mpisparse.cli import cli

    assert CliRunner().invoke(cli, ["bench", "scaling", "--help"]).output.count("--no-progress") == 1
    pts = plan_scaling(models=["ncf"], schemes=["topk"], worlds=[2], densities=[0.01], iters=1, warmup=0,
                       extra_options=["--no-progress"], out_dir=tmp_path)
    assert "--no-progress" in pts[0].run.options
