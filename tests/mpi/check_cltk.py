"""Run on W ranks: the ``cltk`` scheme (ScaleCom CLT-k) against a NumPy reference.

Every rank regenerates all ranks' gradients and simulates ScaleCom's
Algorithm 1 for all ranks in float64 (leader ``t mod W``, chunk-wise top-k of
the leader's compensated vector, mean of everyone's values there, low-pass
memory of eq. 5, warm-up), over several steps; the scheme must match it, on
every rank, with the bytes of one Bcast of k indices and one Allreduce of k
values, density exactly k/n, and its diagnostics (Fig. 2/3) must match the
reference's.  Any mismatch raises, which aborts the job.
"""

import sys

import numpy as np
from _common import RankWorld, close

import mpisparse.schemes.cltk as cltk_mod
from mpisparse.schemes import create, k_for

STEPS = 7
DENSITY = 0.05

world = RankWorld(steps=STEPS, seed=11)
comm, W, rank, layout, n, grads = world
k = k_for(DENSITY, n)

# count the selections each rank runs inside step() (only the leader may select)
_select_calls = []
_orig_chunked_topk = cltk_mod.chunked_topk


def _counting_topk(*a, **kw):
    _select_calls.append(1)
    return _orig_chunked_topk(*a, **kw)


cltk_mod.chunked_topk = _counting_topk
# the leader's fused compensate + top-k (one chunk, beta 1, numba installed) is its selection too
_orig_fused = cltk_mod.CLTK.compensate_topk


def _counting_fused(self, *a, **kw):
    _select_calls.append(1)
    return _orig_fused(self, *a, **kw)


cltk_mod.CLTK.compensate_topk = _counting_fused


def topk_ref(x, kk):
    return np.argsort(-np.abs(x), kind="stable")[:kk]


def chunked_ref(x, kk, chunks):
    """Chunk-wise top-k, formulated independently with np.array_split."""
    parts = [pos[topk_ref(x[pos], len(picks))]
             for pos, picks in zip(np.array_split(np.arange(x.size), chunks), np.array_split(np.arange(kk), chunks))]
    return np.sort(np.concatenate(parts))


def cosdist(x, y):
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx == 0 and ny == 0:
        return 0.0
    if nx == 0 or ny == 0:
        return 1.0
    return 1.0 - float(x @ y) / (nx * ny)


def reference(beta, chunks, warmup, memory=True, density=DENSITY, steps=STEPS):
    """ScaleCom Alg. 1 for all ranks at once, in float64."""
    kk = k_for(density, n)
    m = [np.zeros(n) for _ in range(W)]
    res = {"out": [], "idx": [], "leader": [], "ham": [], "cos": [], "own_differs": False}
    for t in range(steps):
        accs = [m[r] + grads[t][r] for r in range(W)]
        if t < warmup:
            res["out"].append(np.mean(accs, axis=0))
            res["idx"].append(None)
            res["leader"].append(None)
            res["ham"].append(0.0)
            m = [np.zeros(n) for _ in range(W)]
        else:
            L = t % W
            idx = chunked_ref(accs[L], kk, chunks)
            out = np.zeros(n)
            out[idx] = np.sum([a[idx] for a in accs], axis=0) / W
            true = chunked_ref(np.mean(accs, axis=0), kk, chunks)
            res["ham"].append((kk - np.intersect1d(idx, true).size) / kk)
            # does following the leader matter here? (some rank's own top-k differs)
            res["own_differs"] |= any(not np.array_equal(chunked_ref(a, kk, chunks), idx) for a in accs)
            for r in range(W):
                resid = accs[r].copy()
                resid[idx] = 0
                m[r] = (1 - beta) * m[r] + beta * resid if memory else np.zeros(n)
            res["out"].append(out)
            res["idx"].append(idx)
            res["leader"].append(L)
        mbar = np.mean(m, axis=0)
        res["cos"].append(float(np.mean([cosdist(mr, mbar) for mr in m])))
    res["memory"] = m
    return res


