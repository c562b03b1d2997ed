"""Run on W ranks: ``localsgd`` (local SGD, DiLoCo's outer step) in DistributedOptimizer against a NumPy reference.

A small net with a BatchNorm layer; each rank has its own seeded batches.
Every rank recomputes all ranks' local trajectories (the same start after
the broadcast, data seeded by rank): each rank's inner SGD with momentum on
its own gradient, and at the end of each period of H steps the mean of the
parameters (plain local SGD) or DiLoCo's outer step (outer gradient
``theta_0 - mean_r theta_r``, SGD with Nesterov momentum), and the mean of
the BatchNorm buffers.  Checked over two periods and a step: the parameters
and buffers of this rank after every step, the bytes (only the flags on a
local step, one Allreduce of parameters and buffers more on a sync step) and
the density (n on a sync step, else 0).  Then: H = 1 with plain averaging and
SGD without momentum equals dense data-parallel SGD up to rounding; a NaN on
one rank's gradient is skipped on every rank and the periods stay in step;
the state of a DistributedOptimizer restored mid-period continues as the
original.  At 2 ranks also ``train`` itself: a run resumed from a checkpoint
written mid-period ends as the uninterrupted one, and a resume at 1 rank
carries the period, theta_0 and the momentum over and starts from old rank
0's parameters.
"""

import copy
import math
import shutil
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mpisparse.mpi.comm import Communicator
from mpisparse.torch import DistributedOptimizer

comm = Communicator()
W, rank = comm.size, comm.rank
LR = 0.1


def make_model(seed, bn=True):
    torch.manual_seed(seed)
    mid = [torch.nn.BatchNorm1d(5)] if bn else []
    return torch.nn.Sequential(torch.nn.Linear(6, 5), *mid, torch.nn.Tanh(), torch.nn.Linear(5, 3))


def batch(r, t):
    g = torch.Generator().manual_seed(1000 * r + t)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def flat(tensors):
    return np.concatenate([t.detach().numpy().ravel() for t in tensors]).astype(np.float64)


def set_flat(tensors, vec):
    with torch.no_grad():
        off = 0
        for t in tensors:
            t.copy_(torch.from_numpy(vec[off:off + t.numel()].reshape(t.shape)).to(t.dtype))
            off += t.numel()


def float_buffers(model):
    return [b for b in model.buffers() if b.is_floating_point()]


def train_step(model, opt, r, t):
    opt.zero_grad()
    x, y = batch(r, t)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return opt.step()


def reference(H, steps, mom, outer_lr=1.0, outer_mom=0.0):
    """Every rank's parameters and buffers after each step: ``[(theta[r], buffers[r]) per step]``."""
    models = [make_model(seed=0) for _ in range(W)]
    theta = [flat(m.parameters()) for m in models]
    bufs = [np.zeros_like(theta[0]) for _ in range(W)]
    start, velocity, out = theta[0].copy(), None, []
    for t in range(steps):
        for r, m in enumerate(models):
            set_flat(list(m.parameters()), theta[r])
            m.zero_grad()
            x, y = batch(r, t)
            torch.nn.functional.cross_entropy(m(x), y).backward()  # the BatchNorm statistics move in forward
            g = flat(p.grad for p in m.parameters())
            bufs[r] = mom * bufs[r] + g if t else g.copy()  # torch SGD: the first step's buffer is g
            theta[r] = theta[r] - LR * bufs[r]
        if (t + 1) % H == 0:  # the end of a period
            mean = np.mean(theta, axis=0)
            if outer_lr == 1.0 and outer_mom == 0.0:
                new = mean
            else:
                delta = start - mean
                velocity = delta.copy() if velocity is None else outer_mom * velocity + delta
                new = start - outer_lr * (delta + outer_mom * velocity)
                start = new.copy()
            theta = [new.copy() for _ in range(W)]
            avg = np.mean([flat(float_buffers(m)) for m in models], axis=0)
            for m in models:
                set_flat(float_buffers(m), avg)
        out.append(([th.copy() for th in theta], [flat(float_buffers(m)) for m in models]))
    return out


def ring_allreduce(nbytes):
    return 2 * (W - 1) * nbytes // W


# --- local SGD and DiLoCo against the reference, two periods and a step
for H, mom, olr, omom in ((3, 0.9, 1.0, 0.0), (2, 0.5, 0.7, 0.9)):
    what = f"H={H} outer lr {olr} momentum {omom}"
    steps = 2 * H + 1
    model = make_model(seed=rank)  # different on every rank: rank 0's (the reference's start) is broadcast
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=mom), model, "localsgd", 1.0,
                               comm=comm, overlap=False, local_steps=H, outer_lr=olr, outer_momentum=omom)
    want = reference(H, steps, mom, olr, omom)
    n = opt.layout.n
    nb = sum(b.numel() for b in float_buffers(model))
    per_step = []
    for t in range(steps):
        before = comm.bytes_sent
        assert train_step(model, opt, rank, t) is True
        per_step.append(comm.bytes_sent - before)
        theta, bufs = want[t]
        np.testing.assert_allclose(flat(model.parameters()), theta[rank], rtol=1e-4, atol=2e-6,
                                   err_msg=f"{what}: parameters after step {t} on rank {rank}")
        np.testing.assert_allclose(flat(float_buffers(model)), bufs[rank], rtol=1e-4, atol=2e-6,
                                   err_msg=f"{what}: buffers after step {t} on rank {rank}")
        sync = (t + 1) % H == 0
        assert opt.selected_global() == (n if sync else 0), (what, t, opt.selected_global())
    local = per_step[0]  # a local step (H > 1): the finite-flag agreements only
    for t, b in enumerate(per_step):
        assert b - local == (ring_allreduce(4 * (n + nb)) if (t + 1) % H == 0 else 0), (what, t, per_step)
    assert opt.scheme.syncs == 2 and opt.scheme.iteration == steps, (opt.scheme.syncs, opt.scheme.iteration)
    # the state mid-period, loaded into a fresh optimizer on a copy of this rank's model, continues the same way
    twin = make_model(seed=0)
    twin.load_state_dict(model.state_dict())
    twin_opt = DistributedOptimizer(torch.optim.SGD(twin.parameters(), lr=LR, momentum=mom), twin, "localsgd", 1.0,
                                    comm=comm, broadcast=False, overlap=False, local_steps=H, outer_lr=olr,
                                    outer_momentum=omom)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from a file: no tensor shared
    for t in range(steps, steps + H):
        train_step(model, opt, rank, t)
        train_step(twin, twin_opt, rank, t)
        np.testing.assert_array_equal(flat(model.parameters()), flat(twin.parameters()), err_msg=f"{what}: {t}")
    opt.close()
    twin_opt.close()
    if rank == 0:
        print(f"{what}: reference over {steps} steps, bytes {per_step}", flush=True)

