"""Run on W ranks: DistributedOptimizer against a NumPy reference.

A small two-layer net; each rank has its own seeded batch.  Every rank can
recompute all ranks' gradients (same parameters after the broadcast, data
seeded by rank), so the reference update (error feedback, top-k, mean over
ranks, SGD momentum) is computed locally in NumPy and compared.  Then a NaN
is injected into one rank's gradient: every rank must skip that step.
"""

import numpy as np
import torch

from mpisparse.mpi.comm import Communicator
from mpisparse.torch import DistributedOptimizer

comm = Communicator()
W, rank = comm.size, comm.rank
LR, MOM, STEPS = 0.1, 0.9, 4


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def batch(r, t):
    g = torch.Generator().manual_seed(1000 * r + t)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def flat_grads(model, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return np.concatenate([p.grad.detach().numpy().ravel() for p in model.parameters()]).astype(np.float64)


def set_flat(model, vec):
    with torch.no_grad():
        off = 0
        for p in model.parameters():
            p.copy_(torch.from_numpy(vec[off:off + p.numel()].reshape(p.shape)).float())
            off += p.numel()


def flat_params(model):
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]).astype(np.float64)


for scheme, density in (("dense", 1.0), ("topk", 0.2)):
    model = make_model(seed=rank)  # different init per rank: the wrapper must broadcast rank 0's
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM), model,
                               scheme, density, comm=comm, overlap=False)  # the plain step (a NaN set after
    # backward below; overlapped buckets, the default for dense, are gathered during backward)
    ref_model = make_model(seed=0)
    p = flat_params(ref_model)
    np.testing.assert_allclose(flat_params(model), p, rtol=0, atol=0)
    n = p.size
    k = max(1, round(density * n))
    resid = [np.zeros(n) for _ in range(W)]
    buf = np.zeros(n)
    for t in range(STEPS):
        # reference: all ranks' gradients at the current parameters
        set_flat(ref_model, p)
        agg = np.zeros(n)
        for r in range(W):
            acc = resid[r] + flat_grads(ref_model, *batch(r, t))
            idx = np.argsort(-np.abs(acc), kind="stable")[:k] if scheme == "topk" else np.arange(n)
            agg[idx] += acc[idx]
            acc[idx] = 0
            resid[r] = acc
        agg /= W
        buf = MOM * buf + agg if t else agg.copy()  # torch SGD: first step buf = g
        p = p - LR * buf
        # the wrapper
        opt.zero_grad()
        x, y = batch(rank, t)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        assert opt.step()
        np.testing.assert_allclose(flat_params(model), p, rtol=2e-5, atol=2e-6,
                                   err_msg=f"{scheme} step {t} on rank {rank}")

    # a NaN on the last rank: every rank skips, parameters and scheme state unchanged
    before = flat_params(model)
    it = opt.scheme.iteration
    opt.zero_grad()
    x, y = batch(rank, 99)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    if rank == W - 1:  # this rank's gradient of one weight is NaN (the exchange at the end of backward sees it)
        loss = loss + float("nan") * next(model.parameters())[0, 0]
    loss.backward()
    assert all(torch.isnan(q.grad).all() for q in model.parameters())  # on every rank: the step is not finite
    assert opt.step() is False
    assert opt.skipped_steps == 1 and opt.scheme.iteration == it
    np.testing.assert_array_equal(flat_params(model), before)
    # and training goes on afterwards
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert opt.step() is True

if rank == 0:
    print(f"wrapper OK on {W} ranks")
