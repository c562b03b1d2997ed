"""The fused compensation + top-k pass (``mpisparse/backend/fused.py``) against the plain NumPy steps."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SelfComm
from mpisparse.backend import fused
from mpisparse.backend import numpy_kernels as nk
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create

needs_numba = pytest.mark.skipif(not fused.available(), reason="numba is not installed (pip install mpisparse[fast])")


def _pair(n, seed=0, scale=0.1):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n).astype(np.float32)
    e = (rng.standard_normal(n) * scale).astype(np.float32)
    return e, g


@needs_numba
@pytest.mark.parametrize("n,k", [(100_000, 100), (300_001, 3_000), (200_000, 1), (70_000, 17_000)])
def test_fused_gives_the_plain_set_and_residual(n, k):
    e1, g = _pair(n, seed=k)
    e2 = e1.copy()
    plain = fused.compensate_topk(e1, g, k, fused=False, rng=1)
    fast = fused.compensate_topk(e2, g, k, fused=True, rng=2)
    assert np.array_equal(e1, e2)  # the same residual, bit for bit
    assert len(fast) == k == len(set(fast.tolist()))
    assert set(plain.tolist()) == set(fast.tolist())
    # and it is the top-k of the compensated vector (a plain NumPy reference)
    ref = np.argsort(-np.abs(e1), kind="stable")[:k]
    assert np.sort(np.abs(e1[fast]))[0] >= np.abs(e1[ref]).min()


@needs_numba
def test_fused_falls_back_when_the_estimate_admits_too_many():
    n, k = 100_000, 1_000
    e = np.zeros(n, dtype=np.float32)
    g = np.full(n, 2.0, dtype=np.float32)
    g[::7] = -3.0  # 14,286 entries of magnitude 3: every sample threshold admits them all (> 4k + 1024)
    idx = fused.compensate_topk(e, g, k, fused=True, rng=0)
    assert np.array_equal(e, g)
    assert len(idx) == k == len(set(idx.tolist())) and np.all(np.abs(e[idx]) == 3.0)


def test_candidates_short_of_k_fall_back_to_the_whole_vector():
    e = np.arange(1000, dtype=np.float32)
    got = fused.topk_from_candidates(e, np.array([999, 998], dtype=np.int32), 5)
    assert sorted(got.tolist()) == [995, 996, 997, 998, 999]
    assert sorted(fused.topk_from_candidates(e, None, 3).tolist()) == [997, 998, 999]


def test_switches(monkeypatch):
    monkeypatch.setenv("MPISPARSE_FUSED", "0")
    assert fused.enabled() is False
    e, g = _pair(100_000)
    ref = e + g
    idx = fused.compensate_topk(e, g, 10)  # the plain path
    assert np.array_equal(e, ref) and set(idx.tolist()) == set(nk.topk_abs(ref, 10).tolist())
    if not fused.available():
        with pytest.raises(RuntimeError, match="needs numba"):
            fused.compensate_topk(e, g, 10, fused=True)


def test_bad_shapes_are_one_line_errors():
    with pytest.raises(ValueError, match=r"residual shape \(3,\) and gradient shape \(4,\)"):
        fused.compensate_topk(np.zeros(3, np.float32), np.zeros(4, np.float32), 1)
    with pytest.raises(TypeError, match="residual dtype float32 and gradient dtype float64"):
        fused.compensate_topk(np.zeros(3, np.float32), np.zeros(3, np.float64), 1)


@needs_numba
@pytest.mark.parametrize("scheme", ["topk", "gtopk"])
def test_schemes_give_the_same_steps_fused_and_plain(scheme, monkeypatch):
    layout = FusionLayout([("a", (300, 400)), ("b", (1000,)), ("c", (50, 30))])
    grads = [_pair(layout.n, seed=s)[1] for s in range(4)]

    def run(flag):
        monkeypatch.setenv("MPISPARSE_FUSED", flag)
        sch = create(scheme, SelfComm(), layout, 0.01, seed=0)
        outs = [sch.step(g.copy()).copy() for g in grads]
        return outs, sch.memory.residual.copy()

    plain, plain_res = run("0")
    fast, fast_res = run("1")
    for a, b in zip(plain, fast):
        assert np.array_equal(a, b)
    assert np.array_equal(plain_res, fast_res)


@needs_numba
def test_cltk_gives_the_same_steps_fused_and_plain(monkeypatch):
    """CLT-k at W=1 leads every step: the fused pass on the leader, the sparse output reset."""
    layout = FusionLayout([("a", (300, 400)), ("b", (1000,))])
    grads = [_pair(layout.n, seed=s)[1] for s in range(4)]

    def run(flag):
        monkeypatch.setenv("MPISPARSE_FUSED", flag)
        sch = create("cltk", SelfComm(), layout, 0.01, seed=0)
        return [sch.step(g.copy()).copy() for g in grads]

    for a, b in zip(run("0"), run("1")):
        assert np.array_equal(a, b) and np.count_nonzero(b) <= int(0.01 * layout.n) + 1


@needs_numba
@pytest.mark.parametrize("t", [0.0, 1.5, 3.0, 10.0, float("nan")])
def test_fused_threshold_is_threshold_select(t):
    e1, g = _pair(150_000, seed=3)
    e1[5] = np.nan
    e2 = e1.copy()
    plain = fused.compensate_threshold(e1, g, t, fused=False)
    fast = fused.compensate_threshold(e2, g, t, fused=True)
    assert np.array_equal(e1, e2, equal_nan=True)
    assert np.array_equal(plain, fast)  # ascending, the same entries


@needs_numba
@pytest.mark.parametrize("scheme,opts", [("threshold", {}), ("threshold", {"threshold": 2.0}), ("randomk", {})])
def test_threshold_and_randomk_give_the_same_steps_fused_and_plain(scheme, opts, monkeypatch):
    layout = FusionLayout([("a", (300, 400)), ("b", (1000,))])
    grads = [_pair(layout.n, seed=s)[1] for s in range(4)]

    def run(flag):
        monkeypatch.setenv("MPISPARSE_FUSED", flag)
        sch = create(scheme, SelfComm(), layout, 0.01, seed=0, **opts)
        return [sch.step(g.copy()).copy() for g in grads]

    for a, b in zip(run("0"), run("1")):
        assert np.array_equal(a, b)


@needs_numba
@pytest.mark.parametrize("n,k", [(100_000, 100), (300_001, 3_000), (200_000, 1), (1_000_003, 999)])
def test_topk_abs_with_the_compiled_candidate_pass_is_the_plain_set(n, k, monkeypatch):
    x = np.random.default_rng(n).standard_t(3, size=n).astype(np.float32)
    x[::7] = 0.0  # zeros and ties
    x[5:50] = x[60]
    monkeypatch.setenv("MPISPARSE_FUSED", "0")
    plain = nk.topk_abs(x, k, rng=1)
    monkeypatch.setenv("MPISPARSE_FUSED", "1")
    fast = nk.topk_abs(x, k, rng=1)
    again = nk.topk_abs(x, k, rng=1)
    assert fast.shape == (k,) and np.unique(fast).size == k
    # the same magnitudes (on exact ties any of the tied indices)
    assert np.array_equal(np.sort(np.abs(x[plain])), np.sort(np.abs(x[fast])))
    assert np.array_equal(fast, again)  # the result is not a view of the reused buffer, overwritten by the next call
    assert fused.select_ge(x, np.float32(np.inf), 10, np.int64).size == 0


def test_select_ge_is_none_when_switched_off(monkeypatch):
    monkeypatch.setenv("MPISPARSE_FUSED", "0")
    assert fused.select_ge(np.ones(10, np.float32), np.float32(0.5), 10, np.int64) is None


@pytest.mark.parametrize("c", [None, 5, 40])
def test_topk_from_candidates_ascending_is_the_sorted_pick(c):
    e = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    cand = None if c is None else np.sort(np.argsort(-np.abs(e))[:c]).astype(np.int32)
    got = fused.topk_from_candidates(e, cand, 10, ascending=True, rng=0)
    assert np.array_equal(got, np.sort(fused.topk_from_candidates(e, cand, 10, rng=0)))
    assert np.array_equal(got, np.sort(np.argsort(-np.abs(e))[:10]))


@needs_numba
@pytest.mark.parametrize("ascending", [False, True])  # True: the merge of ascending blocks
@pytest.mark.parametrize("cleared", [300, 800])  # 800 > n / 64: the whole vector is zeroed instead
@pytest.mark.parametrize("scale", [1.0, 0.25, 1 / 3])
def test_compiled_scatter_sum_is_the_numpy_one(scale, cleared, ascending, monkeypatch):
    from mpisparse import backend
    from mpisparse.backend import compiled

    n = 50_000
    rng = np.random.default_rng(4)
    blocks = [rng.choice(n, size=s, replace=False).astype(np.int32) for s in (3000, 2500, 0, 4000)]
    if ascending:
        blocks = [np.sort(b) for b in blocks]
    idx = np.concatenate(blocks)
    vals = rng.standard_normal(idx.size).astype(np.float32)
    vals[:5] = -0.0
    vals[7] = np.nan
    counts = [b.size for b in blocks]
    clear = rng.choice(n, size=cleared, replace=False)
    merged = []
    monkeypatch.setattr(compiled, "_scatter_merge_pass",
                        lambda *a, f=compiled._scatter_merge_pass: merged.append(1) or f(*a))
    for whole in (False, True):  # clear None: a vector holding anything (the update written into a gradient)
        outs = []
        for flag in ("0", "1"):
            monkeypatch.setenv("MPISPARSE_FUSED", flag)
            out = np.zeros(n, np.float32)
            out[clear] = 7.0
            if whole:
                out[::3] = 5.0
            backend.scatter_sum(out, idx, vals, counts, scale, clear=None if whole else clear)
            outs.append(out)
        assert np.array_equal(outs[0].view(np.int32), outs[1].view(np.int32))  # bit for bit, -0.0 and NaN too
        assert not np.any(np.isin(np.flatnonzero(outs[1]), idx, invert=True))
    assert len(merged) == (2 if ascending else 0)
    with pytest.raises(IndexError):
        compiled.scatter_sum(np.zeros(10, np.float32), np.array([3, 10]), np.ones(2, np.float32), [2], 1.0,
                             np.array([], np.int64))


def test_step_into_a_vector_that_is_not_like_the_gradient_is_a_one_line_error():
    layout = FusionLayout([("a", (40,)), ("b", (24,))])
    sch = create("topk", SelfComm(), layout, 0.1, seed=0)
    g = np.ones(64, np.float32)
    for bad in (np.zeros(63, np.float32), np.zeros(64, np.float64)):
        with pytest.raises(ValueError, match="out must be like the gradient"):
            sch.step(g, out=bad)
    assert sch.iteration == 0
    out = np.full(64, 7, np.float32)  # whatever it held is replaced: one rank, the sent entries alone
    assert sch.step(g, out=out) is out
    assert np.count_nonzero(out) == sch.k and np.all(out[out != 0] == 1)


@needs_numba
@pytest.mark.parametrize("n, runs", [(100_000, 512), (16 * 9, 9), (1_000_003, 2000)])
def test_the_compiled_sample_reads_one_run_of_adjacent_entries_per_stratum(n, runs):
    from mpisparse.backend import compiled

    rng = np.random.default_rng(n)
    e, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = np.full(runs * compiled.SAMPLE_RUN, np.nan, dtype=np.float32)
    key = 0x1234_5678_9ABC
    compiled._sample_sum_abs(e, g, np.uint64(key), out)
    starts = compiled.stratum_positions(key, n - compiled.SAMPLE_RUN + 1, runs)
    pos = (starts[:, None] + np.arange(compiled.SAMPLE_RUN)).ravel()
    assert pos.max() < n and np.all(np.diff(starts) >= 0)
    np.testing.assert_array_equal(out, np.abs(e[pos] + g[pos]))
