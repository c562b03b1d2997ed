"""Run on W ranks: every baseline scheme against a NumPy reference.

The reference is computed on every rank from all ranks' inputs (each rank
can regenerate any rank's gradients from the seed), over several steps, so
memory updates are covered.  Any mismatch raises, which aborts the job.
"""

import math
import sys

import numpy as np

from mpisparse.comm import Communicator
from mpisparse.fusion import FusionLayout
from mpisparse.gradgen import SyntheticGradients
from mpisparse.schemes import create, k_for

LAYERS = [("a.weight", (50, 20)), ("a.bias", (20,)), ("b.weight", (300,)), ("c.weight", (7, 7)), ("d", (3,))]
STEPS = 4
DENSITY = 0.05

comm = Communicator(check="--check" in sys.argv)
W, rank = comm.size, comm.rank
layout = FusionLayout(LAYERS)
n = layout.n
grads = [[SyntheticGradients(layout, r, seed=7).fill(layout.empty(), t) for r in range(W)] for t in range(STEPS)]


def topk_ref(acc, k):
    order = np.argsort(-np.abs(acc), kind="stable")
    return np.sort(order[:k])


def reference(select, steps=STEPS):
    """Error-feedback sparse SGD (DEFT Alg. 1 with per-rank sets), all ranks simulated."""
    resid = [np.zeros(n, np.float64) for _ in range(W)]
    outs, sent_counts = [], []
    for t in range(steps):
        total = np.zeros(n, np.float64)
        counts = []
        for r in range(W):
            acc = resid[r] + grads[t][r]
            idx = select(acc, t)
            total[idx] += acc[idx]
            acc[idx] = 0
            resid[r] = acc
            counts.append(len(idx))
        outs.append(total / W)
        sent_counts.append(counts)
    return outs, resid, sent_counts


def run(name, density=DENSITY, **opts):
    sch = create(name, comm, layout, density, seed=3, **opts)
    outs, step_bytes = [], []
    for t in range(STEPS):
        b0 = comm.bytes_sent
        out = sch.step(grads[t][rank].copy())
        step_bytes.append(comm.bytes_sent - b0)
        outs.append(out.astype(np.float64))
        # every rank holds the identical aggregate
        everyone = comm.allgather_obj(out.tobytes())
        assert all(e == everyone[0] for e in everyone), f"{name}: ranks hold different aggregates at step {t}"
    return sch, outs, step_bytes


def close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-9, err_msg=what)


def ring_allgather(counts, itemsize):
    return 0 if W == 1 else (sum(counts) - counts[(rank + 1) % W]) * itemsize


def conservation(sch, outs, name):
    """W * sum_t out_t + sum_r e_r == sum_r sum_t g_r,t (nothing lost, nothing invented)."""
    resid = sch.memory.state_dict().get("residual")
    resid = np.zeros(n) if resid is None else resid.astype(np.float64)
    total_resid = np.sum(comm.allgather_obj(resid), axis=0)
    lhs = W * np.sum(outs, axis=0) + total_resid
    rhs = np.sum([g for step in grads for g in step], axis=0, dtype=np.float64)
    close(lhs, rhs, f"{name}: error feedback does not conserve mass")


# dense -----------------------------------------------------------------
sch, outs, nbytes = run("dense")
for t in range(STEPS):
    close(outs[t], np.mean(grads[t], axis=0, dtype=np.float64), "dense != mean")
assert all(b == 2 * (W - 1) * n * 4 // W for b in nbytes), ("dense bytes", nbytes)
dense_outs = outs

# topk, whole vector and layerwise ---------------------------------------
k = k_for(DENSITY, n)
for layerwise in (False, True):
    if layerwise:
        ks = [math.ceil(DENSITY * s.size) for s in layout.layers]
        sel = lambda acc, t: np.concatenate(
            [topk_ref(layout.view(acc, i), ks[i]) + s.offset for i, s in enumerate(layout.layers)])
    else:
        sel = lambda acc, t: topk_ref(acc, k)
    ref_outs, ref_resid, ref_counts = reference(sel)
    sch, outs, nbytes = run("topk", layerwise=layerwise)
    for t in range(STEPS):
        close(outs[t], ref_outs[t], f"topk(layerwise={layerwise}) step {t}")
        want = 2 * ring_allgather(ref_counts[t], 4) + ring_allgather([1] * W, 8)
        assert nbytes[t] == want, ("topk bytes", t, nbytes[t], want)
    close(sch.memory.residual, ref_resid[rank], "topk residual")
    conservation(sch, outs, "topk")

# randomk ---------------------------------------------------------------
from mpisparse import backend  # noqa: E402

rk = lambda acc, t: np.sort(backend.randomk(n, k, np.random.default_rng([3, t])))
ref_outs, ref_resid, _ = reference(rk)
sch, outs, nbytes = run("randomk")
for t in range(STEPS):
    close(outs[t], ref_outs[t], f"randomk step {t}")
    assert sch.selected_global() == k
assert all(b == 2 * (W - 1) * k * 4 // W for b in nbytes), ("randomk bytes", nbytes)
conservation(sch, outs, "randomk")

# threshold (fixed tau) -------------------------------------------------
tau = float(np.quantile(np.abs(grads[0][0]), 0.9))
ref_outs, ref_resid, ref_counts = reference(lambda acc, t: np.flatnonzero(np.abs(acc) >= np.float32(tau)))
sch, outs, nbytes = run("threshold", threshold=tau)
for t in range(STEPS):
    close(outs[t], ref_outs[t], f"threshold step {t}")
    assert nbytes[t] == 2 * ring_allgather(ref_counts[t], 4) + ring_allgather([1] * W, 8), "threshold bytes"
conservation(sch, outs, "threshold")

# density 1 equals dense -------------------------------------------------
for name, opts in (("topk", {}), ("topk", {"layerwise": True}), ("randomk", {}), ("threshold", {}),
                   ("threshold", {"threshold": 0.0})):
    sch, outs, _ = run(name, density=1.0, **opts)
    for t in range(STEPS):
        close(outs[t], dense_outs[t], f"{name} {opts} at density 1 != dense")

# no memory: nothing is remembered ---------------------------------------
sch, outs, _ = run("topk", memory=False)
ref_outs, _, _ = reference(lambda acc, t: topk_ref(acc, k), steps=1)
close(outs[0], ref_outs[0], "topk without memory, step 0")
assert sch.memory.state_dict() == {}

if rank == 0:
    print(f"schemes OK on {W} ranks")
