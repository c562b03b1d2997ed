"""Run on W ranks: ``dct`` (DCT-DP, Gupta et al., Alg. 1) against a NumPy reference.

Every rank regenerates all ranks' gradients and simulates Algorithm 1 on
each of them in float32 (per-rank, per-layer thresholds, the k-th largest
``|W|`` by a full sort, recomputed when L divides the iteration, mask
``|W| >= tau``, error feedback), sums the masked vectors and compares with
the scheme over several steps: output, residual, thresholds, the recompute
iterations, distinct indices, bytes of the Allgatherv exchange, mass
conservation, and density 1 against dense.
"""

import numpy as np
from _common import RankWorld, close, error_feedback_reference

from mpisparse.schemes import create

STEPS = 7
DENSITY = 0.05

world = RankWorld(steps=STEPS, seed=7)
comm, W, rank, layout, n, grads = world


def reference(density, lifespan, steps=STEPS):
    """Alg. 1 on every rank; returns per-step outputs, counts, union sizes, taus; final residuals."""
    ks = [max(1, int(np.floor(density * s.size + 1e-9))) for s in layout.layers]
    taus = [None] * W
    tau_hist = []

    def select(acc, r, t):  # acc: l.2 (float32, as the scheme)
        if r == 0:
            tau_hist.append([])
        if t % lifespan == 0:  # l.3-5
            taus[r] = [np.sort(np.abs(layout.view(acc, i)))[::-1][ks[i] - 1] for i in range(len(layout))]
        tau_hist[t].append([float(x) for x in taus[r]])
        # l.9; the sent values are summed (l.10, l.12) and leave the residual (l.11)
        return np.concatenate([np.abs(layout.view(acc, i)) >= taus[r][i] for i in range(len(layout))])

    outs, counts, union, resid = error_feedback_reference(world, select, steps, dtype=np.float32)
    return outs, counts, union, tau_hist, resid


def run(density, **opts):
    sch = create("dct", comm, layout, density, seed=3, **opts)
    outs, nbytes, seen = world.run(sch, "dct", observe=lambda s: (s.recomputed, list(s.taus), s.selected_global()))
    flags, taus, union = (list(x) for x in zip(*seen))
    return sch, outs, nbytes, flags, taus, union


dense = [world.dense(t) for t in range(STEPS)]

for lifespan in (3, 1, 1000):
    ref_outs, ref_counts, ref_union, ref_taus, ref_resid = reference(DENSITY, lifespan)
    sch, outs, nbytes, flags, taus, union = run(DENSITY, lifespan=lifespan)
    for t in range(STEPS):
        close(outs[t], ref_outs[t], f"dct L={lifespan} step {t}")
        assert taus[t] == ref_taus[t][rank], ("dct taus", lifespan, t)
        assert union[t] == ref_union[t], ("dct selected_global", lifespan, t, union[t], ref_union[t])
        want = world.sparse_allgather(ref_counts[t])
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
    world.conserves_mass(outs, sch.memory.residual, f"dct L={lifespan}")

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

world.done("dct")
