"""Tests of the CPU selection kernels against plain NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from mpisparse import backend
from mpisparse.backend import cupy_kernels as ck
from mpisparse.backend import numpy_kernels as nk
from mpisparse.backend import numpy_select


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _frozen(x: np.ndarray) -> np.ndarray:
    """A read-only copy: any write by a kernel raises."""
    x = np.array(x, copy=True)
    x.flags.writeable = False
    return x


def assert_topk(x: np.ndarray, k: int, idx: np.ndarray) -> None:
    n = x.size
    assert idx.ndim == 1
    assert idx.dtype == np.int32
    assert idx.size == k
    assert np.unique(idx).size == k, "indices not distinct"
    if k:
        assert idx.min() >= 0 and idx.max() < n
    ax = np.abs(x)
    ref = np.argsort(-ax, kind="stable")[:k]
    # ties: the multiset of selected magnitudes must equal the reference's
    np.testing.assert_array_equal(np.sort(ax[idx]), np.sort(ax[ref]))
    # no tie at the boundary: the set itself is determined
    if 0 < k < n:
        s = np.sort(ax)[::-1]
        if s[k - 1] > s[k]:
            assert set(idx.tolist()) == set(ref.tolist())


@pytest.fixture
def sampled_path(monkeypatch):
    """Force the sample/threshold path of topk_abs on small vectors, in chunks."""
    monkeypatch.setattr(numpy_select, "SMALL_N", 0)
    monkeypatch.setattr(numpy_select, "CHUNK", 997)  # odd size: ragged last chunk
    monkeypatch.setattr(numpy_select, "_SAMPLE_MIN", 64)


# --------------------------------------------------------------------------
# topk_abs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1000, 5003])
def test_topk_random_small(n):
    for seed in range(8):
        rng = np.random.default_rng(seed)
        x = _frozen(rng.standard_normal(n).astype(np.float32))
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n} - {-1}):
            if 0 <= k <= n:
                assert_topk(x, k, nk.topk_abs(x, k, rng=seed))


@pytest.mark.parametrize("seed", range(6))
def test_topk_large_default_path(seed):
    # above SMALL_N: the sampled threshold path with default settings
    rng = np.random.default_rng(100 + seed)
    n = 100_000 + 17 * seed
    x = rng.standard_normal(n).astype(np.float32)
    if seed % 2:
        x = rng.standard_t(2.0, size=n).astype(np.float32)
    x = _frozen(x)
    for k in [1, 10, 100, 1000, 5000, 30_000]:
        assert_topk(x, k, nk.topk_abs(x, k, rng=np.random.default_rng(seed)))


@pytest.mark.parametrize("seed", range(10))
def test_topk_sampled_path_many_sizes(sampled_path, seed):
    rng = np.random.default_rng(seed)
    for n in [9, 50, 333, 2048, 10_007]:
        x = _frozen(rng.standard_normal(n).astype(np.float32) * rng.uniform(0.1, 10))
        for k in {0, 1, 2, max(1, n // 1000), max(1, n // 100), n // 10, n // 4, n - 1, n}:
            assert_topk(x, k, nk.topk_abs(x, k, rng=rng))


def test_topk_negative_values(sampled_path):
    rng = np.random.default_rng(3)
    x = -np.abs(rng.standard_normal(5000)).astype(np.float32)
    x[::7] *= -0.5
    x = _frozen(x)
    for k in [1, 10, 500, 4999]:
        idx = nk.topk_abs(x, k, rng=rng)
        assert_topk(x, k, idx)
    # the largest magnitude is negative here
    assert int(np.argmax(np.abs(x))) in set(nk.topk_abs(x, 1).tolist())


@pytest.mark.parametrize("path", ["default", "sampled"])
def test_topk_ties(request, path):
    if path == "sampled":
        request.getfixturevalue("sampled_path")
    rng = np.random.default_rng(7)
    for n in [10, 1000, 70_000]:
        # few distinct magnitudes, both signs: massive ties at every boundary
        x = _frozen(rng.integers(-3, 4, size=n).astype(np.float32))
        for k in [0, 1, n // 7, n // 2, n - 1, n]:
            assert_topk(x, k, nk.topk_abs(x, k, rng=rng))
        # all equal magnitude
        x = _frozen(np.where(rng.random(n) < 0.5, -1.5, 1.5).astype(np.float32))
        for k in [1, n // 3, n]:
            assert_topk(x, k, nk.topk_abs(x, k, rng=rng))


@pytest.mark.parametrize("path", ["default", "sampled"])
def test_topk_all_zero_and_mostly_zero(request, path):
    if path == "sampled":
        request.getfixturevalue("sampled_path")
    for n in [1, 100, 80_000]:
        x = _frozen(np.zeros(n, np.float32))
        for k in [0, 1, n // 2, n]:
            idx = nk.topk_abs(x, k)
            assert idx.size == k and np.unique(idx).size == k
        # a few nonzeros in a sea of zeros; k larger than the nonzero count
        y = np.zeros(n, np.float32)
        y[:: max(1, n // 5)] = np.arange(1, y[:: max(1, n // 5)].size + 1)
        y = _frozen(y)
        for k in sorted({1, min(n, 3), min(n, 10), n}):
            assert_topk(y, k, nk.topk_abs(y, k))


def test_topk_float64_and_other_dtypes(sampled_path):
    rng = np.random.default_rng(11)
    x64 = _frozen(rng.standard_normal(4000))
    for k in [1, 40, 400]:
        assert_topk(x64, k, nk.topk_abs(x64, k, rng=rng))
    x16 = _frozen(rng.standard_normal(4000).astype(np.float16))
    assert_topk(x16, 100, nk.topk_abs(x16, 100, rng=rng))
    xi = _frozen(rng.integers(-100, 100, size=3000))
    assert_topk(xi, 50, nk.topk_abs(xi, 50, rng=rng))


def test_topk_scratch_reuse_and_x_untouched():
    rng = np.random.default_rng(5)
    n = 120_000
    x = rng.standard_normal(n).astype(np.float32)
    x0 = x.copy()
    scratch = np.full(n, np.nan, np.float32)
    for k in [1, 100, 1200, 12_000, 60_000, n]:
        a = nk.topk_abs(x, k, scratch=scratch, rng=np.random.default_rng(1))
        b = nk.topk_abs(x, k, rng=np.random.default_rng(1))
        np.testing.assert_array_equal(np.sort(a), np.sort(b))
        assert_topk(x, k, a)
    np.testing.assert_array_equal(x, x0)


def test_topk_scratch_validation():
    x = np.ones(100, np.float32)
    with pytest.raises(ValueError):
        nk.topk_abs(x, 3, scratch=np.empty(100, np.float64))
    with pytest.raises(ValueError):
        nk.topk_abs(x, 3, scratch=np.empty(10, np.float32))
    with pytest.raises(ValueError):
        nk.topk_abs(x, 3, scratch=x)  # would overwrite x
    with pytest.raises(ValueError):
        nk.threshold_select(x, 0.5, scratch=x[::2])


def test_topk_k_out_of_range():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError):
        nk.topk_abs(x, 11)
    with pytest.raises(ValueError):
        nk.topk_abs(x, -1)
    with pytest.raises(ValueError):
        nk.topk_abs(np.ones((2, 5), np.float32), 1)


def test_topk_retry_and_fallback_paths(sampled_path, monkeypatch):
    rng = np.random.default_rng(21)
    x = _frozen(rng.standard_normal(20_000).astype(np.float32))
    # a margin far below zero puts the first threshold above the k-th value:
    # exercises the retry with a lowered threshold
    monkeypatch.setattr(numpy_select, "_MARGIN_SIGMAS", -3.0)
    monkeypatch.setattr(numpy_select, "_MARGIN_EXTRA", 0)
    for k in [5, 200, 2000]:
        assert_topk(x, k, nk.topk_abs(x, k, rng=rng))
    # no threshold pass at all: straight to the full argpartition fallback
    monkeypatch.setattr(numpy_select, "MAX_RETRIES", 0)
    for k in [5, 200, 2000]:
        assert_topk(x, k, nk.topk_abs(x, k, rng=rng))


def test_topk_rng_does_not_change_result_set():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(90_000).astype(np.float32)
    k = 900
    ref = set(np.argsort(-np.abs(x))[:k].tolist())
    for s in range(5):
        assert set(nk.topk_abs(x, k, rng=s).tolist()) == ref
    assert set(nk.topk_abs(x, k).tolist()) == ref  # rng=None


# --------------------------------------------------------------------------
# threshold_select
# --------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 1000])
def test_threshold_select_matches_reference(monkeypatch, chunk):
    if chunk:
        monkeypatch.setattr(numpy_select, "CHUNK", chunk)
    rng = np.random.default_rng(4)
    for n in [1, 5, 999, 1000, 1001, 50_000]:
        x = _frozen(rng.standard_normal(n).astype(np.float32))
        ax64 = np.abs(x).astype(np.float64)
        for t in [0.0, 1e-3, 0.5, 1.0, 2.5, 10.0, float(np.abs(x).max()), rng.uniform(0, 3)]:
            got = nk.threshold_select(x, t)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, np.flatnonzero(ax64 >= t))
            assert np.all(np.diff(got) > 0)


def test_threshold_select_zero_returns_all_and_scratch():
    rng = np.random.default_rng(8)
    x = _frozen(rng.standard_normal(30_000).astype(np.float32))
    np.testing.assert_array_equal(nk.threshold_select(x, 0), np.arange(x.size))
    np.testing.assert_array_equal(nk.threshold_select(x, -1.0), np.arange(x.size))
    scratch = np.empty_like(x)
    for t in [0.0, 1.0, 3.0]:
        np.testing.assert_array_equal(
            nk.threshold_select(x, t, scratch=scratch), nk.threshold_select(x, t)
        )
    z = np.zeros(100, np.float32)
    np.testing.assert_array_equal(nk.threshold_select(z, 0.0), np.arange(100))
    assert nk.threshold_select(z, 1e-30).size == 0
    assert nk.threshold_select(np.zeros(0, np.float32), 0.0).size == 0


def test_threshold_select_exact_float64_threshold():
    v = np.float32(0.1)
    x = np.array([v, -v, np.nextafter(v, np.float32(0)), 1.0], np.float32)
    # t just above float(v): rounds *down* to v when cast to float32, but v < t
    t_up = np.nextafter(float(v), 1.0)
    assert np.float32(t_up) == v
    np.testing.assert_array_equal(nk.threshold_select(x, t_up), [3])
    np.testing.assert_array_equal(nk.threshold_select(x, float(v)), [0, 1, 3])
    np.testing.assert_array_equal(nk.threshold_select(x, np.float32(v)), [0, 1, 3])
    assert nk.threshold_select(x, 1e300).size == 0
    assert nk.threshold_select(x, float("nan")).size == 0


def test_threshold_select_float64_input():
    rng = np.random.default_rng(9)
    x = _frozen(rng.standard_normal(10_000))
    for t in [0.0, 0.7, 2.0]:
        np.testing.assert_array_equal(nk.threshold_select(x, t), np.flatnonzero(np.abs(x) >= t))


# --------------------------------------------------------------------------
# estimate_threshold
# --------------------------------------------------------------------------


def test_estimate_threshold_close_to_kth():
    rng = np.random.default_rng(12)
    x = _frozen(rng.standard_normal(100_000).astype(np.float32))
    ax = np.sort(np.abs(x))[::-1]
    for k in [100, 1000, 5000]:
        kth = float(ax[k - 1])
        for seed in range(3):
            est = nk.estimate_threshold(x, k, sample=0.1, rng=seed)
            assert isinstance(est, float)
            assert abs(est - kth) / kth < 0.15, (k, est, kth)
        est = nk.estimate_threshold(x, k, rng=seed)  # default 1 % sample
        assert abs(est - kth) / kth < 0.3, (k, est, kth)
        # the whole vector as sample: exact
        assert nk.estimate_threshold(x, k, sample=1.0) == kth


def test_estimate_threshold_edges():
    x = np.arange(1, 101, dtype=np.float32)
    assert nk.estimate_threshold(x, 0) == float("inf")
    assert nk.estimate_threshold(x, 100, sample=1.0) == 1.0
    assert nk.estimate_threshold(x, 1, sample=1.0) == 100.0
    t = nk.estimate_threshold(x, 1, sample=0.01, rng=0)
    assert 1.0 <= t <= 100.0
    with pytest.raises(ValueError):
        nk.estimate_threshold(x, 5, sample=0.0)
    with pytest.raises(ValueError):
        nk.estimate_threshold(x, 101)
    # deterministic given the rng
    assert nk.estimate_threshold(x, 10, sample=0.3, rng=np.random.default_rng(4)) == (
        nk.estimate_threshold(x, 10, sample=0.3, rng=np.random.default_rng(4))
    )


# --------------------------------------------------------------------------
# randomk
# --------------------------------------------------------------------------


def test_randomk_properties_and_determinism():
    for n, k in [(1, 0), (1, 1), (10, 3), (10, 10), (1000, 1), (100_000, 100), (100_000, 60_000)]:
        a = nk.randomk(n, k, np.random.default_rng(42))
        b = nk.randomk(n, k, np.random.default_rng(42))
        assert a.dtype == np.int32
        assert a.size == k
        np.testing.assert_array_equal(a, b)
        if k:
            assert np.all(np.diff(a) > 0)  # sorted and distinct
            assert a[0] >= 0 and a[-1] < n
        if k == n:
            np.testing.assert_array_equal(a, np.arange(n))
    c = nk.randomk(100_000, 100, np.random.default_rng(43))
    assert not np.array_equal(c, nk.randomk(100_000, 100, np.random.default_rng(42)))
    # successive draws from one generator differ, and replay identically
    g1, g2 = np.random.default_rng(7), np.random.default_rng(7)
    s1 = [nk.randomk(5000, 50, g1) for _ in range(3)]
    s2 = [nk.randomk(5000, 50, g2) for _ in range(3)]
    for p, q in zip(s1, s2):
        np.testing.assert_array_equal(p, q)
    assert not np.array_equal(s1[0], s1[1])


def test_randomk_uniform_coverage():
    # every index is hit with roughly equal frequency
    n, k = 50, 10
    g = np.random.default_rng(0)
    counts = np.zeros(n)
    for _ in range(2000):
        counts[nk.randomk(n, k, g)] += 1
    expected = 2000 * k / n
    assert np.all(np.abs(counts - expected) < 0.25 * expected)


def test_randomk_errors():
    with pytest.raises(ValueError):
        nk.randomk(10, 11, np.random.default_rng(0))
    with pytest.raises(ValueError):
        nk.randomk(10, -1, np.random.default_rng(0))


# --------------------------------------------------------------------------
# rowwise_topk_mask
# --------------------------------------------------------------------------


def test_rowwise_topk_mask():
    rng = np.random.default_rng(13)
    for X in [
        rng.standard_normal((40, 37)).astype(np.float32),
        rng.integers(-2, 3, size=(25, 16)).astype(np.float64),  # ties
        np.zeros((3, 8), np.float32),
    ]:
        X = _frozen(X)
        rows, cols = X.shape
        for k in [0, 1, 5, cols - 1, cols]:
            m = nk.rowwise_topk_mask(X, k)
            assert m.dtype == np.bool_ and m.shape == X.shape
            np.testing.assert_array_equal(m.sum(axis=1), np.full(rows, k))
            for i in range(rows):
                ax = np.abs(X[i])
                ref = np.sort(ax)[::-1][:k]
                np.testing.assert_array_equal(np.sort(ax[m[i]])[::-1], ref)
    with pytest.raises(ValueError):
        nk.rowwise_topk_mask(np.ones((2, 3)), 4)
    with pytest.raises(ValueError):
        nk.rowwise_topk_mask(np.ones(3), 1)


def test_index_dtype():
    assert nk.index_dtype is ck.index_dtype is backend.index_dtype  # decided in one place
    assert nk.index_dtype(10) == np.int32
    assert nk.index_dtype(2**31 - 1) == np.int32
    assert nk.index_dtype(2**31) == np.int64


def test_kth_largest_matches_a_sort():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(101)
    s = np.sort(a)[::-1]
    for k in (1, 2, 50, 101):
        assert numpy_select.kth_largest(a, k) == s[k - 1]
