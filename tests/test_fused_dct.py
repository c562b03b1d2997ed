"""DCT's fused segmented threshold pass (one compiled pass, a threshold per layer) against the plain NumPy steps."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SelfComm
from mpisparse.backend import fused
from mpisparse.backend import numpy_kernels as nk
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create

needs_numba = pytest.mark.skipif(not fused.available(), reason="numba is not installed (pip install mpisparse[fast])")


def _vecs(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * s).astype(np.float32) for s in (0.3, 1.0, 1.0)]


LAYOUT = FusionLayout([("a", (300, 400)), ("b", (1000,)), ("c", (50, 30)), ("d", (7,))])


# ------------------------------------------------------------ DCT: per-layer thresholds in one pass

SEGS = ([0, 70_000, 70_000, 70_050, 150_000], [70_000, 0, 50, 79_950, 30_001])  # with an empty segment


@needs_numba
@pytest.mark.parametrize("thr", [[1.0, 0.5, 0.1, 2.0, 3.0], [0.0, np.inf, np.nan, 1.5, 10.0]])
def test_segmented_threshold_passes_are_the_per_segment_selection(thr):
    n = 180_001
    e1, g = _vecs(n, 7)[:2]
    e1[3] = np.nan
    e2 = e1.copy()
    plain = fused.compensate_segments_threshold(e1, g, *SEGS, thr, fused=False)
    fast = fused.compensate_segments_threshold(e2, g, *SEGS, thr, fused=True)
    assert np.array_equal(e1, e2, equal_nan=True) and np.array_equal(plain, fast)
    ref = np.concatenate([nk.threshold_select(e1[o:o + s], t) + o for o, s, t in zip(*SEGS, thr)])
    assert np.array_equal(fast, ref.astype(fast.dtype))
    assert np.array_equal(fused.segments_threshold(e1, *SEGS, thr, fused=True), ref)
    assert np.array_equal(fused.segments_threshold(e1, *SEGS, thr, fused=False), ref)


@needs_numba
def test_segmented_pass_beyond_its_buffer_and_with_gaps():
    n = 180_001
    x = _vecs(n, 8)[1]
    ref = nk.threshold_select(x, 0.0)  # every entry: more than the buffer holds the first time
    assert np.array_equal(fused.segments_threshold(x, [0], [n], [0.0], fused=True), ref)
    assert np.array_equal(fused.segments_threshold(x, [0], [n], [0.0], fused=True), ref)  # the grown buffer
    gap = fused.segments_threshold(x, [0, 100_000], [50_000, 80_001], [1.0, 1.0], fused=True)  # not a cover
    assert np.array_equal(gap, np.concatenate([nk.threshold_select(x[:50_000], 1.0),
                                               nk.threshold_select(x[100_000:], 1.0) + 100_000]))


@needs_numba
@pytest.mark.parametrize("lifespan", [1, 2, 1000])
def test_dct_gives_the_same_steps_fused_and_plain(lifespan, monkeypatch):
    grads = [_vecs(LAYOUT.n, seed=s)[2] for s in range(5)]

    def run(flag):
        monkeypatch.setenv("MPISPARSE_FUSED", flag)
        sch = create("dct", SelfComm(), LAYOUT, 0.01, seed=0, lifespan=lifespan)
        outs = [(sch.step(g.copy()).copy(), sch.local_count, sch.recomputed) for g in grads]
        return outs, sch.memory.residual.copy(), list(sch.recomputed_at)

    plain, fast = run("0"), run("1")
    for (a, ca, ra), (b, cb, rb) in zip(plain[0], fast[0]):
        assert np.array_equal(a, b) and ca == cb and ra == rb
    assert np.array_equal(plain[1], fast[1]) and plain[2] == fast[2]


@pytest.mark.parametrize("flag", ["0", "1"])
def test_dct_scratch_is_one_layer_long_and_reused_layer_after_layer(flag, monkeypatch):
    """The plain per-layer selection reuses one buffer as long as the largest layer (not one per element of
    the vector): the same indices as with no scratch at all."""
    n = 180_001
    x = _vecs(n, 9)[1]
    thr = [1.0, 0.5, 0.1, 2.0, 3.0]
    longest = max(SEGS[1])
    scratch = np.full(longest, np.nan, dtype=np.float32)
    assert np.array_equal(fused.segments_threshold(x, *SEGS, thr, scratch=scratch, fused=False),
                          fused.segments_threshold(x, *SEGS, thr, fused=False))
    monkeypatch.setenv("MPISPARSE_FUSED", flag)
    sch = create("dct", SelfComm(), LAYOUT, 0.01, seed=0, lifespan=2)
    for s in range(3):
        sch.step(_vecs(LAYOUT.n, seed=s)[2])
    assert sch._scratch.shape == (max(s.size for s in LAYOUT.layers),)


@needs_numba
def test_the_fused_passes_collect_each_offer_s_values_bit_for_bit():
    """``values=True``: the values collected beside the indices are ``e[indices]`` after the pass (signed, NaN
    and -0.0 kept); the plain steps return None for them; a count beyond the buffer falls back to None."""
    n = 180_001
    e, g = _vecs(n, 9)[:2]
    e[10] = np.nan
    e[11], g[11] = -5.0, 0.0  # a negative value
    thr = [1.0, 0.5, 0.1, 2.0, 3.0]
    for run in (lambda a, **kw: fused.compensate_segments_threshold(a, g, *SEGS, thr, **kw),
                lambda a, **kw: fused.compensate_threshold(a, g, 0.7, **kw)):
        e1, e2 = e.copy(), e.copy()
        idx, vals = run(e1, fused=True, values=True)
        assert np.array_equal(idx, run(e2, fused=False))
        assert vals.dtype == e1.dtype and np.array_equal(vals.view(np.int32), e1[idx].view(np.int32))
        assert np.any(vals < 0)
        assert run(e.copy(), fused=False, values=True)[1] is None
    e3 = e.copy()
    idx3, vals3 = fused.compensate_threshold(e3, g, 0.0, fused=True, values=True)  # the buffer may be too short
    assert np.array_equal(idx3, nk.threshold_select(e3, 0.0)) and idx3.size == n - 1  # NaN is never selected
    assert vals3 is None or np.array_equal(vals3.view(np.int32), e3[idx3].view(np.int32))


@needs_numba
@pytest.mark.parametrize("fresh", [False, True])  # True: a new 1024-entry buffer, too short: restored, then plain
def test_a_pass_that_clears_what_it_collects_leaves_the_error_of_the_plain_steps(fresh, monkeypatch):
    from mpisparse.backend import compiled

    n = 180_001
    e, g = _vecs(n, 10)[:2]
    thr = [1.0, 0.5, 0.1, 2.0, 3.0]
    for run in (lambda a, **kw: fused.compensate_segments_threshold(a, g, *SEGS, thr, **kw),
                lambda a, **kw: fused.compensate_threshold(a, g, 0.7, **kw)):
        if fresh:
            monkeypatch.setattr(fused, "_buffers", compiled._Buffers())
        plain, fast = e.copy(), e.copy()
        idx = run(plain, fused=False)
        before = plain[idx].copy()
        got, vals = run(fast, fused=True, values=True, clear=True)
        assert np.array_equal(got, idx) and idx.size > 1024
        if fresh:  # the buffer overflowed: nothing cleared, the values to be read from e
            assert vals is None and np.array_equal(fast.view(np.int32), plain.view(np.int32))
        else:
            plain[idx] = 0  # error feedback's update: the sent entries zeroed
            assert np.array_equal(vals.view(np.int32), before.view(np.int32))
            assert np.array_equal(fast.view(np.int32), plain.view(np.int32))
    with pytest.raises(ValueError, match="clear=True needs values=True"):
        fused.compensate_threshold(e.copy(), g, 0.7, fused=True, clear=True)
