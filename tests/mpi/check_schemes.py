"""Run on W ranks: every baseline scheme against a NumPy reference.

The reference is computed on every rank from all ranks' inputs (each rank
can regenerate any rank's gradients from the seed), over several steps, so
memory updates are covered.  Any mismatch raises, which aborts the job.
"""

import math

import numpy as np
from _common import RankWorld, close, error_feedback_reference

from mpisparse.schemes import create, k_for

STEPS = 4
DENSITY = 0.05

world = RankWorld(steps=STEPS, seed=7)
comm, W, rank, layout, n, grads = world


def topk_ref(acc, k):
    order = np.argsort(-np.abs(acc), kind="stable")
    return np.sort(order[:k])


def reference(select, steps=STEPS):
    """Error-feedback sparse SGD, all ranks simulated; ``select(acc, t)`` is a rank's set."""
    outs, counts, _, resid = error_feedback_reference(world, lambda acc, r, t: select(acc, t), steps)
    return outs, resid, counts


def run(name, density=DENSITY, **opts):
    sch = create(name, comm, layout, density, seed=3, **opts)
    outs, step_bytes, _ = world.run(sch, name)
    return sch, outs, step_bytes


def conservation(sch, outs, name):
    """W * sum_t out_t + sum_r e_r == sum_r sum_t g_r,t (nothing lost, nothing invented)."""
    world.conserves_mass(outs, sch.memory.state_dict().get("residual"), name)


# dense -----------------------------------------------------------------
sch, outs, nbytes = run("dense")
for t in range(STEPS):
    close(outs[t], world.dense(t), "dense != mean")
assert all(b == world.ring_allreduce(n * 4) for b in nbytes), ("dense bytes", nbytes)
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
        want = world.sparse_allgather(ref_counts[t])
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
assert all(b == world.ring_allreduce(k * 4) for b in nbytes), ("randomk bytes", nbytes)
conservation(sch, outs, "randomk")

# threshold (fixed tau) -------------------------------------------------
tau = float(np.quantile(np.abs(grads[0][0]), 0.9))
ref_outs, ref_resid, ref_counts = reference(lambda acc, t: np.flatnonzero(np.abs(acc) >= np.float32(tau)))
sch, outs, nbytes = run("threshold", threshold=tau)
for t in range(STEPS):
    close(outs[t], ref_outs[t], f"threshold step {t}")
    assert nbytes[t] == world.sparse_allgather(ref_counts[t]), "threshold bytes"
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

# the update written into the gradient buffer (step(g, out=g)) is the scheme's own output, every
# data-parallel scheme, bit for bit, over several steps (error feedback, DGC's momentum, DCT's and
# CLT-k's warm-up and leaders, DEFT's allocation included)
from mpisparse.runtimes import RUNTIMES  # noqa: E402

for name in RUNTIMES["collective"].schemes():
    own, into = (create(name, comm, layout, DENSITY, seed=3) for _ in range(2))
    for t in range(STEPS):
        g = grads[t][rank].copy()
        want = own.step(g.copy())
        got = into.step(g, out=g)
        assert got is g, f"{name}: step(g, out=g) returned another vector"
        assert np.array_equal(got, want), f"{name} step {t}: the update in the gradient differs from its own output"
        assert into._out is None, f"{name}: an own output vector was kept beside out="
    for key, v in own.memory.state_dict().items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(v, into.memory.state_dict()[key]), f"{name}: memory {key} differs"

world.done("schemes")
