"""DGC's fused momentum pass (``u = m u + g; v += u`` and the candidates of ``|v|``) against the plain NumPy steps."""

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


@needs_numba
@pytest.mark.parametrize("m", [0.9, 0.0, 0.37])
@pytest.mark.parametrize("t", [0.0, 2.5, float("nan")])
def test_momentum_pass_is_the_numpy_steps(m, t):
    n = 200_003
    u1, v1, g = _vecs(n, 5)
    u1[7] = np.nan
    u2, v2 = u1.copy(), v1.copy()
    u1 *= m  # the scheme's plain memory: a Python float momentum
    u1 += g
    v1 += u1
    got = fused.compensate_momentum(u2, v2, g, m, t, n, fused=True)
    assert np.array_equal(u1, u2, equal_nan=True) and np.array_equal(v1, v2, equal_nan=True)  # bit for bit
    assert np.array_equal(got, nk.threshold_select(v1, t))
    u3, v3 = u2.copy(), v2.copy()
    assert fused.compensate_momentum(u3, v3, g, m, 0.0, 10, fused=True) is None  # more than the buffer holds
    u2 *= np.float32(m)
    u2 += g
    v2 += u2
    assert np.array_equal(u2, u3, equal_nan=True) and np.array_equal(v2, v3, equal_nan=True)


@needs_numba
def test_momentum_pass_fills_its_buffer_exactly_and_counts_past_it():
    """The hits collected by bit in each block: a buffer of exactly the hits holds them all, ascending and
    with their ``|v|``; one slot fewer gives None (the count goes on past the buffer)."""
    n = 100_000 + 17  # a tail after the last whole block
    u, v, g = _vecs(n, 9)
    v[[0, 31, 32, 63, n - 1]] = 50.0  # first and last of a block, and the tail
    ref_u = u * np.float32(0.9) + g
    want = nk.threshold_select(v + ref_u, 2.0)
    for cap, ok in ((want.size, True), (want.size - 1, False)):
        u1, v1 = u.copy(), v.copy()
        got = fused.compensate_momentum(u1, v1, g, 0.9, 2.0, cap, with_values=True, fused=True)
        if ok:
            assert np.array_equal(got[0], want) and np.array_equal(got[1], np.abs(v1[want]))
        else:
            assert got is None
    assert {0, 31, 32, 63, n - 1} <= set(want.tolist())


def test_momentum_plain_path_without_the_compiled_loop():
    u, v, g = _vecs(1000, 1)
    ref_u = u * np.float32(0.5) + g
    ref_v = v + ref_u
    assert fused.compensate_momentum(u, v, g, 0.5, 1.0, 10, fused=False) is None
    assert np.array_equal(u, ref_u) and np.array_equal(v, ref_v)


@pytest.mark.parametrize("t_known,t", [(1.0, 2.0), (2.0, 2.0), (2.0, 1.0), (1.0, float("nan")), (float("inf"), 3.0)])
def test_narrow_is_threshold_select_or_none(t_known, t):
    x = _vecs(100_000, 2)[1]
    got = fused.narrow(x, nk.threshold_select(x, t_known), t_known, t)
    known = nk.threshold_select(x, t_known)
    with_values = fused.narrow(x, known, t_known, t, np.abs(x[known]))
    if t_known <= t:
        assert np.array_equal(got, nk.threshold_select(x, t)) and np.array_equal(with_values, got)
    else:
        assert got is None and with_values is None
    assert fused.narrow(x, None, 1.0, 2.0) is None


LAYOUT = FusionLayout([("a", (300, 400)), ("b", (1000,)), ("c", (50, 30)), ("d", (7,))])


@needs_numba
@pytest.mark.parametrize("opts,density", [({}, 0.01), ({"clip_norm": 1.0, "momentum": 0.5}, 0.003),
                                          ({"density_warmup_iters": 3}, 0.01), ({"sample_fraction": 0.5}, 0.2),
                                          ({}, 1.0)])
def test_dgc_gives_the_same_steps_fused_and_plain(opts, density, monkeypatch):
    grads = [_vecs(LAYOUT.n, seed=s)[2] for s in range(5)]
    grads[3][::3] *= 40  # a jump in the gradients: the threshold of the sample misses, the band adjusts

    def run(flag):
        monkeypatch.setenv("MPISPARSE_FUSED", flag)
        sch = create("dgc", SelfComm(), LAYOUT, density, seed=0, **opts)
        outs, paths = [], []
        for g in grads:
            outs.append(sch.step(g.copy()).copy())
            paths.append(sch._last.path)
        return outs, paths, sch.memory.u.copy(), sch.memory.v.copy()

    plain, fast = run("0"), run("1")
    for a, b in zip(plain[0], fast[0]):
        assert np.array_equal(a, b)
    assert plain[1] == fast[1]
    assert np.array_equal(plain[2], fast[2]) and np.array_equal(plain[3], fast[3])


