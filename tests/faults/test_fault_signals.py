"""Signals to ``mpisparse train -n 2``: forwarded to the job, and no process of the job outlives it.

What a scheduler (SIGTERM, SIGUSR1 before the time limit), a closing
terminal (SIGHUP), Ctrl-C (SIGINT) or the out-of-memory killer (SIGKILL)
does to the top-level process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from faults.jobproc import Job, csv_rows, describe, kill_job, wait_gone

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc"),
              pytest.mark.timeout(300)]

TRAIN = ["train", "-n", "2", "--model", "mlp", "--data", "digits", "--seed", "1"]


def _start(tmp_path, epochs=200, batch=16, checkpoint=True):
    job = Job([*TRAIN, "--batch-size", str(batch), "--epochs", str(epochs), "--csv", "steps.csv",
               *(["--checkpoint", "ck"] if checkpoint else [])], tmp_path)
    # training has started once rank 0 logged a few steps
    job.wait_for(lambda: csv_rows(tmp_path / "steps.csv") >= 3)
    return job


#: SIGINT in the default suite; SIGTERM and SIGHUP take the same path (extended: CI runs them)
@pytest.mark.parametrize("sig", [pytest.param("SIGTERM", marks=pytest.mark.extended),
                                 pytest.param("SIGHUP", marks=pytest.mark.extended), "SIGINT"])
def test_stop_signals_end_the_whole_job_non_zero(tmp_path, sig):
    job = _start(tmp_path, checkpoint=False)
    try:
        job.proc.send_signal(getattr(signal, sig))
        code = job.wait(30)
        assert code == 128 + getattr(signal, sig), job.text()
        assert f"mpisparse: {sig}: stopping the job" in job.err.read_text()
        left = wait_gone(job.id, 10)
        assert not left, f"left after {sig}: {describe(left)}\n{job.text()}"
    finally:
        job.cleanup()


def test_sigkill_to_the_wrapper_ends_ranks_and_mpiexec_within_10s(tmp_path):
    job = _start(tmp_path)
    try:
        os.kill(job.proc.pid, signal.SIGKILL)
        job.proc.wait(10)
        left = wait_gone(job.id, 10)
        assert not left, f"left after SIGKILL: {describe(left)}\n{job.text()}"
        latest = tmp_path / "ck" / "LATEST"
        before = latest.read_bytes() if latest.exists() else None
        rows = csv_rows(tmp_path / "steps.csv")
        time.sleep(2)
        after = latest.read_bytes() if latest.exists() else None
        assert after == before, "LATEST moved after the job was killed"
        assert csv_rows(tmp_path / "steps.csv") == rows, "training went on after the job was killed"
    finally:
        job.cleanup()


def test_sigusr1_checkpoints_exits_0_and_the_checkpoint_resumes(tmp_path):
    # batch size 1: an epoch of several seconds, so the signal lands in the first one
    job = _start(tmp_path, epochs=3, batch=1)
    try:
        job.proc.send_signal(signal.SIGUSR1)
        code = job.wait(60)
        assert code == 0, job.text()
        assert "signal received: checkpoint written" in job.out.read_text(), job.text()
        assert (tmp_path / "ck" / "LATEST").exists()
        left = wait_gone(job.id, 10)
        assert not left, describe(left)
    finally:
        job.cleanup()
    stopped_at = csv_rows(tmp_path / "steps.csv")
    # continue it, for one epoch in all: it starts where the signal stopped it
    again = Job([*TRAIN, "--batch-size", "1", "--epochs", "1", "--checkpoint", "ck", "--csv", "steps.csv", "--resume"], tmp_path)
    try:
        assert again.wait(150) == 0, again.text()
        assert "epoch 1/1" in again.out.read_text(), again.text()
        assert csv_rows(tmp_path / "steps.csv") > stopped_at
    finally:
        again.cleanup()
        kill_job(again.id)


WATCHER = ("import sys, time; from mpisparse.mpi.signals import watch_launcher; "
           "watch_launcher(); time.sleep(float(sys.argv[1])); print('outlived')")


def _watched(token: str, seconds: float):
    from faults.jobproc import ROOT

    env = dict(os.environ, MPISPARSE_WRAPPER_PID=token, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", WATCHER, str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_rank_ends_itself_when_the_wrapper_is_gone():
    from mpisparse.mpi.signals import _start_time

    wrapper = subprocess.Popen(["sleep", "60"])
    try:
        token = f"{socket.gethostname()}:{wrapper.pid}:{_start_time(wrapper.pid)}"
        rank = _watched(token, 30)
        time.sleep(1.5)
        assert rank.poll() is None  # the wrapper lives: the rank goes on
    finally:
        wrapper.kill()
        wrapper.wait()
    out, err = rank.communicate(timeout=10)
    assert rank.returncode != 0 and "outlived" not in out
    assert err.strip().splitlines() == [f"mpisparse: the mpisparse -n process (pid {wrapper.pid}) is gone; "
                                        f"this rank (pid {rank.pid}) stops"]


def test_a_wrapper_on_another_host_is_not_watched():
    rank = _watched("some-other-host:1:1", 1.5)
    out, err = rank.communicate(timeout=30)
    assert rank.returncode == 0 and "outlived" in out, err
