"""Run on 3 ranks (2 workers, 1 server): parameter-server checkpoints.

Synchronous ``slimdp`` (the server's core, significance sums and model; the workers' local SGD, sampler
and models): 2 epochs uninterrupted == 1 epoch with ``--checkpoint`` resumed to 2; a resume with another
``--density`` is refused. Reproducible asynchronous ``dgs --round-robin`` (the server's ``M`` and ``v``,
the workers' residuals): stopped by SIGUSR1 on worker 0 at step 8 (the workers agree, every rank saves,
every rank, the server too, ends with Preempted) and resumed == uninterrupted. ``asgd`` in arrival
order, stopped by a signal and resumed, ends in the accuracy band of an uninterrupted run. A resume on
other ranks is refused (the ranks have roles).
"""

import os
import shutil
import signal
import tempfile
from dataclasses import replace
from pathlib import Path

from mpisparse.config import TrainConfig
from mpisparse.mpi.comm import Communicator
from mpisparse.ps.train import run_ps_training
from mpisparse.runtimes import validate
from mpisparse.train.core import Preempted

comm = Communicator()
W, rank = comm.size, comm.rank
assert W == 3
root = Path(comm.bcast_obj(tempfile.mkdtemp(prefix="ps-resume-") if rank == 0 else None))
KEYS = ("epoch", "iteration", "train_loss", "test_loss", "test_accuracy")


def metrics(res):
    res = comm.bcast_obj(res.metrics["per_epoch"] if rank == 0 else None, 0)
    return [[e.get(k) for k in KEYS] for e in res]


def usr1_at(step):
    """Worker 0's step log: SIGUSR1 to itself at ``step`` (as SLURM's warning would come)."""
    if rank != 0:
        return None

    def log(rec):
        if rec["iteration"] == step:
            os.kill(os.getpid(), signal.SIGUSR1)
    return log


def preempted(cfg, step):
    try:
        run_ps_training(comm, cfg, step_log=usr1_at(step))
    except Preempted:
        return True
    return False


def same_run(cfg, name, *, usr1=None):
    """2 epochs uninterrupted == 1 epoch with --checkpoint resumed to 2 (``usr1``: == stopped by a signal at
    that step and resumed)."""
    full = metrics(run_ps_training(comm, replace(cfg, epochs=2)))
    ck = str(root / name)
    if usr1 is None:
        run_ps_training(comm, replace(cfg, epochs=1, checkpoint=ck))
    else:
        assert preempted(replace(cfg, epochs=2, checkpoint=ck), usr1), f"{name}: the signal did not stop the run"
        assert (Path(ck) / "LATEST").read_text() == f"step-{usr1:09d}"
    resumed = metrics(run_ps_training(comm, replace(cfg, epochs=2, checkpoint=ck, resume=True)))
    assert resumed == full, (name, resumed, full)
    return full, ck


base = dict(model="mlp", data="digits", lr=0.05, batch_size=64, seed=3, servers=1)
_, ck = same_run(validate(TrainConfig(**base, scheme="slimdp", density=0.2), W), "slimdp")
try:
    run_ps_training(comm, validate(TrainConfig(**base, scheme="slimdp", density=0.3, epochs=2, checkpoint=ck,
                                               resume=True), W))
except ValueError as e:
    assert "was written by a different run" in str(e) and "density" in str(e), str(e)
else:
    raise AssertionError("a resume with another --density was not refused")
same_run(validate(TrainConfig(**base, scheme="dgs", density=0.1, scheme_options={"round_robin": True}), W), "dgs",
         usr1=8)

# arrival order: a consistent server state, the same accuracy band
asgd = validate(TrainConfig(**base, scheme="asgd", density=1.0, epochs=2), W)
full = metrics(run_ps_training(comm, asgd))
ck = str(root / "asgd")
assert preempted(replace(asgd, checkpoint=ck), 14)
resumed = metrics(run_ps_training(comm, replace(asgd, checkpoint=ck, resume=True)))
assert resumed[-1][0] == 2 and abs(resumed[-1][4] - full[-1][4]) < 0.05, (resumed, full)
# other ranks: refused (the ranks have roles)
sub = comm.split(0 if rank < 2 else 1)
if rank < 2:
    try:
        run_ps_training(sub, replace(asgd, checkpoint=ck, resume=True))
    except Exception as e:  # noqa: BLE001
        assert "written by 3 ranks, this job has 2" in str(e), str(e)
    else:
        raise AssertionError("a resume on 2 ranks of a 3-rank checkpoint was not refused")
comm.barrier()
if rank == 0:
    shutil.rmtree(root, ignore_errors=True)
    print(f"ps_resume OK on {W} ranks", flush=True)
