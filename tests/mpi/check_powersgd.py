"""Run on W ranks: ``powersgd`` against a NumPy reference, and (``torch``) against PyTorch's own hook.

NumPy part (any W): every rank replays PowerSGD (Vogels et al. 2019) from all
ranks' gradients in float64 (dense layers' mean, P = sum_r M_r Q, orthogonalized,
Q = sum_r M_r^T P / W, output P Q^T, e_r = acc_r - out), with the scheme's own
first Q (same seed, same generator); outputs, residuals, bytes, mass, the start
iteration and a state_dict round trip are checked.

``torch`` part (``python -m mpi4py check_powersgd.py torch``, 2 ranks): the same
ranks also open a gloo process group on localhost and run PyTorch's
``powerSGD_hook`` with ``PowerSGDState`` under ``DistributedDataParallel`` on a
model whose gradients are the given arrays (``loss = sum_l <p_l, g_l>``), one
DDP bucket; ``powersgd`` (``--init-rng torch``, the layout in the bucket's
parameter order) must give the same aggregate at every step.
"""

import socket
import sys
from datetime import timedelta

import numpy as np
from _common import RankWorld

from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create
from mpisparse.schemes.powersgd import draw_q, plan_layers

STEPS = 5
world = RankWorld(steps=STEPS, seed=7)
comm, W, rank, layout, n, grads = world


def orth(m):
    m = m.copy()
    for j in range(m.shape[1]):
        m[:, j] -= m[:, :j] @ (m[:, :j].T @ m[:, j])
        m[:, j] /= np.linalg.norm(m[:, j])
    return m


def reference(grads, layout, opts, seed, steps):
    r = opts.get("matrix_approximation_rank", 1)
    start = opts.get("start_powersgd_iter", 0)
    plan = plan_layers(layout, r, opts.get("min_compression_rate", 2.0))
    rs = np.random.RandomState(seed)
    resid = [np.zeros(layout.n) for _ in range(W)]
    qs, outs = None, []
    for t in range(steps):
        if t < start:
            outs.append(np.mean(grads[t], axis=0, dtype=np.float64))
            continue
        accs = [resid[w] + grads[t][w] for w in range(W)]
        out = np.zeros(layout.n)
        for a, b in plan.dense:
            out[a:b] = np.mean([acc[a:b] for acc in accs], axis=0)
        if qs is None or opts.get("no_warm_start"):
            qs = [q.astype(np.float64) for q in draw_q(rs.randint(1_000_000_000),
                                                      [(f.cols, f.rank) for f in plan.factors], "numpy")]
        for i, f in enumerate(plan.factors):
            ms = [acc[f.offset:f.offset + f.rows * f.cols].reshape(f.rows, f.cols) for acc in accs]
            q = orth(qs[i])
            p = orth(sum(m @ q for m in ms))
            qs[i] = sum(m.T @ p for m in ms) / W
            out[f.offset:f.offset + f.rows * f.cols] = (p @ qs[i].T).ravel()
        resid = [acc - out for acc in accs]
        outs.append(out)
    return outs, resid


def scaled_close(a, b, what):
    """Float32 against a float64 reference: entries that nearly cancel are compared at the vector's scale."""
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()), err_msg=what)


def elements(plan):
    return plan.dense_size + plan.p_size + plan.q_size


TORCH = "torch" in sys.argv[1:]  # the torch run checks only against PyTorch's hook (the others run elsewhere)

# NumPy reference: rank 2 and 1, warm start and not, a start iteration ---------------------------------
for opts in () if TORCH else ({"matrix_approximation_rank": 2}, {"no_warm_start": True, "start_powersgd_iter": 2},
             {"min_compression_rate": 0.5}):
    sch = create("powersgd", comm, layout, 0.01, seed=5, **opts)
    ref_outs, ref_resid = reference(grads, layout, opts, 5, STEPS)
    outs, nbytes, _ = world.run(sch, f"powersgd {opts}")
    start = opts.get("start_powersgd_iter", 0)
    for t in range(STEPS):
        scaled_close(outs[t], ref_outs[t], f"powersgd {opts} step {t}")
        sent = n if t < start else elements(sch.plan)
        assert nbytes[t] == world.ring_allreduce(sent * 4) or (W == 1 and nbytes[t] == 0), (opts, t, nbytes[t], sent)
    scaled_close(sch.memory.residual, ref_resid[rank], f"powersgd {opts} residual")
    world.conserves_mass(outs, sch.memory.residual, f"powersgd {opts}")
    assert sch.selected_global() == n
