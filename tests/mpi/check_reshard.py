"""Run on 4 ranks: save at W = 4, resume at W' = 2 and 3 without losing error-feedback mass.

For one scheme of each kind of state: one epoch of ``train`` on the 4 ranks with a checkpoint; the
pending update of the saved ranks, ``(1/W) sum_i e_i`` per memory buffer, is read from their files. Then
the first W' ranks (a split of the world; the others wait) resume from a copy: after the resume the new
ranks' ``(1/W') sum_j e'_j`` equals it to float tolerance, and training goes on for a second epoch, with
a finite loss and a test accuracy not below the saved epoch's less a margin. One launch for all of it.
"""

import math
import shutil
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from mpisparse.config import TrainConfig
from mpisparse.mpi.comm import Communicator
from mpisparse.runtimes import validate
from mpisparse.train import checkpoint
from mpisparse.train.core import LoopState, _resume, open_checkpoint
from mpisparse.train.loop import CollectiveStep, run_training
from mpisparse.train.reshard import pending_update

#: one of each kind of state (tests/test_reshard.py redistributes every scheme's state without MPI, topk's plain
#: residual and dct's per-rank thresholds included): DGC's u and v, CLT-k's low-pass memory, PowerSGD's residual and
#: warm-start Q (the same on every rank: carried over), Ok-Topk's residual with its thresholds and boundaries
#: (dropped, re-estimated)
SCHEMES = [("dgc", {"momentum": 0.9}), ("cltk", {"beta": 0.5}), ("powersgd", {}), ("oktopk", {"tau": 4})]

comm = Communicator()
W, rank = comm.size, comm.rank
assert W == 4, "save at W = 4"
root = Path(comm.bcast_obj(tempfile.mkdtemp(prefix="reshard-") if rank == 0 else None))

for name, opts in SCHEMES:
    cfg = validate(TrainConfig(scheme=name, density=0.05, epochs=1, batch_size=32, lr=0.05, seed=3,
                               scheme_options=opts, checkpoint=str(root / name)), W)
    saved_run = run_training(comm, cfg)
    saved_acc = saved_run.metrics["final"]["test_accuracy"]
    step_dir = root / name / (root / name / checkpoint.LATEST).read_text().strip()
    before = pending_update([checkpoint.read(step_dir / f"rank-{i}.pt") for i in range(W)])
    assert before and any(np.abs(v).max() > 0 for v in before.values()), (name, "nothing pending")
    for new_world in (2, 3):
        sub = comm.split(0 if rank < new_world else 1)
        if rank < new_world:
            copy = root / f"{name}-{new_world}"
            if sub.rank == 0:
                shutil.copytree(root / name, copy)
            sub.barrier()
            cfg2 = replace(cfg, checkpoint=str(copy), resume=True, epochs=2)
            step = CollectiveStep(sub, cfg2)
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                _resume(open_checkpoint(sub, cfg2), step, LoopState())
            if sub.rank == 0:
                assert any("redistributed" in str(w.message) for w in said), [str(w.message) for w in said]
                assert not any("is reset" in str(w.message) for w in said), [str(w.message) for w in said]
            memory = step.dopt.scheme.memory
            for buf, mass in before.items():
                mine = getattr(memory, buf)
                mine = np.zeros_like(mass) if mine is None else np.asarray(mine, np.float64)
                after = sub.allreduce(mine) / new_world
                err = float(np.abs(after - mass).max())
                assert err <= 1e-6 * max(1.0, float(np.abs(mass).max())), (name, new_world, buf, err)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the same notice again
                resumed = run_training(sub, cfg2)
            final = resumed.metrics["final"]
            assert final["epoch"] == 2 and math.isfinite(final["train_loss"]), (name, new_world, final)
            assert final["test_accuracy"] >= saved_acc - 0.05, (name, new_world, saved_acc, final)
            if rank == 0:
                print(f"{name}: W=4 -> {new_world}: pending mass kept ({', '.join(sorted(before))}); accuracy "
                      f"{saved_acc:.3f} -> {final['test_accuracy']:.3f}", flush=True)
        comm.barrier()

if rank == 0:
    shutil.rmtree(root, ignore_errors=True)
    print(f"reshard OK on {W} ranks", flush=True)
