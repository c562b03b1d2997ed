"""Parameter-server and pipeline jobs with a rank killed mid-run, resumed by ``--max-restarts``; the restart
options' errors.  (A resume by hand takes the same path: ``--max-restarts`` adds ``--resume`` to the command line.)

The runs: ``slimdp`` on 3 ranks (2 workers, 1 server: synchronous), killed twice; ``dgs --round-robin`` on 3
ranks (asynchronous, but the server takes the pushes in a fixed turn, so its arithmetic is reproducible) and a
2-stage ``dct-mp`` pipeline on 2 ranks (synchronous), each killed once.  Every resumed run must end exactly where
its uninterrupted run does.  The rank killed is found from the test side (its environment holds the job's mark and
``PMI_RANK=1`` under MPICH, ``OMPI_COMM_WORLD_RANK=1`` under Open MPI) and sent SIGKILL once a new checkpoint exists: no test hook in mpisparse.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest
from click.testing import CliRunner
from faults.jobproc import Job, job_pids

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc"),
              pytest.mark.timeout(300)]

PS = ["train", "-n", "3", "--servers", "1", "--scheme", "slimdp", "--density", "0.2", "--model", "mlp",
      "--data", "digits", "--lr", "0.05", "--batch-size", "32", "--seed", "2", "--epochs", "6"]
#: small batches, so an epoch (one checkpoint) takes long enough for the kill to land before the end
DGS = ["train", "-n", "3", "--servers", "1", "--scheme", "dgs", "--round-robin", "--density", "0.1", "--model",
       "mlp", "--data", "digits", "--lr", "0.05", "--batch-size", "16", "--seed", "2", "--epochs", "4"]
MP = ["train", "-n", "2", "--mp-stages", "2", "--scheme", "dct-mp", "--density", "0.25", "--model", "mlp",
      "--data", "digits", "--lr", "0.05", "--batch-size", "16", "--seed", "5", "--epochs", "4"]


def _run(args, tmp_path, name):
    job = Job([*args, "--json", f"{name}.json"], tmp_path)
    code = job.wait(240)
    assert code == 0, job.text()
    return job, json.loads((tmp_path / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run."""
    return _run(PS, tmp_path_factory.mktemp("ref"), "full")[1]


def _latest(ck):
    try:
        return (ck / "LATEST").read_text()
    except OSError:
        return None