assert TORCH or plan_layers(layout, 1, 0.5).dense == [] and plan_layers(layout, 1, 2.0).dense  # a rate below 1: 1-D too

# a checkpoint resumes the same steps (residual, warm-start Q, the RandomState's draws) ---------------
for opts in () if TORCH else ({}, {"no_warm_start": True}):
    a = create("powersgd", comm, layout, 0.01, seed=9, **opts)
    for t in range(2):
        a.step(grads[t][rank].copy())
    b = create("powersgd", comm, layout, 0.01, seed=9, **opts)
    b.load_state_dict(a.state_dict())
    for t in range(2, STEPS):
        assert np.array_equal(a.step(grads[t][rank].copy()), b.step(grads[t][rank].copy())), (opts, t)

# PyTorch's hook: the same aggregate ---------------------------------------------------------------
TORCH_LAYERS = [("conv.weight", (8, 3, 3, 3)), ("conv.bias", (8,)), ("fc.weight", (10, 72)), ("fc.bias", (10,)),
                ("tiny", (3, 2))]
if TORCH:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    torch.set_num_threads(1)
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast_obj(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W,
                            timeout=timedelta(seconds=60))
    tl = FusionLayout(TORCH_LAYERS)
    tgrads = [[np.random.default_rng([21, t, w]).standard_normal(tl.n).astype(np.float32)
               + np.float32(0.5) * np.random.default_rng([22, t]).standard_normal(tl.n).astype(np.float32)
               for w in range(W)] for t in range(6)]

    class Probe(torch.nn.Module):
        """A module whose parameter gradients are the arrays it is given: loss = sum_l <p_l, g_l>."""

        def __init__(self):
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s.shape)) for s in tl.layers])

        def forward(self, gs):
            return sum((p * g).sum() for p, g in zip(self.ps, gs))

    for cfg, opts in (({"matrix_approximation_rank": 1, "warm_start": False, "orthogonalization_epsilon": 1e-8},
                       {"no_warm_start": True, "orthogonalization_epsilon": 1e-8}),
                      ({"matrix_approximation_rank": 2}, {"matrix_approximation_rank": 2})):
        model = Probe()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=64)
        state = psgd.PowerSGDState(process_group=None, start_powerSGD_iter=2, min_compression_rate=2,
                                   random_seed=13, **cfg)
        order = []

        def hook(state, bucket):  # unannotated: DDP compares annotations literally
            ids = {id(p): i for i, p in enumerate(model.ps)}
            order.append([ids[id(p)] for p in bucket.parameters()])
            return psgd.powerSGD_hook(state, bucket)

        ddp.register_comm_hook(state, hook)
        theirs = []
        for t in range(len(tgrads)):
            for p in model.ps:
                p.grad = None
            ddp([torch.from_numpy(a.copy()) for a in tl.unflatten(tgrads[t][rank])]).backward()
            theirs.append([p.grad.detach().numpy().copy() for p in model.ps])
        assert all(len(o) == len(tl.layers) for o in order), ("one bucket expected", order)
        # the layout in the bucket's order from the first compressed step on (DDP rebuilds it after step 1)
        bucket_order = order[2]
        assert all(o == bucket_order for o in order[2:]), order
        ours_layout = FusionLayout([TORCH_LAYERS[i] for i in bucket_order])
        sch = create("powersgd", comm, ours_layout, 0.01, seed=13, init_rng="torch", start_powersgd_iter=2,
                     **opts)
        for t in range(len(tgrads)):
            g = ours_layout.flatten([tl.view(tgrads[t][rank], i) for i in bucket_order])
            out = sch.step(g)
            for j, i in enumerate(bucket_order):
                np.testing.assert_allclose(ours_layout.view(out, j), theirs[t][i].reshape(-1), rtol=2e-4, atol=2e-6,
                                           err_msg=f"powersgd {opts} vs powerSGD_hook {cfg}: step {t}, "
                                                   f"layer {TORCH_LAYERS[i][0]}")
        if rank == 0:
            print(f"torch: bucket order {bucket_order}; equal to powerSGD_hook {cfg} over {len(tgrads)} steps")
    dist.destroy_process_group()

world.done("powersgd")
