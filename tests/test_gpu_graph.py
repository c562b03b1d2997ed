"""No fixed cost per call (mpisparse/backend/cupy_graph.py): workspaces reused, launch sequences replayed as graphs.

Under the strict fake CuPy (tests/gpu_emu/strictcupy.py) with the package's
CUDA C on the CPU emulator: while a stream captures, the emulator records
launches and fills instead of running them (a read back, an assignment or an
allocation raises), and a graph's launch replays them with the arguments
they had at capture -- device addresses and scalars -- as a real CUDA graph
does.  So these prove that a replayed call computes what a fresh one does
after the input changed in place, that a call of a known size allocates
nothing, and that a platform without capture gets the plain launches.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_emu import fakecupy, strictcupy
from mpisparse.backend import cupy_graph
from mpisparse.backend import cupy_kernels as ck
from mpisparse.backend import numpy_kernels as nk

pytestmark = pytest.mark.skipif(not fakecupy.compiler_available(),
                                reason="the CPU emulator of the CUDA kernels needs g++ (or $CXX)")

N, K = 20_000, 50


@pytest.fixture
def cp(monkeypatch):
    monkeypatch.delenv(cupy_graph.ENV, raising=False)
    return strictcupy.install(monkeypatch)


def inputs(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_t(3.0, N).astype(np.float32) for _ in range(count)]


def same_topk(x: np.ndarray, idx, k: int) -> None:
    idx = idx.get()
    assert idx.shape == (k,) and np.unique(idx).size == k
    np.testing.assert_array_equal(np.sort(np.abs(x[idx])), np.sort(np.abs(x[nk.topk_abs(x, k)])))


def test_a_replayed_call_equals_a_fresh_one_after_the_input_changes(cp, monkeypatch):
    xs = inputs(1, 4)
    d = cp.asarray(xs[0])  # one device buffer, rewritten in place as a training step's would be
    paths = []
    for x in xs:
        d.set(x)
        t = float(np.quantile(np.abs(x), 0.99))
        idx, vals = ck.threshold_select_values(d, t)
        np.testing.assert_array_equal(np.sort(idx.get()), nk.threshold_select(x, t))
        np.testing.assert_array_equal(vals.get(), x[idx.get()])
        same_topk(x, ck.topk_abs(d, K, method="sample", rng=0), K)
        paths.append(dict(cupy_graph.STATS))
    # first call plain, second captured (and launched), then replays only
    assert paths[0]["plain"] == 2 and paths[0]["captures"] == 0
    assert paths[1]["captures"] == 2
    assert paths[-1]["replays"] == 4 and paths[-1]["plain"] == 2 and paths[-1]["capture_failures"] == 0
    # the same call with capture off (fresh workspaces): the same selection as the replay
    replayed = np.sort(ck.topk_abs(d, K, method="sample", rng=0).get())
    monkeypatch.setenv(cupy_graph.ENV, "0")
    monkeypatch.setattr(cupy_graph, "_WORKSPACES", type(cupy_graph._WORKSPACES)())
    fresh = np.sort(ck.topk_abs(d, K, method="sample", rng=5).get())
    np.testing.assert_array_equal(np.abs(xs[-1][replayed]), np.abs(xs[-1][fresh]))


def test_a_new_threshold_reaches_the_replayed_pass_through_its_slot(cp):
    x = inputs(2, 1)[0]
    d = cp.asarray(x)
    for t in (2.0, 2.0, 1.8, 3.0, np.nan, 2.5, 0.0):  # replays from the 2nd call; t changes under the graph
        got = np.sort(ck.threshold_select(d, t).get())
        np.testing.assert_array_equal(got, nk.threshold_select(x, t), err_msg=f"t={t}")
    assert cupy_graph.STATS["replays"] == 5  # the last call outgrew the outputs: new ones, plain launches


def test_no_allocation_after_the_first_call_of_a_size(cp):
    xs = inputs(3, 5)
    d = cp.asarray(xs[0])
    t = float(np.quantile(np.abs(xs[0]), 0.995))
    ck.topk_abs(d, K, method="sample", rng=0, reuse=True)
    ck.threshold_select_values(d, t, reuse=True)
    fakecupy.reset_allocations()
    for x in xs[1:]:
        d.set(x)
        same_topk(x, ck.topk_abs(d, K, method="sample", rng=0, reuse=True), K)
        idx, vals = ck.threshold_select_values(d, t, reuse=True)
        np.testing.assert_array_equal(np.sort(idx.get()), nk.threshold_select(x, t))
    assert fakecupy.ALLOCS["count"] == 0, fakecupy.ALLOCS
    # the default returns a copy the caller owns: one allocation per result array, nothing else
    ck.topk_abs(d, K, method="sample", rng=0)
    ck.threshold_select_values(d, t)
    assert fakecupy.ALLOCS["count"] == 3, fakecupy.ALLOCS


def test_each_input_address_has_its_graph(cp):
    a, b = inputs(4, 2)
    da, db = cp.asarray(a), cp.asarray(b)
    for _ in range(3):
        same_topk(a, ck.topk_abs(da, K, method="sample", rng=1), K)
        same_topk(b, ck.topk_abs(db, K, method="sample", rng=1), K)
    assert cupy_graph.STATS["captures"] == 2 and cupy_graph.STATS["replays"] == 2


def test_without_capture_the_plain_launches_run_on_the_same_workspace(cp):
    fakecupy.CAPTURE["supported"] = False  # a platform without stream capture (HIP, an old driver)
    xs = inputs(5, 3)
    d = cp.asarray(xs[0])
    for x in xs:
        d.set(x)
        same_topk(x, ck.topk_abs(d, K, method="sample", rng=2), K)
    assert cupy_graph.STATS["captures"] == 0 and cupy_graph.STATS["capture_failures"] == 1
    assert cupy_graph.STATS["plain"] == 3
    assert "not supported" in cupy_graph.unsupported_reason(0)


def test_the_emulated_capture_records_and_refuses_what_a_real_one_cannot_hold(cp):
    s = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(4, dtype=np.float32)
    with s:
        s.begin_capture()
        a.fill(3.0)  # recorded, not run
        assert a.get is not None and s.is_capturing()
        for bad in (lambda: a.get(), lambda: cp.zeros(2), lambda: a.__setitem__(0, a[1])):
            with pytest.raises(RuntimeError, match="captur"):
                bad()
        g = s.end_capture()
    np.testing.assert_array_equal(a.get(), 0.0)
    g.launch(stream=s)
    np.testing.assert_array_equal(a.get(), 3.0)
    with pytest.raises(RuntimeError, match="default"):
        cp.cuda.Stream.null.begin_capture()


def test_the_fixed_cost_benchmark_runs_its_three_ways_and_checks_the_replay(cp):
    from mpisparse.bench import fixed_cost

    res = fixed_cost.run(n=8_192, density=0.002, calls=1)
    assert set(res["ms"]) == {"threshold_select", "topk_abs_sample", "topk_abs_radix2"}
    assert all(set(v) == {"plain", "graph", "graph_reuse"} for v in res["ms"].values())
    assert res["stats"]["plain"]["captures"] == 0 and res["stats"]["graph"]["replays"] > 0
    assert res["replay_equals_fresh"] and res["replays_in_check"] > 0 and res["capture_unsupported"] is None


def test_layer_norms_sum_on_the_device_and_replay(cp, monkeypatch):
    """segment_norms: tile sums, then each segment's sum on the device; one number per segment read back;
    the two launches replayed after the input changes in place; the same bits with graphs off."""
    from mpisparse.backend import cupy_segments

    rng = np.random.default_rng(6)
    sizes = np.array([3, 0, 40_000, 8_192, 1, 20_001], dtype=np.int64)  # empty, one tile, several tiles
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    xs = [rng.standard_normal(int(sizes.sum())).astype(np.float32) for _ in range(3)]
    d = cp.asarray(xs[0])
    reads = []
    real_get = cp.ndarray.get

    def counted_get(self, *a, **kw):
        reads.append(self.size)
        return real_get(self, *a, **kw)

    monkeypatch.setattr(cp.ndarray, "get", counted_get)
    replayed = []
    for x in xs:
        d.set(x)
        reads.clear()
        got = ck.segment_norms(d, starts, sizes)
        assert reads == [sizes.size]  # one read back, one float64 per segment
        want = [np.linalg.norm(x[a:a + s].astype(np.float64)) for a, s in zip(starts, sizes)]
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert got[1] == 0.0
        replayed.append(got)
    assert cupy_graph.STATS["captures"] == 1 and cupy_graph.STATS["replays"] == 1
    monkeypatch.setenv(cupy_graph.ENV, "0")
    cupy_graph.clear()
    np.testing.assert_array_equal(ck.segment_norms(d, starts, sizes), replayed[-1])  # plain launches: same bits
    assert cupy_segments.SEG_TILE == 8_192


def _kernel_launches() -> int:
    from mpisparse.backend import cupy_launch

    return sum(f._k.launches for key, f in cupy_launch._modules.items() if len(key) == 3)


def test_segmented_topk_is_one_graph_launch_per_call_with_nothing_read_back(cp):
    """segment_topk_abs: every segment of a call in one graph launch from the second call on (plain, capture,
    then replays; the emulated capture raises on a read back, an assignment or an allocation), four kernel
    launches a call (float32's three digits and the output pass), no device-to-host copy inside a call (the
    strict fake counts them), new ks replaying the same graph (one host-to-device copy of the ks), no
    allocation with ``reuse=True``; exact against the NumPy kernel on every call, the input rewritten in place."""
    from mpisparse.backend import cupy_segments

    rng = np.random.default_rng(8)
    sizes = np.array([5, 0, 30_000, 8_192, 1, 12_000, 700], dtype=np.int64)
    starts = (np.concatenate([[0], np.cumsum(sizes)[:-1]]) + np.arange(sizes.size) * 3).astype(np.int64)
    n = int(starts[-1] + sizes[-1])
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(5)]
    ks_a = np.array([2, 0, 300, 82, 1, 120, 700])
    ks_b = np.array([5, 0, 150, 200, 0, 12, 7])  # other ks, a smaller total: the same output buffer
    d = cp.asarray(xs[0])
    paths = []
    for i, (x, ks) in enumerate(zip(xs, (ks_a, ks_a, ks_b, ks_a, ks_b))):
        d.set(x)
        before, launched = dict(cupy_graph.STATS), _kernel_launches()
        strictcupy.reset_counts()
        if i == 4:
            fakecupy.reset_allocations()
        got = ck.segment_topk_abs(d, starts, sizes, ks, reuse=i == 4)
        assert strictcupy.COUNTS["d2h"] == 0, strictcupy.COUNTS
        assert strictcupy.COUNTS["h2d"] == [2, 0, 1, 1, 1][i]  # the layout's tile plan once; the ks when they change
        assert _kernel_launches() - launched == 4
        paths.append({key: v - before[key] for key, v in cupy_graph.STATS.items() if v != before[key]})
        if i == 4:
            assert fakecupy.ALLOCS["count"] == 0, fakecupy.ALLOCS
        got = got.get()
        want = nk.segment_topk_abs(x, starts, sizes, ks, rng=0)
        ends = np.cumsum(ks)
        for e, k in zip(ends, ks):
            np.testing.assert_array_equal(np.sort(got[e - k:e]), np.sort(want[e - k:e]))
    assert paths == [{"plain": 1}, {"captures": 1}, {"replays": 1}, {"replays": 1}, {"replays": 1}]
    ws = next(w for key, w in cupy_graph._WORKSPACES.items() if key[1][0] == "seg_topk")
    (graph,) = ws.graphs.values()
    assert graph.launches == 4  # captured once, launched once then, replayed three times
    # a larger total k outgrows the output: the graph holding the old one is dropped, then captured anew
    big = np.array([5, 0, 3000, 800, 1, 1200, 700])
    for i in range(3):
        got = ck.segment_topk_abs(d, starts, sizes, big)
        assert got.size == big.sum()
    assert cupy_graph.STATS["captures"] == 2 and cupy_graph.STATS["capture_failures"] == 0
    assert "segmented.cu" in ck.KERNEL_SOURCES  # compiled by tests/test_gpu_build.py with nvcc and NVRTC
    assert cupy_segments.SEG_TILE == 8_192
