"""Run on W ranks: the ``dgc`` scheme against a NumPy reference.

Every rank regenerates all ranks' gradients and simulates all ranks'
momentum correction (u, v), clipping, warm-up, exchange and masking over
several steps in plain NumPy.  The selection itself is reproduced by calling
the scheme's pure :func:`dgc_select` on the reference's own ``v`` with a
generator seeded ``(seed, rank, iteration)`` (written out here, not taken
from the scheme), and is checked independently: its count lies in DGC's band
and it holds the largest ``|v|``.  Any mismatch raises, which aborts the job.
"""

import copy
import math
import numpy as np
from _common import SMALL_LAYERS, RankWorld, close

from mpisparse.schemes import create, k_for
from mpisparse.schemes.dgc import dgc_select

STEPS = 5
DENSITY = 0.02
SEED = 3

world = RankWorld(SMALL_LAYERS + [("e.weight", (64, 64))], STEPS, seed=7)
comm, W, rank, layout, n, grads = world


def ref_density(t, target, warmup_iters):
    """0.25 * (target / 0.25) ** (t / T) during the warm-up, then the target."""
    if warmup_iters == 0 or t >= warmup_iters or target >= 0.25:
        return target
    return max(target, 0.25 * (target / 0.25) ** (t / warmup_iters))


def reference(density=DENSITY, momentum=0.9, sample_fraction=0.01, clip_norm=0.0, warmup=0, memory=True,
              steps=STEPS):
    """DGC with momentum correction and masking, every rank simulated (float32 like the scheme)."""
    u = [np.zeros(n, np.float32) for _ in range(W)]
    v = [np.zeros(n, np.float32) for _ in range(W)]
    outs, counts_per_step = [], []
    for t in range(steps):
        k = k_for(ref_density(t, density, warmup), n)
        total = np.zeros(n, np.float64)
        counts = []
        for r in range(W):
            g = grads[t][r]
            if clip_norm > 0:
                norm = float(np.linalg.norm(g))
                limit = clip_norm / math.sqrt(W)
                if norm > limit:
                    g = g * (limit / norm)
            u[r] = u[r] * momentum + g
            if memory:
                v[r] = v[r] + u[r]
                vel = v[r]
            else:
                vel = u[r]
            idx = dgc_select(vel.copy(), k, np.random.default_rng([SEED, r, t]), sample_fraction).indices
            # the selection, checked independently of how it was made
            c = len(idx)
            assert len(set(idx.tolist())) == c
            assert c == k or 0.8 * k <= c <= 1.3 * k, (c, k)
            if c < n:
                rest = np.ones(n, bool)
                rest[idx] = False
                assert np.abs(vel[idx]).min() >= np.abs(vel[rest]).max(), "selection misses a larger |v|"
            total[idx] += vel[idx]
            if memory:
                u[r][idx] = 0
                v[r][idx] = 0
            counts.append(c)
        outs.append(total / W)
        counts_per_step.append(counts)
    return outs, u, v, counts_per_step


def run(density=DENSITY, steps=STEPS, sch=None, start=0, **opts):
    if sch is None:
        sch = create("dgc", comm, layout, density, seed=SEED, **opts)
    outs, step_bytes, selected = world.run(sch, "dgc", range(start, start + steps),
                                           observe=lambda s: s.selected_global(), keeps_input=True)
    return sch, outs, step_bytes, selected


def check_against_reference(what, ref_kw, run_kw):
    ref_outs, ref_u, ref_v, ref_counts = reference(**ref_kw)
    sch, outs, nbytes, selected = run(**run_kw)
    for t in range(STEPS):
        close(outs[t], ref_outs[t], f"{what}: step {t}")
        want = world.sparse_allgather(ref_counts[t])
        assert nbytes[t] == want, (what, "bytes", t, nbytes[t], want)
        # gradient build-up: the union of the ranks' sets
        assert max(ref_counts[t]) <= selected[t] <= sum(ref_counts[t]), (what, selected[t], ref_counts[t])
        if W == 1:
            assert selected[t] == ref_counts[t][0]
    if sch.memory.accumulate:
        close(sch.memory.u, ref_u[rank], f"{what}: u")
        close(sch.memory.v, ref_v[rank], f"{what}: v")
    return sch, outs, selected