# --- H = 1, plain averaging, SGD without momentum: dense data-parallel SGD up to rounding
nets = [make_model(seed=rank + 1, bn=False) for _ in range(2)]
opts = [DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=LR), m, name, 1.0, comm=comm, overlap=False,
                             **({"local_steps": 1} if name == "localsgd" else {}))
        for m, name in zip(nets, ("localsgd", "dense"))]
for t in range(4):
    for m, o in zip(nets, opts):
        assert train_step(m, o, rank, t)
    np.testing.assert_allclose(flat(nets[0].parameters()), flat(nets[1].parameters()), rtol=1e-5, atol=1e-7,
                               err_msg=f"H=1 against dense, step {t}")

# --- a NaN on the last rank: skipped everywhere, and the period still ends at the same step on every rank
model = make_model(seed=0)
opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model, "localsgd", 1.0,
                           comm=comm, overlap=False, local_steps=2)
stepped = []
for t in range(3):
    opt.zero_grad()
    x, y = batch(rank, t)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    if t == 1 and rank == W - 1:
        loss = loss + float("nan") * next(model.parameters())[0, 0]
    loss.backward()
    stepped.append(opt.step())
assert stepped == [True, False, True] and opt.skipped_steps == 1 and opt.scheme.syncs == 1, (stepped, opt.scheme.syncs)
params = comm.allgather_obj(flat(model.parameters()))
assert all(np.array_equal(p, params[0]) for p in params), "the ranks' parameters differ after the sync"
opt.close()

# --- train at 2 ranks: resume from a checkpoint written mid-period; resume at another world size
if W == 2:
    from mpisparse.config import TrainConfig
    from mpisparse.runtimes import validate
    from mpisparse.train import checkpoint
    from mpisparse.train.core import LoopState, _resume, open_checkpoint
    from mpisparse.train.loop import CollectiveStep, run_training

    root = Path(comm.bcast_obj(tempfile.mkdtemp(prefix="localsgd-") if rank == 0 else None))
    cfg = validate(TrainConfig(model="mlp", scheme="localsgd", epochs=2, steps_per_epoch=5, batch_size=16, seed=2,
                               scheme_options={"local_steps": 3, "outer_lr": 0.7, "outer_momentum": 0.9}), W)
    full = run_training(comm, cfg).metrics["per_epoch"]
    ck = str(root / "ck")
    run_training(comm, replace(cfg, epochs=1, checkpoint=ck))  # ends at step 5: 2 steps into the second period
    resumed = run_training(comm, replace(cfg, checkpoint=ck, resume=True)).metrics["per_epoch"]
    for a, b in zip(full, resumed):
        for key in ("train_loss", "test_loss", "test_accuracy"):
            assert a[key] == b[key], (key, full, resumed)
    assert len(resumed) == 2
    step_dir = Path(ck) / (Path(ck) / checkpoint.LATEST).read_text().strip()
    saved = checkpoint.read(step_dir / "rank-0.pt")
    sub = comm.split(0 if rank == 0 else 1)
    if rank == 0:  # at 1 rank: old rank 0's parameters, the period, theta_0 and the momentum carried over
        copy = root / "one"
        shutil.copytree(ck, copy)
        cfg1 = replace(cfg, checkpoint=str(copy), resume=True, epochs=3)
        step = CollectiveStep(sub, cfg1)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            _resume(open_checkpoint(sub, cfg1), step, LoopState())
        assert not any("is reset" in str(w.message) for w in said), [str(w.message) for w in said]
        sch, extra = step.dopt.scheme, saved["scheme"]["extra"]
        assert sch.iteration == saved["scheme"]["iteration"] == 10 and sch.syncs == extra["syncs"] == 3
        np.testing.assert_array_equal(np.asarray(sch.start), extra["start"])
        np.testing.assert_array_equal(np.asarray(sch.velocity), extra["velocity"])
        for k, v in saved["local"]["model"].items():
            assert torch.equal(step.model.state_dict()[k], torch.as_tensor(v)), k
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            final = run_training(sub, cfg1).metrics["final"]
        assert final["epoch"] == 3 and math.isfinite(final["train_loss"]), final
        shutil.rmtree(root, ignore_errors=True)
    comm.barrier()

if rank == 0:
    print(f"localsgd OK on {W} ranks", flush=True)
