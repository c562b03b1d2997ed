"""``topk_abs(method="radix2")`` (mpisparse/backend/cupy_radix.py, cuda/radix.cu) under the CPU emulator.

The real CUDA C runs on the emulator of tests/gpu_emu (blocks one after
another, so the last block to finish a pass is the last one launched; the
atomic count of finished blocks still decides it).  Exactness is checked
against the NumPy kernel (ties: any choice among equal magnitudes, exactly
``k`` distinct indices), across the paths the device state can take: the
candidate buffers read by every later pass, a bucket outgrowing them (a pass
reads ``x`` again), the early stop (a bucket holding exactly the remaining
need), ties down to the last digit, float64's six digits, int64 indices; and
under the strict fake CuPy, the workspace reuse and the replayed graph.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_emu import fakecupy, strictcupy
from gpu_emu.gpu import require_gpu
from mpisparse.backend import cupy_graph, cupy_launch, cupy_radix, cupy_select
from mpisparse.backend import cupy_kernels as ck
from mpisparse.backend import numpy_kernels as nk

needs_emu = pytest.mark.skipif(not fakecupy.compiler_available(),
                               reason="the CPU emulator of the CUDA kernels needs g++ (or $CXX)")

S_FINAL, S_SRC = 2, 3  # state slots (cuda/radix.cu)


@pytest.fixture(params=["emu", pytest.param("gpu", marks=pytest.mark.gpu)])
def cp(request, monkeypatch):
    """The emulator, or real CuPy on a CUDA device (``-m gpu``; a failure without one under MPISPARSE_TEST_GPU=1)."""
    monkeypatch.setattr(cupy_launch, "_sm_count", {})
    monkeypatch.setattr(cupy_graph, "_WORKSPACES", type(cupy_graph._WORKSPACES)())
    if request.param == "gpu":
        return require_gpu()
    if not fakecupy.compiler_available():
        pytest.skip("the CPU emulator of the CUDA kernels needs g++ (or $CXX)")
    return fakecupy.install(monkeypatch)


def check(x: np.ndarray, idx, k: int) -> None:
    idx = idx.get()
    assert idx.dtype == cupy_select.index_dtype(x.size) and idx.shape == (k,)
    assert np.unique(idx).size == k and idx.min() >= 0 and idx.max() < x.size
    np.testing.assert_array_equal(np.sort(np.abs(x[idx])), np.sort(np.abs(x[nk.topk_abs(x, k)])))


def state(d, k: int) -> np.ndarray:
    """The device state the last call of this shape left (its workspace is reused)."""
    w = cupy_launch._work(d)
    return cupy_radix._workspace(w, k, cupy_select.index_dtype(w.shape[0])).state.get()


def test_digits_cover_the_magnitude_keys():
    assert cupy_radix.digits(np.float32) == ((20, 11), (9, 11), (0, 9))
    assert cupy_radix.digits(np.float64) == ((52, 11), (41, 11), (30, 11), (19, 11), (8, 11), (0, 8))


@pytest.mark.parametrize("n,ks", [(1, [1]), (100, [1, 7, 99]), (40_000, [1, 40, 400, 12_000, 39_999])])
def test_radix2_is_exact(cp, n, ks):
    x = np.random.default_rng(n).standard_t(3.0, n).astype(np.float32)
    d = cp.asarray(x)
    for k in ks:
        check(x, ck.topk_abs(d, k, method="radix2"), k)
    np.testing.assert_array_equal(d.get(), x)


def test_the_later_passes_read_the_candidates_not_x(cp):
    n, k = 40_000, 40
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    d = cp.asarray(x)
    check(x, ck.topk_abs(d, k, method="radix2"), k)
    st = state(d, k)
    assert st[S_SRC] == 1, st[:10]  # the final pass read the candidate buffer


def test_early_stop_when_a_bucket_holds_exactly_the_need(cp):
    x = (2.0 ** np.arange(-60, 60)).astype(np.float32)  # one key per digit-0 bucket: every bucket holds 1
    np.random.default_rng(2).shuffle(x)
    d = cp.asarray(x)
    check(x, ck.topk_abs(d, 17, method="radix2"), 17)
    assert state(d, 17)[S_FINAL] == 2  # pass 1 wrote the output; passes 2 and 3 returned at once


def test_ties_float64_zeros_and_overflowing_buckets(cp, monkeypatch):
    rng = np.random.default_rng(3)
    ties = rng.integers(-3, 4, 30_001).astype(np.float32)  # 7 magnitudes: the k-th is a huge tie
    for k in (1, 9_999, 25_000):
        check(ties, ck.topk_abs(cp.asarray(ties), k, method="radix2"), k)
    x64 = rng.standard_normal(3_000)  # six digits
    for k in (1, 123, 2_999):
        check(x64, ck.topk_abs(cp.asarray(x64), k, method="radix2"), k)
    zeros = np.zeros(20_001, np.float32)
    zeros[[5, 17, 20_000]] = [1.0, -2.0, 3.0]
    check(zeros, ck.topk_abs(cp.asarray(zeros), 10, method="radix2"), 10)
    # buffers of 64 entries: a bucket outgrows them and the next pass reads x again (filtered by the prefix)
    monkeypatch.setattr(cupy_radix, "MIN_CANDIDATES", 64)
    monkeypatch.setattr(cupy_radix, "CANDIDATE_FRACTION", 10**9)
    x = rng.standard_normal(20_000).astype(np.float32)
    x[:600] = np.float32(0.75)  # a tie that survives every digit
    for k in (1, 50, 700, 19_999):
        d = cp.asarray(x)
        check(x, ck.topk_abs(d, k, method="radix2"), k)
    assert state(d, 700)[S_SRC] == 0  # the 600 equal keys never fit: the final pass read x
    monkeypatch.setattr(cupy_select, "index_dtype", lambda n: np.int64)
    got = ck.topk_abs(cp.asarray(x), 70, method="radix2").get()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(np.sort(np.abs(x[got])), np.sort(np.abs(x[nk.topk_abs(x, 70)])))


@needs_emu
def test_replayed_radix2_equals_a_fresh_call_and_allocates_nothing(monkeypatch):
    monkeypatch.delenv(cupy_graph.ENV, raising=False)
    cp = strictcupy.install(monkeypatch)
    rng = np.random.default_rng(4)
    xs = [rng.standard_t(3.0, 20_000).astype(np.float32) for _ in range(4)]
    d = cp.asarray(xs[0])
    ck.topk_abs(d, 50, method="radix2", reuse=True)
    fakecupy.reset_allocations()
    for x in xs:  # the input rewritten in place: the graph reads it at the captured address
        d.set(x)
        idx = ck.topk_abs(d, 50, method="radix2", reuse=True)
        np.testing.assert_array_equal(np.sort(np.abs(x[idx.get()])), np.sort(np.abs(x[nk.topk_abs(x, 50)])))
    assert fakecupy.ALLOCS["count"] == 0, fakecupy.ALLOCS
    assert cupy_graph.STATS["captures"] == 1 and cupy_graph.STATS["replays"] == 3
    assert cupy_graph.STATS["capture_failures"] == 0


def test_random_small_cases_nan_inf_denormals_float16(cp, monkeypatch):
    """Many small inputs of awkward values (NaN ranks largest, inf, denormals, -0.0, float16 widened), small
    candidate buffers in half of them: exact every time."""
    rng = np.random.default_rng(7)
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-42, 1.0, -1.0, 3.5], np.float32)
    for case in range(24):
        if case % 2:
            monkeypatch.setattr(cupy_radix, "MIN_CANDIDATES", int(rng.integers(1, 40)))
            monkeypatch.setattr(cupy_radix, "CANDIDATE_FRACTION", 10**9)
        else:
            monkeypatch.setattr(cupy_radix, "MIN_CANDIDATES", 4096)
            monkeypatch.setattr(cupy_radix, "CANDIDATE_FRACTION", 8)
        n = int(rng.integers(2, 3_000))
        x = rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.integers(-30, 30))
        mask = rng.random(n) < rng.random()
        x[mask] = rng.choice(pool, int(mask.sum()))
        k = int(rng.integers(1, n))
        with np.errstate(over="ignore"):  # float16: large magnitudes become inf, on purpose
            d = cp.asarray(x.astype(np.float16) if case % 6 == 5 else x)
        want_x = d.get().astype(np.float32) if case % 6 == 5 else x
        got = ck.topk_abs(d, k, method="radix2").get()
        assert got.shape == (k,) and np.unique(got).size == k, (case, n, k)
        np.testing.assert_array_equal(np.sort(np.abs(want_x[got])), np.sort(np.abs(want_x[nk.topk_abs(want_x, k)])),
                                      err_msg=f"case {case}: n={n} k={k}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_aligned_and_misaligned_inputs_take_the_vector_and_scalar_loads(cp, dtype):
    x = np.random.default_rng(9).standard_normal(9_003).astype(dtype)
    d = cp.asarray(x)
    for off in (0, 1, 3):  # off 0: 16-byte loads and block 0's tail; 1 and 3: a view off the 16-byte grid
        view, want = d[off:], x[off:]
        for k in (1, 90, 4_000):
            check(want, ck.topk_abs(view, k, method="radix2"), k)