# defaults: momentum 0.9, 1 % sample --------------------------------------
sch, outs, selected = check_against_reference("dgc defaults", {}, {})
k = k_for(DENSITY, n)
density_actual = np.mean(selected) / n
if W == 1:  # one rank: the count DGC's adjustment allows
    assert 0.8 * DENSITY <= density_actual <= 1.3 * DENSITY, density_actual
assert density_actual <= 1.3 * W * DENSITY
assert type(sch).provides_momentum is True
diag = sch.diagnostics()
for key in ("error_norm", "dgc_density_scheduled", "dgc_local_count_over_k", "dgc_lowerings", "dgc_threshold"):
    assert key in diag, (key, diag)
assert 0.8 <= diag["dgc_local_count_over_k"] <= 1.3

# clipping (active at every step), warm-up, other momentum and sample -----
norms = [float(np.linalg.norm(g)) for step in grads for g in step]
clip = 0.5 * min(norms) * math.sqrt(W)  # the limit clip / sqrt(W) is half the smallest norm
opts = dict(momentum=0.5, sample_fraction=0.2, clip_norm=clip)
sch, outs, selected = check_against_reference(
    "dgc clip + warm-up", dict(opts, warmup=3), dict(opts, density_warmup_iters=3))
if W == 1:
    assert selected[0] >= 0.8 * 0.25 * n, "warm-up starts at density 0.25"
    assert selected[0] > selected[1] > selected[2] > selected[3]

# no memory: momentum kept, unsent velocity dropped ------------------------
sch, _, _ = check_against_reference("dgc --no-memory", dict(memory=False), dict(memory=False))
assert sch.memory.state_dict()["v"] is None

# momentum 0 and an exact threshold: the topk scheme ----------------------
_, outs, _, _ = run(momentum=0.0, sample_fraction=1.0)
topk = create("topk", comm, layout, DENSITY, seed=SEED)
for t in range(STEPS):
    close(outs[t], topk.step(grads[t][rank].copy()), f"dgc(momentum 0, exact threshold) != topk at step {t}")

# momentum 0: error feedback conserves mass --------------------------------
sch, outs, _, _ = run(momentum=0.0)
world.conserves_mass(outs, sch.memory.v, "dgc(momentum 0)")

# density 1: everything sent and masked every step, so the mean gradient ---
_, outs, nbytes, selected = run(density=1.0, momentum=0.9)
for t in range(STEPS):
    close(outs[t], world.dense(t), f"dgc at density 1 != dense at step {t}")
    assert selected[t] == n

# checkpoint: 2 steps, save, load into a fresh scheme, 3 more steps --------
opts = dict(momentum=0.9, sample_fraction=0.05, density_warmup_iters=2)
_, full, _, _ = run(**opts)
first, _, _, _ = run(steps=2, **opts)
state = copy.deepcopy(first.state_dict())
resumed = create("dgc", comm, layout, DENSITY, seed=SEED + 100, **opts)  # the seed comes from the state
resumed.load_state_dict(state)
_, rest, _, _ = run(sch=resumed, start=2, steps=STEPS - 2)
for t in range(2, STEPS):
    assert np.array_equal(rest[t - 2], full[t]), f"resumed dgc differs from the uninterrupted run at step {t}"
state["extra"]["rank"] = rank + 1
try:
    resumed.load_state_dict(state)
except ValueError as e:
    assert "saved by rank" in str(e)
else:
    raise AssertionError("loading another rank's DGC state did not raise")

if rank == 0:
    print(f"dgc density_actual {density_actual:.5f} (target {DENSITY}) on {W} ranks")
world.done("dgc")
