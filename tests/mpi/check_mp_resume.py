"""Run on 4 ranks: pipeline checkpoints. A resumed pipeline run ends exactly where an uninterrupted one does.

Two configurations, each trained for 2 epochs uninterrupted, then 1 epoch with ``--checkpoint`` and
resumed to 2: the per-epoch metrics are equal (every stage's parameters, optimizer, its group's scheme
state, DCT-MP's threshold and the RNG come back). Hybrid: 2 replicas x 2 stages, ``dct-mp`` (top-k) with
``--dp-scheme topk``. Plain: a 2-stage pipeline on ranks 0-1, ``dct-mp`` with the Laplace threshold, no
data-parallel exchange (the stage's own SGD). A resume with other pipeline options is refused.
"""

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from mpisparse.config import MPConfig, TrainConfig
from mpisparse.mp.runtime import run_mp_training
from mpisparse.mpi.comm import Communicator
from mpisparse.runtimes import validate

comm = Communicator()
W, rank = comm.size, comm.rank
assert W == 4
root = Path(comm.bcast_obj(tempfile.mkdtemp(prefix="mp-resume-") if rank == 0 else None))
KEYS = ("epoch", "iteration", "train_loss", "test_loss", "test_accuracy")


def same_run(sub, cfg, name):
    full = run_mp_training(sub, replace(cfg, epochs=2)).metrics["per_epoch"]
    ck = str(root / name)
    run_mp_training(sub, replace(cfg, epochs=1, checkpoint=ck))
    resumed = run_mp_training(sub, replace(cfg, epochs=2, checkpoint=ck, resume=True)).metrics["per_epoch"]
    assert [[e[k] for k in KEYS] for e in resumed] == [[e[k] for k in KEYS] for e in full], (name, resumed, full)
    other = replace(cfg, epochs=2, checkpoint=ck, resume=True, mp=replace(cfg.mp, micro_batches=2))
    try:
        run_mp_training(sub, other)
    except ValueError as e:
        assert "was written by a different run" in str(e) and "micro_batches" in str(e), str(e)
    else:
        raise AssertionError("a resume with other pipeline options was not refused")


base = dict(model="mlp", data="digits", scheme="dct-mp", density=0.25, lr=0.05, batch_size=64, seed=5)
hybrid = validate(TrainConfig(**base, mp=MPConfig(stages=2, dp_scheme="topk", dp_density=0.1)), W)
same_run(comm, hybrid, "hybrid")
sub = comm.split(0 if rank < 2 else 1)
if rank < 2:
    plain = validate(TrainConfig(**base, scheme_options={"mp_threshold": "laplace"}, mp=MPConfig(stages=2)), 2)
    same_run(sub, plain, "plain")
comm.barrier()
if rank == 0:
    shutil.rmtree(root, ignore_errors=True)
    print(f"mp_resume OK on {W} ranks", flush=True)
