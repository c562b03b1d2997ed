"""The segmented NumPy kernels (``segment_norms``, ``segment_topk_abs``) against per-segment references."""

from __future__ import annotations

import numpy as np
import pytest

from mpisparse import backend
from mpisparse.backend import compiled_compensate, compiled_segments, numpy_select
from mpisparse.backend import numpy_segment_topk as nst
from mpisparse.backend import numpy_kernels as nk


def ref_topk(x, starts, sizes, ks):
    """Per segment, the set of the k largest |x| (ties-free input: unique)."""
    out = []
    for a, s, k in zip(starts, sizes, ks):
        loc = np.argsort(-np.abs(x[a:a + s]), kind="stable")[:k]
        out.append(np.sort(loc + a))
    return out


def split(got, ks):
    """``got`` cut into per-segment groups (sorted), checking exactly k_i each."""
    got = np.asarray(got)
    assert got.size == int(np.sum(ks))
    ends = np.cumsum(ks)
    return [np.sort(got[e - k:e]) for e, k in zip(ends, ks)]


def random_layout(rng, tiny=False):
    S = int(rng.integers(1, 40))
    sizes = rng.integers(0, 50 if tiny else 5000, S)
    sizes[rng.integers(0, S, max(1, S // 4))] = rng.integers(0, 2, max(1, S // 4))  # empty and one-element
    if not tiny and rng.random() < 0.3:
        sizes[int(rng.integers(0, S))] = int(rng.integers(20_000, 200_000))  # a large segment (topk_abs path)
    gaps = rng.integers(0, 3, S)
    starts = np.cumsum(gaps) + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    n = int(starts[-1] + sizes[-1]) + int(rng.integers(0, 5))
    return starts.astype(np.int64), sizes.astype(np.int64), n


def random_ks(rng, sizes):
    ks = []
    for s in sizes:
        c = rng.random()
        ks.append(0 if c < 0.15 else int(s) if c < 0.3 else int(rng.integers(0, s + 1)) if c < 0.6
                  else min(int(s), max(1, int(0.01 * s))))
    return np.array(ks, dtype=np.int64)


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch):
    """Run a test on the compiled segmented kernel (numba) and on the NumPy one (``MPISPARSE_FUSED=0``)."""
    if request.param == "compiled" and not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")
    monkeypatch.setenv("MPISPARSE_FUSED", "1" if request.param == "compiled" else "0")
    return request.param


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_topk_abs_equals_per_segment_reference(seed, dtype, path):
    rng = np.random.default_rng(seed)
    starts, sizes, n = random_layout(rng, tiny=seed % 4 == 0)
    x = rng.standard_normal(n).astype(dtype)  # continuous: ties-free
    before = x.copy()
    sub = rng.permutation(starts.size)[: int(rng.integers(1, starts.size + 1))]  # a subset, any order
    st, sz = starts[sub], sizes[sub]
    ks = random_ks(rng, sz)
    got = backend.segment_topk_abs(x, st, sz, ks, rng=seed)
    assert got.dtype == backend.index_dtype(n)
    for g, w in zip(split(got, ks), ref_topk(x, st, sz, ks)):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(x, before)


def test_segment_topk_abs_many_tiny_segments_and_edges(path):
    rng = np.random.default_rng(1)
    sizes = rng.integers(0, 4, 3000).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    x = rng.standard_normal(int(sizes.sum())).astype(np.float32)
    ks = np.array([int(rng.integers(0, s + 1)) for s in sizes])
    got = nk.segment_topk_abs(x, starts, sizes, ks)
    for g, w in zip(split(got, ks), ref_topk(x, starts, sizes, ks)):
        np.testing.assert_array_equal(g, w)
    assert nk.segment_topk_abs(x, [], [], []).size == 0
    assert nk.segment_topk_abs(x, starts, sizes, np.zeros_like(sizes)).size == 0
    assert sorted(nk.segment_topk_abs(x, [5], [3], [3]).tolist()) == [5, 6, 7]


def test_segment_topk_abs_retry_and_fallback_paths(monkeypatch, path):
    """A threshold margin of zero makes many segments come up short: the retries stay exact."""
    monkeypatch.setattr(numpy_select, "_MARGIN_SIGMAS", -3.0)
    monkeypatch.setattr(numpy_select, "_MARGIN_EXTRA", 0)
    monkeypatch.setattr(nst, "_SEGC_SIGMAS", -3.0)  # the compiled kernel's own margin
    monkeypatch.setattr(nst, "_SEGC_EXTRA", 0)
    rng = np.random.default_rng(7)
    sizes = np.full(60, 12_000, dtype=np.int64)
    starts = np.arange(60, dtype=np.int64) * 12_000
    x = rng.standard_normal(int(sizes.sum())).astype(np.float32)
    ks = rng.integers(1, 400, 60)
    for mr in (3, 1):
        monkeypatch.setattr(numpy_select, "MAX_RETRIES", mr)
        got = nk.segment_topk_abs(x, starts, sizes, ks, rng=3)
        for g, w in zip(split(got, ks), ref_topk(x, starts, sizes, ks)):
            np.testing.assert_array_equal(g, w)


def test_segment_topk_abs_ties_exactly_k(path):
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, 40_000).astype(np.float32)  # 7 values: huge ties
    sizes = np.array([10_000, 0, 1, 29_999], dtype=np.int64)
    starts = np.array([0, 10_000, 10_000, 10_001], dtype=np.int64)
    ks = np.array([123, 0, 1, 5000])
    got = nk.segment_topk_abs(x, starts, sizes, ks)
    for g, a, s, k in zip(split(got, ks), starts, sizes, ks):
        assert np.unique(g).size == k and (g.size == 0 or (g.min() >= a and g.max() < a + s))
        seg = np.abs(x[a:a + s])
        assert k == 0 or np.abs(x[g]).min() >= np.sort(seg)[::-1][k - 1]


def test_segment_topk_abs_nan_and_inf_rank_largest(path):
    """NaN ranks above every magnitude, inf next, on both paths (the kernels compare magnitude keys)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(300_000).astype(np.float32)
    x[[10, 70_000, 299_999]] = np.nan
    x[[20, 150_000]] = [np.inf, -np.inf]
    starts, sizes, ks = np.array([0, 100_000]), np.array([100_000, 200_000]), np.array([3, 50])
    got = split(nk.segment_topk_abs(x, starts, sizes, ks, rng=0), ks)
    assert {10, 20, 70_000} == set(got[0].tolist())
    assert {150_000, 299_999} <= set(got[1].tolist())
    rest = np.setdiff1d(got[1], [150_000, 299_999])
    np.testing.assert_array_equal(rest, np.sort(100_000 + np.argsort(-np.abs(np.nan_to_num(x[100_000:], posinf=0, neginf=0)),
                                                                      kind="stable")[:48]))


def test_compiled_and_numpy_paths_select_the_same_sets(monkeypatch):
    """The compiled kernel and the NumPy kernel pick the same index set per segment (ties-free data)."""
    if not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 300_000, 60).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    x = rng.standard_normal(int(sizes.sum())).astype(np.float32) * rng.uniform(0.1, 10, int(sizes.sum())).astype(np.float32)
    ks = np.maximum(1, (sizes * rng.uniform(0.0005, 0.05, 60)).astype(np.int64))
    got = {}
    for env in ("1", "0"):
        monkeypatch.setenv("MPISPARSE_FUSED", env)
        got[env] = split(nk.segment_topk_abs(x, starts, sizes, ks, rng=1), ks)
    for a, b in zip(got["1"], got["0"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("width", [np.uint32, np.uint64])
def test_compiled_order_statistics_equal_a_sort(width):
    """The compiled kernel's order statistics (in-place select, and the scan keeping the r largest) on keys
    with many ties, sorted and reversed runs, against ``np.sort``."""
    if not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")
    rng = np.random.default_rng(7)
    top = np.empty(compiled_segments._TOP, width)
    for it in range(600):
        n = int(rng.integers(1, 400))
        a = rng.integers(0, [2, 5, 60, 1 << 31][it % 4], n).astype(width)
        if it % 5 == 1:
            a.sort()
        elif it % 5 == 2:
            a = np.sort(a)[::-1].copy()
        want = np.sort(a)
        for r in {1, 2, min(n, compiled_segments._TOP), min(n, compiled_segments._TOP + 1), n, int(rng.integers(1, n + 1))}:
            b = a.copy()
            assert compiled_segments._rth_largest(b, n, r, top, np.empty(n, width)) == want[n - r]
            np.testing.assert_array_equal(b, a)  # the input is left as it was
        kth = int(rng.integers(0, n))
        b = a.copy()
        assert compiled_segments._select_kth(b, n, kth) == want[kth]
        np.testing.assert_array_equal(np.sort(b), want)  # a permutation of the input
        assert b[:kth].max(initial=0) <= want[kth] <= b[kth:].min()


def test_compiled_plan_equals_segment_plan():
    """The compiled kernel's per-segment sample sizing is ``segment_plan``'s arithmetic, number for number."""
    if not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")
    rng = np.random.default_rng(3)
    sizes = np.concatenate([rng.integers(1, 100, 200), rng.integers(100, 3_000_000, 300), [1, 2, 7, 8, 9, 64]])
    ks = np.array([int(rng.integers(0, s + 1)) if i % 3 == 0 else min(int(s), max(1, int(s * 10.0 ** rng.uniform(-4, -1))))
                   for i, s in enumerate(sizes)], dtype=np.int64)
    sizes = sizes.astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    for sizing in (nst._segc_sizing(), (32.0, 4.0, 256.0, 8192.0, 2.0, 2.0, 0.25), (16.0, 0.0, 256.0, 8192.0, 1.5, 1.0, 0.25)):
        hits, sqrt_cap, _, smax, sigmas, extra, _ = sizing
        want_m, want_r = nst.segment_plan(sizes, ks, sqrt_cap or None, hits=hits, sample_max=int(smax), sigmas=sigmas,
                                          extra=extra)
        m, r, ooff = np.empty_like(ks), np.empty_like(ks), np.empty(ks.size + 1, np.int64)
        mmax = compiled_segments._plan(starts, sizes, ks, sizing, m, r, ooff)
        np.testing.assert_array_equal(m, want_m)
        np.testing.assert_array_equal(r, want_r)
        np.testing.assert_array_equal(ooff, np.concatenate([[0], np.cumsum(ks)]))
        assert mmax == want_m.max()


def test_compiled_kernel_grows_its_kept_buffers(monkeypatch):
    """Buffers kept from a call with small k are grown inside the kernel when a later call needs more room for
    its candidates or its sample (a sample of 1,600 keys, an order statistic of rank above ``_TOP``)."""
    if not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")
    monkeypatch.setenv("MPISPARSE_FUSED", "1")
    monkeypatch.setattr(compiled_segments._state, "buf", {})
    rng = np.random.default_rng(5)
    x = rng.standard_normal(3_000_000).astype(np.float32)
    for starts, sizes, ks in (([0], [5000], [3]), ([0, 2_000_000], [2_000_000, 1_000_000], [20_000, 400_000])):
        got = nk.segment_topk_abs(x, starts, sizes, ks, rng=2)
        for g, w in zip(split(got, ks), ref_topk(x, starts, sizes, ks)):
            np.testing.assert_array_equal(g, w)
    cand, ckey, tmp = compiled_segments._state.buf[4]
    assert cand.size >= 400_000 and ckey.size == cand.size and tmp.size >= cand.size


def test_segment_topk_abs_errors():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match=r"ks\[0\] must be in \[0, 3\], got 4"):
        nk.segment_topk_abs(x, [0], [3], [4])
    with pytest.raises(ValueError, match="ends at 12, past the vector's length 10"):
        nk.segment_topk_abs(x, [9], [3], [1])
    with pytest.raises(ValueError, match="same length"):
        nk.segment_norms(x, [0, 1], [1])


@pytest.mark.parametrize("seed", range(20))
def test_segment_norms_equal_per_segment_reference(seed):
    rng = np.random.default_rng(100 + seed)
    starts, sizes, n = random_layout(rng, tiny=seed % 3 == 0)
    x = rng.standard_normal(n).astype(np.float32 if seed % 2 else np.float64)
    sub = rng.permutation(starts.size)[: int(rng.integers(1, starts.size + 1))]
    got = backend.segment_norms(x, starts[sub], sizes[sub])
    want = [np.linalg.norm(x[a:a + s].astype(np.float64)) for a, s in zip(starts[sub], sizes[sub])]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert np.all(got[sizes[sub] == 0] == 0.0)  # empty segments: exactly 0


def test_segment_norms_overflow_zero_and_nonfinite():
    x = np.full(5000, 1e20, dtype=np.float32)  # float32 squares overflow
    x[3000:4000] = 0.0
    got = nk.segment_norms(x, [0, 3000, 10, 4999], [3000, 1000, 0, 1])
    np.testing.assert_allclose(got, [np.sqrt(3000) * 1e20, 0.0, 0.0, 1e20], rtol=1e-6)
    y = np.ones(3000, np.float32)
    y[2500] = np.inf
    assert np.isinf(nk.segment_norms(y, [0, 2000], [2000, 1000])).tolist() == [False, True]


def count_numpy_calls(monkeypatch):
    """Count calls of the NumPy functions the segmented kernels are built from."""
    calls = {"n": 0}
    for name in ("flatnonzero", "repeat", "sort", "argpartition", "cumsum", "searchsorted", "concatenate",
                 "bincount", "lexsort", "argsort", "partition", "vecdot", "einsum", "dot"):
        if not hasattr(np, name):
            continue
        real = getattr(np, name)

        def wrapped(*a, _real=real, **kw):
            calls["n"] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(nst.np, name, wrapped)
    return calls


def test_numpy_calls_do_not_grow_with_the_number_of_segments(monkeypatch):
    """20 vs 2000 segments over the same data: the same number of NumPy calls (a per-layer loop fails this)."""
    rng = np.random.default_rng(5)
    n = 200_000
    x = rng.standard_normal(n).astype(np.float32)
    counts = {}
    for S in (20, 2000):
        sizes = np.full(S, n // S, dtype=np.int64)
        starts = np.arange(S, dtype=np.int64) * (n // S)
        ks = np.maximum(1, sizes // 100)
        calls = count_numpy_calls(monkeypatch)
        nk.segment_topk_abs(x, starts, sizes, ks, rng=0)
        nk.segment_norms(x, starts, sizes)
        counts[S] = calls["n"]
        monkeypatch.undo()
    assert counts[2000] <= counts[20] + 5, counts


# --------------------------------------------------------------------------
# the compensation pass that also collects candidates (DEFT's fused Alg. 5)
# --------------------------------------------------------------------------


def _needs_numba():
    if not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")


def _segments_case(dtype, seed=3):
    """Segments with a gap, sizes from 1 to 120 k, e and g of distinct magnitudes."""
    rng = np.random.default_rng(seed)
    sizes = np.array([5000, 70000, 30, 1, 120000, 2000, 40000], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    starts[4:] += 100  # a gap of 100 entries before segment 4 (compensated, in no segment)
    n = int(starts[-1] + sizes[-1] + 50)
    e = rng.standard_normal(n).astype(dtype)
    g = rng.standard_normal(n).astype(dtype)
    return starts, sizes, e, g


def _check_taken(x, starts, sizes, part, ks, idx, short):
    """Every non-short segment of ``part`` gave exactly its top ``k`` magnitudes (compared as values, so
    that ties may go either way), grouped in the order of ``part``."""
    w = 0
    for j, i in enumerate(part):
        a, s, k = int(starts[i]), int(sizes[i]), int(ks[i])
        if short[j]:
            continue
        got = idx[w:w + k]
        w += k
        assert got.size == k and np.all((got >= a) & (got < a + s))
        assert np.unique(got).size == k
        want = np.sort(np.abs(x[a:a + s]))[::-1][:k]
        np.testing.assert_array_equal(np.sort(np.abs(x[got]))[::-1], want)
    assert w == idx.size


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pass_candidates_give_each_segments_top_k_whatever_the_guess(dtype):
    """compensate_norms_candidates compensates as e += g and gives compensate_norms' norms bit for bit;
    take_candidates then gives the exact top k of every segment its candidates cover, and flags the others
    (a guess of 0: no candidates) as short."""
    _needs_numba()

    starts, sizes, e0, g = _segments_case(dtype)
    part = np.array([4, 1, 2, 3, 0, 6], np.int64)  # segment 5 is another rank's
    ks = np.array([40, 700, 3, 1, 1200, 20, 400], np.int64)
    plain = e0.copy()
    norms = compiled_compensate.compensate_norms(plain, g, starts, sizes)
    for guess in (ks, ks // 4, 2 * ks, np.where(np.arange(7) == 1, 0, ks)):
        e = e0.copy()
        got_norms, cands = compiled_compensate.compensate_norms_candidates(e, g, starts, sizes, part, guess,
                                                                           nst._segc_sizing(), 11)
        np.testing.assert_array_equal(e, e0 + g)
        np.testing.assert_array_equal(got_norms, norms)
        assert cands is not None and np.all(np.diff(cands.cand) > 0)  # ascending: grouped by segment
        assert cands.counts[5] == 0  # not this rank's: nothing collected
        idx, short = compiled_compensate.take_candidates(cands, ks)
        assert short.tolist() == [bool(cands.counts[i] < ks[i]) for i in part]
        if guess[1] == 0:
            assert short[1]  # no candidates for a guess of 0
        _check_taken(e, starts, sizes, part, ks, idx, short)
    assert not short.all()


def test_pass_candidates_nan_inf_overflow_and_zero_segments():
    """NaN ranks as the largest magnitude, inf next; a threshold that collects more than the buffers hold
    gives no candidates (e and the norms still right) and larger buffers next time; a segment of zeros
    with a k (its sampled threshold 0: every entry a candidate) larger than 65,536 plus four times the
    guesses gives no candidates."""
    _needs_numba()

    starts, sizes, e0, g = _segments_case(np.float32)
    g[starts[4] + 7] = np.nan
    g[starts[4] + 9] = np.inf
    part = np.array([4], np.int64)
    ks = np.zeros(7, np.int64)
    ks[4] = 2
    e = e0.copy()
    norms, cands = compiled_compensate.compensate_norms_candidates(e, g, starts, sizes, part, ks, nst._segc_sizing(),
                                                                   1)
    idx, short = compiled_compensate.take_candidates(cands, ks)
    assert not short[0] and sorted(idx.tolist()) == [starts[4] + 7, starts[4] + 9]
    assert np.isnan(norms[4]) and np.isfinite(np.delete(norms, 4)).all()

    flat = np.ones(int(starts[-1] + sizes[-1] + 50), np.float32)  # every magnitude 1: every entry reaches it
    e = np.zeros_like(flat)
    ks = np.zeros(7, np.int64)
    ks[4] = 10
    before = compiled_segments._state.fused[(4, 4)][0].shape[0]
    norms, cands = compiled_compensate.compensate_norms_candidates(e, flat, starts, sizes, part, ks,
                                                                   nst._segc_sizing(), 2)
    assert cands is None
    np.testing.assert_array_equal(e, flat)
    np.testing.assert_allclose(norms, np.sqrt(sizes.astype(np.float64)))
    assert compiled_segments._state.fused[(4, 4)][0].shape[0] == 2 * max(before, 4 * 10 + 1024)

    zeros = np.zeros_like(flat)
    e = np.zeros_like(flat)
    norms, cands = compiled_compensate.compensate_norms_candidates(e, zeros, starts, sizes, part, ks,
                                                                   nst._segc_sizing(), 3)
    assert cands is None and not norms.any()
    assert compiled_compensate.compensate_norms_candidates(e, zeros, starts[::-1], sizes[::-1], part, ks,
                                                           nst._segc_sizing(), 3) is None  # not ascending


# --------------------------------------------------------------------------
# the device kernels (cupy_segments, cuda/segmented.cu) on the CPU emulator
# --------------------------------------------------------------------------


def _mag_keys(v: np.ndarray) -> np.ndarray:
    """Magnitude keys (the bits of |v|; NaN above inf), the order both kernels rank by."""
    return nst._keys(np.ascontiguousarray(v))


def _device_case(name: str, rng):
    """``(x, starts, sizes, ks)`` of one layout of the device tests (small: the emulator runs every thread)."""
    if name == "tiny":  # segments of 0-6 elements, gaps, k from 0 to the whole segment
        sizes = rng.integers(0, 7, 40)
    elif name == "many-small":
        sizes = rng.integers(0, 4, 600)
    elif name == "one-huge":  # one segment of 9 tiles, its candidates in the candidate regions
        sizes = np.array([70_001])
    else:
        sizes = np.array([3, 0, 20_000, 8_192, 1, 9_000, 257, 16_385])
    sizes = sizes.astype(np.int64)
    starts = (np.concatenate([[0], np.cumsum(sizes)[:-1]]) + rng.integers(0, 3, sizes.size).cumsum()).astype(np.int64)
    n = int(starts[-1] + sizes[-1]) + 2
    x = {"equal": lambda: np.full(n, -0.75),  # one value: every bucket overflows its region, x read again
         "ties": lambda: rng.integers(-3, 4, n) * 0.5,
         "negative": lambda: -np.abs(rng.standard_normal(n)) - 1e-3,
         "nan-inf": lambda: np.where(rng.random(n) < 0.002, np.nan, np.where(rng.random(n) < 0.002, -np.inf,
                                                                               rng.standard_normal(n)))}.get(
        name, lambda: rng.standard_normal(n))()
    ks = np.array([int(s) if i % 4 == 1 else 0 if i % 4 == 2 else int(rng.integers(0, s + 1)) if i % 4 == 3
                   else min(int(s), max(1, int(0.01 * s))) for i, s in enumerate(sizes)], dtype=np.int64)
    if name == "one-huge":
        ks = np.array([700])
    return x, starts, sizes, ks


@pytest.mark.parametrize("name,dtype", [("tiny", np.float32), ("many-small", np.float32), ("one-huge", np.float32),
                                        ("mixed", np.float64), ("equal", np.float32), ("ties", np.float64),
                                        ("negative", np.float32), ("nan-inf", np.float32)])
def test_device_segment_topk_and_norms_equal_the_numpy_kernels(name, dtype, monkeypatch):
    """The segmented radix select and the one-launch norms on the emulator: exactly k_i indices per segment,
    grouped in the given order (a subset of the layout, shuffled), whose magnitude keys are the segment's k_i
    largest, the same index sets as the NumPy kernel where there are no ties; the norms equal a float64
    reference within rounding (empty segments exactly 0)."""
    from gpu_emu import fakecupy

    if not fakecupy.compiler_available():
        pytest.skip("the CPU emulator of the CUDA kernels needs g++ (or $CXX)")
    cp = fakecupy.install(monkeypatch)
    from mpisparse.backend import cupy_kernels as ck

    rng = np.random.default_rng(sum(map(ord, name)))
    x, starts, sizes, ks = _device_case(name, rng)
    x = x.astype(dtype)
    sub = rng.permutation(sizes.size)
    st, sz, k = starts[sub], sizes[sub], ks[sub]
    d = cp.asarray(x)
    got = ck.segment_topk_abs(d, st, sz, k).get()
    assert got.dtype == nk.index_dtype(x.size) and got.size == k.sum()
    want = nk.segment_topk_abs(x, st, sz, k, rng=0)
    ties = name in ("equal", "ties", "many-small", "tiny", "nan-inf")  # equal keys: any of them may be taken
    for g, w, a, s, kk in zip(split(got, k), split(want, k), st, sz, k):
        assert np.unique(g).size == kk and (kk == 0 or (g.min() >= a and g.max() < a + s))
        np.testing.assert_array_equal(np.sort(_mag_keys(x[g])), np.sort(_mag_keys(x[a:a + s]))[s - kk:])
        if not ties:
            np.testing.assert_array_equal(g, w)
    finite = name != "nan-inf"
    norms = ck.segment_norms(d, st, sz)
    ref = np.array([np.linalg.norm(x[a:a + s].astype(np.float64)) for a, s in zip(st, sz)])
    if finite:
        np.testing.assert_allclose(norms, ref, rtol=1e-12)
    else:
        np.testing.assert_array_equal(np.isnan(norms), np.isnan(ref))
    assert np.all(norms[sz == 0] == 0.0)
