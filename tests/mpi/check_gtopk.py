"""Run on W ranks: ``gtopk`` (Shi et al. 2019) against a plain-dict reference.

Every rank regenerates all ranks' gradients and replays the recursive-doubling
merge tree (fold-in of ranks >= P, log2 P pairwise rounds, fold-out) with
Python dicts, tracking which ranks' contributions each merged entry carries,
so the global set, the output, each residual, the mass lost to pruned
contributions, and the bytes are all checked.  A second run uses integer
gradients whose merges tie in magnitude, so the tie rule (smaller index
first) and the merge order are checked exactly.
"""

import numpy as np
from _common import RankWorld, close

from mpisparse.schemes import create, k_for

STEPS = 4
DENSITY = 0.05

world = RankWorld(steps=STEPS, seed=7)
comm, W, rank, layout, n, synthetic = world
P = 1
while 2 * P <= W:
    P *= 2


def integer_grads(t, k):
    """Integer gradients with distinct magnitudes per rank (a unique local top-k).

    Even steps: a signed permutation of 1..n per rank (local sets overlap, so
    merges sum).  Odd steps: every rank's k largest are the same magnitudes
    n-k+1..n, placed at indices = rank (mod W), so sets never overlap and
    every merge ties at the k-th place (the smaller index must win).
    """
    out = []
    for r in range(W):
        rng = np.random.default_rng([11, t, r])
        sign = rng.choice([-1, 1], n).astype(np.float32)
        if t % 2 == 0:
            out.append((rng.permutation(n) + 1).astype(np.float32) * sign)
            continue
        top = np.sort(rng.choice(np.arange(r, n, W), k, replace=False))
        g = np.zeros(n, np.float32)
        g[top] = rng.permutation(np.arange(n - k + 1, n + 1))
        rest = np.setdiff1d(np.arange(n), top)
        g[rest] = rng.permutation(n - k) + 1
        out.append(g * sign)
    return out


def merge(a, b, k):
    """Union (float32 sums, contributor sets united), keep k by (-|v|, index)."""
    d = dict(a)
    for i, (v, who) in b.items():
        if i in d:
            d[i] = (np.float32(d[i][0] + v), d[i][1] | who)
        else:
            d[i] = (v, who)
    return dict(sorted(d.items(), key=lambda e: (-abs(float(e[1][0])), e[0]))[:k])


def reference(grads, k, memory=True, keep_sets=None):
    resid = [np.zeros(n, np.float32) for _ in range(W)]
    outs, lost = [], np.zeros(n, np.float64)
    for t in range(len(grads)):
        accs = [(resid[r] + grads[t][r]) if memory else grads[t][r].copy() for r in range(W)]
        local = [np.argsort(-np.abs(a), kind="stable")[:k] for a in accs]
        sets = [{int(i): (accs[r][i], frozenset([r])) for i in local[r]} for r in range(W)]
        for r in range(P, W):  # fold-in
            sets[r - P] = merge(sets[r - P], sets[r], k)
        d = 1
        while d < P:  # recursive doubling
            sets = [merge(sets[r], sets[r ^ d], k) if r < P else None for r in range(W)]
            d *= 2
        final = sets[0]
        if keep_sets is not None:
            keep_sets.append(final)
        out = np.zeros(n, np.float64)
        for i, (v, _) in final.items():
            out[i] = float(v) / W
        outs.append(out)
        for r in range(W):
            for i in local[r]:
                if int(i) in final:
                    if r not in final[int(i)][1]:
                        lost[i] += float(accs[r][i])  # pruned on the way, still zeroed
                    accs[r][i] = 0
            resid[r] = accs[r]
    return outs, resid, lost


def expected_bytes(k):
    payload = k * (4 + 4)
    if rank >= P:
        return payload
    rounds = P.bit_length() - 1
    return rounds * (payload + 16) + (payload if rank + P < W else 0)


def same_global_set(sch):
    world.same_everywhere(sch.global_indices.tobytes(), "gtopk: global set")
    assert sch.selected_global() == sch.k


def run(grads, density, **kw):
    sch = create("gtopk", comm, layout, density, seed=3, **kw)
    outs, nbytes, _ = world.run(sch, "gtopk", grads=grads, observe=same_global_set)
    return sch, outs, nbytes


# synthetic gradients, with error feedback -----------------------------------
k = k_for(DENSITY, n)
ref_outs, ref_resid, lost = reference(synthetic, k)
sch, outs, nbytes = run(synthetic, DENSITY)
for t in range(STEPS):
    close(outs[t], ref_outs[t], f"gtopk step {t}")
    assert np.count_nonzero(outs[t]) <= k
    assert nbytes[t] == expected_bytes(k), ("gtopk bytes", t, nbytes[t], expected_bytes(k))
np.testing.assert_array_equal(sch.memory.residual, ref_resid[rank], "gtopk residual")
# W sum(out) + sum(e) = sum(g) - lost (pruned contributions of selected indices)
lhs, rhs = world.mass_balance(outs, sch.memory.residual)
np.testing.assert_allclose(rhs - lhs, lost, rtol=1e-4, atol=1e-7 * float(np.abs(rhs).max()),
                           err_msg="gtopk: mass balance with the pruned contributions")
if W >= 3:
    assert np.any(lost), "the synthetic run should prune some contributions of selected indices"

# integer gradients: ties in the merges, checked exactly ----------------------
ints = [integer_grads(t, k) for t in range(4)]
ref_outs, _, _ = reference(ints, k, memory=False, keep_sets=(ref_sets := []))
sch = create("gtopk", comm, layout, DENSITY, memory=False)
for t in range(4):
    out = sch.step(ints[t][rank].copy())
    # the exact global set (ties broken towards the smaller index), exact integer sums
    assert sch.global_indices.tolist() == sorted(ref_sets[t]), f"gtopk tie order step {t}"
    close(out, ref_outs[t], f"gtopk integer step {t}")
assert sch.memory.state_dict() == {}

# density 1 equals dense --------------------------------------------------------
sch, outs, nbytes = run(synthetic, 1.0)
for t in range(STEPS):
    close(outs[t], world.dense(t), f"gtopk at density 1 != dense, step {t}")
    assert nbytes[t] == expected_bytes(n)
assert not np.any(sch.memory.residual)

# diagnostics: every rank answers -----------------------------------------------
sch = create("gtopk", comm, layout, DENSITY)
sch.step(synthetic[0][rank].copy())
diag = sch.diagnostics()
assert 0.0 < diag["local_in_global"] <= 1.0 and "error_norm" in diag

world.done("gtopk", f" (pruned-and-lost entries: {np.count_nonzero(lost)})")