@pytest.mark.parametrize("t,path", [(0.5, "trim"), (2.5, "accept"), (3.5, "trim"), (100.0, "topk")])
def test_refine_selection_from_known_candidates_is_the_plain_refinement(t, path):
    from mpisparse.schemes.dgc import refine_selection

    v = _vecs(50_000, 4)[1]
    a = refine_selection(v, 600, t, rng=np.random.default_rng(1))
    b = refine_selection(v, 600, t, rng=np.random.default_rng(1), first=nk.threshold_select(v, t))
    assert a.path == path and (a.lowerings > 0) == (t > 3)
    assert (a.path, a.threshold, a.candidates, a.lowerings) == (b.path, b.threshold, b.candidates, b.lowerings)
    assert np.array_equal(a.indices, b.indices)


@pytest.mark.parametrize("n,m", [(1000, 1), (1000, 7), (1000, 999), (1000, 1000), (25_557_032, 255_570)])
def test_stratum_positions_one_per_stratum(n, m):
    from mpisparse.backend.compiled import stratum_positions

    pos = stratum_positions(12345, n, m)
    bounds = np.arange(m + 1, dtype=np.int64) * n // m
    assert pos.shape == (m,) and np.all(pos >= bounds[:-1]) and np.all(pos < bounds[1:])
    assert np.array_equal(pos, stratum_positions(12345, n, m))  # a pure function of the key
    if m < n:
        assert not np.array_equal(pos, stratum_positions(12346, n, m))
        off = (pos - bounds[:-1] + 0.5) / (bounds[1:] - bounds[:-1])
        assert m < 100 or 0.4 < off.mean() < 0.6  # spread over the strata, not at their starts


@needs_numba
@pytest.mark.parametrize("m", [1, 13, 6250, 200_003])
@pytest.mark.parametrize("key", [0, 2**64 - 1, 987654321])
def test_momentum_pass_reads_the_sample_the_plain_steps_read(m, key):
    n = 200_003
    u1, v1, g = _vecs(n, 6)
    u1[11] = np.nan
    u2, v2 = u1.copy(), v1.copy()
    s1, s2 = np.full(m, -1, np.float32), np.full(m, -1, np.float32)
    assert fused.compensate_momentum(u1, v1, g, 0.9, 2.0, n, key=key, samples=s1, fused=False) is None
    got = fused.compensate_momentum(u2, v2, g, 0.9, 2.0, n, key=key, samples=s2, fused=True)
    assert np.array_equal(u1, u2, equal_nan=True) and np.array_equal(v1, v2, equal_nan=True)
    assert np.array_equal(got, nk.threshold_select(v1, 2.0))
    u3, v3 = u1.copy(), v1.copy()
    idx, vals = fused.compensate_momentum(u3, v3, g, 0.9, 2.0, n, key=key, with_values=True, fused=True)
    assert np.array_equal(idx, nk.threshold_select(v3, 2.0)) and np.array_equal(vals, np.abs(v3[idx]))
    from mpisparse.backend.compiled import stratum_positions

    want = np.abs(v1[stratum_positions(key, n, m)])
    assert np.array_equal(s1, want, equal_nan=True) and np.array_equal(s2, want, equal_nan=True)
    with pytest.raises(ValueError, match="samples"):
        fused.compensate_momentum(u2, v2, g, 0.9, 2.0, n, samples=np.empty(m, np.float64))


@pytest.mark.parametrize("hint", [0.0, 0.5, 2.0, 3.0, 50.0, float("inf"), float("nan")])
@pytest.mark.parametrize("k", [1, 100, 2000])
def test_sampled_threshold_hint_never_changes_it(hint, k):
    from mpisparse.schemes.dgc import sampled_threshold

    s = np.abs(_vecs(20_000, 7)[1])
    want = sampled_threshold(s, k, 200_000)
    ks = max(1, round(k * 20_000 / 200_000))
    assert want == np.sort(s)[-ks]
    assert sampled_threshold(s, k, 200_000, hint) == want
    s[[3, 9]] = np.nan  # NaN sorts above everything, with or without the hint
    want = np.partition(s, s.size - ks)[s.size - ks]
    assert (ks <= 2) == np.isnan(want)
    assert np.array_equal(sampled_threshold(s, k, 200_000, hint), want, equal_nan=True)


def test_dgc_select_on_the_host_samples_one_entry_per_stratum():
    from mpisparse.backend.compiled import stratum_positions
    from mpisparse.schemes import dgc

    v = _vecs(100_000, 8)[1]
    rng = dgc.sampler(1, 0, 4)
    key = dgc.sample_key(dgc.sampler(1, 0, 4))
    samples = np.abs(v[stratum_positions(key, v.size, dgc.sample_size(v.size, 0.01))])
    a = dgc.dgc_select(v, 300, rng, 0.01)
    assert a.sampled == dgc.sampled_threshold(samples, 300, v.size)
    rng2 = dgc.sampler(1, 0, 4)
    dgc.sample_key(rng2)  # the caller draws the key, as the scheme's fused pass does
    b = dgc.dgc_select(v, 300, rng2, 0.01, samples=samples, hint=a.sampled * 0.9)
    assert (a.path, a.sampled, a.candidates) == (b.path, b.sampled, b.candidates)
    assert np.array_equal(a.indices, b.indices)
