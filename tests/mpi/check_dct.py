"""Run on W ranks: ``dct`` (DCT-DP, Gupta et al., Alg. 1) against a NumPy reference.

Every rank regenerates all ranks' gradients and simulates Algorithm 1 on
each of them in float32 (per-rank, per-layer thresholds, the k-th largest
``|W|`` by a full sort, recomputed when L divides the iteration, mask
``|W| >= tau``, error feedback), sums the masked vectors and compares with
the scheme over several steps: output, residual, thresholds, the recompute
iterations, distinct indices, bytes of the Allgatherv exchange, mass
conservation, and density 1 against dense.
"""

import sys

import numpy as np

from mpisparse.comm import Communicator
from mpisparse.fusion import FusionLayout
from mpisparse.gradgen import SyntheticGradients
from mpisparse.schemes import create

LAYERS = [("a.weight", (50, 20)), ("a.bias", (20,)), ("b.weight", (300,)), ("c.weight", (7, 7)), ("d", (3,))]
STEPS = 7
DENSITY = 0.05

comm = Communicator(check="--check" in sys.argv)
W, rank = comm.size, comm.rank
layout = FusionLayout(LAYERS)
n = layout.n
grads = [[SyntheticGradients(layout, r, seed=7).fill(layout.empty(), t) for r in range(W)] for t in range(STEPS)]


def reference(density, lifespan, steps=STEPS):
    """Alg. 1 on every rank; returns per-step outputs, counts, union sizes, taus; final residuals."""
    ks = [max(1, int(np.floor(density * s.size + 1e-9))) for s in layout.layers]
    resid = [np.zeros(n, np.float32) for _ in range(W)]
    taus = [None] * W
    outs, counts, union, tau_hist = [], [], [], []
    for t in range(steps):
        total = np.zeros(n, np.float64)
        anysent = np.zeros(n, bool)
        cnt, th = [], []
        for r in range(W):
            acc = resid[r] + grads[t][r]  # l.2 (float32, as the scheme)
            if t % lifespan == 0:  # l.3-5
                taus[r] = [np.sort(np.abs(layout.view(acc, i)))[::-1][ks[i] - 1] for i in range(len(layout))]
            mask = np.concatenate([np.abs(layout.view(acc, i)) >= taus[r][i] for i in range(len(layout))])  # l.9
            total[mask] += acc[mask]  # l.10, l.12 (the server sums)
            anysent |= mask
            resid[r] = np.where(mask, np.float32(0), acc)  # l.11
            cnt.append(int(mask.sum()))
            th.append([float(x) for x in taus[r]])
        outs.append(total / W)
        counts.append(cnt)
        union.append(int(anysent.sum()))
        tau_hist.append(th)
    return outs, counts, union, tau_hist, resid


def run(density, **opts):
    sch = create("dct", comm, layout, density, seed=3, **opts)
    outs, nbytes, flags, taus, union = [], [], [], [], []
    for t in range(STEPS):
        b0 = comm.bytes_sent
        out = sch.step(grads[t][rank].copy())
        nbytes.append(comm.bytes_sent - b0)
        outs.append(out.astype(np.float64))
        flags.append(sch.recomputed)
        taus.append(list(sch.taus))
        union.append(sch.selected_global())
        everyone = comm.allgather_obj(out.tobytes())
        assert all(e == everyone[0] for e in everyone), f"dct: ranks hold different aggregates at step {t}"
    return sch, outs, nbytes, flags, taus, union


def close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-9, err_msg=what)


def ring_allgather(counts, itemsize):
    return 0 if W == 1 else (sum(counts) - counts[(rank + 1) % W]) * itemsize


dense = [np.mean(grads[t], axis=0, dtype=np.float64) for t in range(STEPS)]

for lifespan in (3, 1, 1000):
    ref_outs, ref_counts, ref_union, ref_taus, ref_resid = reference(DENSITY, lifespan)
    sch, outs, nbytes, flags, taus, union = run(DENSITY, lifespan=lifespan)
    for t in range(STEPS):
        close(outs[t], ref_outs[t], f"dct L={lifespan} step {t}")
        assert taus[t] == ref_taus[t][rank], ("dct taus", lifespan, t)
        assert union[t] == ref_union[t], ("dct selected_global", lifespan, t, union[t], ref_union[t])
        want = 2 * ring_allgather(ref_counts[t], 4) + ring_allgather([1] * W, 8)
        assert nbytes[t] == want, ("dct bytes", lifespan, t, nbytes[t], want)
    np.testing.assert_array_equal(sch.memory.residual, ref_resid[rank], f"dct L={lifespan} residual")
    # tau is recomputed exactly at the iterations L divides, and at no others
    assert flags == [t % lifespan == 0 for t in range(STEPS)], (lifespan, flags)
    assert sch.recomputed_at == [t for t in range(STEPS) if t % lifespan == 0], sch.recomputed_at
    if lifespan == 3:
        assert sch.recomputed_at == [0, 3, 6]
        changed = [t for t in range(1, STEPS) if taus[t] != taus[t - 1]]
        assert set(changed) <= {3, 6}, changed
    # conservation: W * sum_t out_t + sum_r e_r == sum of every gradient
    total_resid = np.sum([r.astype(np.float64) for r in comm.allgather_obj(sch.memory.residual)], axis=0)
    close(W * np.sum(outs, axis=0) + total_resid,
          np.sum([g for step in grads for g in step], axis=0, dtype=np.float64), "dct conservation")

# density 1: tau = min |W| of each layer, so a recompute step sends everything ----
sch, outs, _, _, _, union = run(1.0, lifespan=1)
for t in range(STEPS):
    close(outs[t], dense[t], f"dct density 1, L=1, step {t} != dense")
    assert union[t] == n
sch, outs, _, _, _, _ = run(1.0)  # L = 1000: only iteration 0 recomputes
close(outs[0], dense[0], "dct density 1, step 0 != dense")
ref_outs = reference(1.0, 1000)[0]
for t in range(STEPS):
    close(outs[t], ref_outs[t], f"dct density 1, L=1000, step {t}")

# no memory: unsent values are dropped -------------------------------------------
sch = create("dct", comm, layout, DENSITY, memory=False, lifespan=3)
out = sch.step(grads[0][rank].copy())
close(out.astype(np.float64), reference(DENSITY, 3, steps=1)[0][0], "dct without memory, step 0")
assert sch.memory.state_dict() == {}
d = sch.diagnostics()
assert d["tau_recomputed"] == 1.0 and "error_norm" in d

if rank == 0:
    print(f"dct OK on {W} ranks")