def check(beta, chunks, warmup, memory=True, density=DENSITY, diagnostics=True, sch=None, start=0):
    what = f"cltk(beta={beta}, chunks={chunks}, warmup={warmup}, memory={memory}, density={density})"
    ref = reference(beta, chunks, warmup, memory, density)
    kk = k_for(density, n)
    if sch is None:
        sch = create("cltk", comm, layout, density, memory=memory, seed=3,
                     beta=beta, chunks=chunks, warmup_iters=warmup)
    outs = []
    for t in range(start, STEPS):
        _select_calls.clear()
        b0 = comm.bytes_sent
        out = sch.step(grads[t][rank].copy())
        nbytes = comm.bytes_sent - b0
        selects = len(_select_calls)
        outs.append(out.astype(np.float64))
        world.same_everywhere(out.tobytes(), f"{what}: aggregate at step {t}")
        close(out, ref["out"][t], f"{what}: aggregate at step {t}")
        if ref["leader"][t] is None:  # warm-up: dense
            assert sch.leader is None and selects == 0, (what, t, sch.leader, selects)
            assert nbytes == world.ring_allreduce(n * 4), (what, "warm-up bytes", t, nbytes)
            assert sch.selected_global() == n
        else:
            L = ref["leader"][t]
            assert sch.leader == L, (what, "leader", t, sch.leader, L)
            assert selects == (1 if rank == L else 0), (what, "only the leader selects", t, rank, selects)
            got = np.sort(np.asarray(sch.last_indices))
            assert got.size == kk and np.unique(got).size == kk, (what, "exactly k distinct", t)
            np.testing.assert_array_equal(got, ref["idx"][t], err_msg=f"{what}: index set at step {t}")
            assert sch.last_indices.dtype == np.int32
            want = world.chain_bcast(kk * 4, L) + world.ring_allreduce(kk * 4)
            assert nbytes == want, (what, "bytes", t, nbytes, want)
            assert sch.selected_global() == kk  # density_actual = k / n exactly: no build-up
        if diagnostics:
            d = sch.diagnostics()
            assert set(d) >= {"error_norm", "hamming_to_true_topk", "memory_cosine_distance"}, d
            assert abs(d["hamming_to_true_topk"] - ref["ham"][t]) <= 1e-12, \
                (what, "hamming", t, d["hamming_to_true_topk"], ref["ham"][t])
            assert abs(d["memory_cosine_distance"] - ref["cos"][t]) <= 1e-5, \
                (what, "cosine", t, d["memory_cosine_distance"], ref["cos"][t])
            if "-v" in sys.argv and rank == 0:
                print(what, t, {k_: round(v, 4) for k_, v in d.items()})
            if W == 1:
                assert d["hamming_to_true_topk"] == 0.0 and d["memory_cosine_distance"] < 1e-9
            world.same_everywhere(d, f"{what}: diagnostics")
    if memory:
        close(sch.memory.residual, ref["memory"][rank], f"{what}: memory after {STEPS} steps", rtol=1e-4)
    return sch, ref


# beta = 1 (plain error feedback) and beta < 1, whole-vector and chunk-wise, with warm-up
for beta in (1.0, 0.5):
    for chunks in (1, 3):
        sch, ref = check(beta, chunks, warmup=0)
        if W > 1 and chunks == 1:
            assert ref["own_differs"], "test data too easy: every rank's own top-k equals the leader's"
    check(beta, 3, warmup=2)
check(0.3, 5, warmup=1)

# beta = 1 is plain error feedback: mass is conserved (W sum_t out_t + sum_r m_r == sum g)
sch = create("cltk", comm, layout, DENSITY, chunks=3, seed=3)
outs = [sch.step(grads[t][rank].copy()).astype(np.float64) for t in range(STEPS)]
world.conserves_mass(outs, sch.memory.residual, "cltk beta=1")

# density 1 equals dense (beta < 1 and chunks too: everything is sent, memory stays 0)
for opts in ({}, {"beta": 0.5, "chunks": 3}, {"beta": 0.2, "chunks": 4, "warmup_iters": 2}):
    sch = create("cltk", comm, layout, 1.0, **opts)
    for t in range(STEPS):
        out = sch.step(grads[t][rank].copy())
        close(out, world.dense(t), f"cltk {opts} at density 1 != dense, step {t}")
        assert sch.selected_global() == n

# no memory: nothing is remembered
check(0.5, 1, warmup=1, memory=False)

# state: stop after 3 steps, reload into a fresh scheme, continue == uninterrupted
a = create("cltk", comm, layout, DENSITY, beta=0.5, chunks=3, warmup_iters=1)
for t in range(3):
    a.step(grads[t][rank].copy())
state = a.state_dict()
assert state["iteration"] == 3 and state["extra"]["beta"] == 0.5 and state["memory"]["beta"] == 0.5
b = create("cltk", comm, layout, DENSITY, beta=0.5, chunks=3, warmup_iters=1)
b.load_state_dict(state)
check(0.5, 3, warmup=1, sch=b, start=3)

# invalid hyperparameters
for bad, msg in (({"beta": 0.0}, "--beta"), ({"beta": 1.5}, "--beta"), ({"chunks": 0}, "--chunks"),
                 ({"chunks": n + 1}, "--chunks"), ({"warmup_iters": -1}, "--warmup-iters")):
    try:
        create("cltk", comm, layout, DENSITY, **bad)
    except ValueError as e:
        assert msg in str(e), (bad, str(e))
    else:
        raise AssertionError(f"cltk accepted {bad}")

world.done("cltk")