def _rank_pid(job_id: str, rank: int) -> int | None:
    for pid in job_pids(job_id):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read() + b"\0"
        except OSError:
            continue
        # MPICH's Hydra sets PMI_RANK; Open MPI sets OMPI_COMM_WORLD_RANK (and PMIX_RANK)
        if any(f"\0{var}={rank}\0".encode() in b"\0" + env for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")):
            return pid
    return None


def _same(run, ref):
    assert [(e["epoch"], e["iteration"], e["train_loss"], e["test_loss"]) for e in run["metrics"]["per_epoch"]] == \
        [(e["epoch"], e["iteration"], e["train_loss"], e["test_loss"]) for e in ref["metrics"]["per_epoch"]]


def test_max_restarts_2_with_rank_1_killed_twice_completes_like_uninterrupted(tmp_path, reference):
    """The PS job killed mid-run (SIGKILL to one rank) resumes from its checkpoint and ends exactly where the
    uninterrupted run does, twice over."""
    job = Job([*PS, "--checkpoint", "ck", "--max-restarts", "2", "--json", "r.json"], tmp_path)
    try:
        seen = None
        for _ in range(2):  # each launch: once it wrote a checkpoint of its own, SIGKILL rank 1
            job.wait_for(lambda: _latest(tmp_path / "ck") not in (None, seen) and _rank_pid(job.id, 1))
            seen = _latest(tmp_path / "ck")
            os.kill(_rank_pid(job.id, 1), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while _rank_pid(job.id, 1) is not None and time.monotonic() < deadline:  # the old job is gone
                time.sleep(0.05)
        code = job.wait(240)
        assert code == 0, job.text()
    finally:
        job.cleanup()
    err = job.err.read_text()
    assert "restart 1/2 from the last checkpoint" in err and "restart 2/2" in err, job.text()
    assert "completed after 2 restarts" in err, job.text()
    run = json.loads((tmp_path / "r.json").read_text())
    assert run["restarts"] == 2
    _same(run, reference)


@pytest.fixture(scope="module")
def reference_dgs(tmp_path_factory):
    return _run(DGS, tmp_path_factory.mktemp("ref-dgs"), "full")[1]


@pytest.fixture(scope="module")
def reference_mp(tmp_path_factory):
    return _run(MP, tmp_path_factory.mktemp("ref-mp"), "full")[1]


def _killed_once(args, tmp_path, ref):
    """``args`` with --max-restarts 1: rank 1 SIGKILLed once the first checkpoint exists; one restart
    resumes it from that checkpoint to the end; the run's per-epoch metrics equal ``ref``'s."""
    job = Job([*args, "--checkpoint", "ck", "--max-restarts", "1", "--json", "r.json"], tmp_path)
    try:
        job.wait_for(lambda: _latest(tmp_path / "ck") is not None and _rank_pid(job.id, 1))
        seen = _latest(tmp_path / "ck")
        os.kill(_rank_pid(job.id, 1), signal.SIGKILL)
        code = job.wait(240)
        assert code == 0, job.text()
    finally:
        job.cleanup()
    err = job.err.read_text()
    assert "restart 1/1 from the last checkpoint" in err and "completed after 1 restart" in err, job.text()
    last = ref["metrics"]["per_epoch"][-1]["iteration"]
    assert int(seen.strip().rsplit("-", 1)[-1]) < last, f"killed after the last checkpoint ({seen}): not mid-run"
    run = json.loads((tmp_path / "r.json").read_text())
    assert run["restarts"] == 1
    _same(run, ref)
    assert [e["test_accuracy"] for e in run["metrics"]["per_epoch"]] == \
        [e["test_accuracy"] for e in ref["metrics"]["per_epoch"]]


@pytest.mark.slow  # CI runs it in the slow pass; the slimdp restart test above stays in the default suite
def test_dgs_round_robin_killed_mid_run_resumes_like_uninterrupted(tmp_path, reference_dgs):
    """The asynchronous DGS server (momentum M, v) and workers come back from the checkpoint of an epoch's end;
    with --round-robin the resumed run is bit-exact with the uninterrupted one."""
    _killed_once(DGS, tmp_path, reference_dgs)


@pytest.mark.slow
def test_dct_mp_pipeline_killed_mid_run_resumes_like_uninterrupted(tmp_path, reference_mp):
    """A 2-stage dct-mp pipeline (each stage's parameters, optimizer and DCT-MP thresholds checkpointed)
    SIGKILLed mid-run ends exactly where the uninterrupted run does."""
    _killed_once(MP, tmp_path, reference_mp)


@pytest.mark.parametrize("args, message", [
    (["--max-restarts", "1"], "--max-restarts needs --checkpoint DIR"),
    (["--min-ranks", "1"], "--min-ranks applies to restarts: add --max-restarts N"),
    (["--max-restarts", "1", "--checkpoint", "{tmp}/ck", "--min-ranks", "4"], "--min-ranks is 4; allowed range is"),
    (["--max-restarts", "1", "--checkpoint", "{tmp}/ck", "--min-ranks", "2", "--scheme", "slimdp"],
     "a pipeline or parameter-server checkpoint resumes only on the ranks that wrote it"),
    (["--max-restarts", "1", "--checkpoint", "{tmp}/ck", "--min-ranks", "1", "--mp-stages", "3", "--scheme", "dct-mp"],
     "--min-ranks restarts on fewer ranks"),
])
def test_restart_options_that_cannot_work_are_one_line(args, message, tmp_path):
    from mpisparse.cli import cli

    res = CliRunner().invoke(cli, ["train", "-n", "3", *[a.replace("{tmp}", str(tmp_path)) for a in args]])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output


def test_next_world_size_and_restart_command_line(tmp_path):
    from mpisparse.cli.restarts import next_world_size, restart_argv

    assert next_world_size(4, 4, None) == 4 and next_world_size(4, 3, None) == 4
    assert next_world_size(4, 3, 2) == 3 and next_world_size(4, 1, 2) is None
    argv = ["train", "-n", "4", "--checkpoint", str(tmp_path), "--overwrite-checkpoint"]
    assert restart_argv(argv, [str(tmp_path)]) == argv  # nothing to resume yet: a fresh start
    (tmp_path / "LATEST").write_text("step-000000010")
    assert restart_argv(argv, [str(tmp_path)]) == argv[:-1] + ["--resume"]
