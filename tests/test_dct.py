"""Unit tests of DCT-DP's pure functions (Gupta et al., Alg. 1, Sec. 2.2) and its schedule, no MPI."""

import math

import numpy as np
import pytest

from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create
from mpisparse.schemes.dct import (DCT, laplace_fit_threshold, laplace_threshold, layer_rank,
                                   recompute_due, topk_threshold)


class OneRank:
    """The communicator calls SparseGatherScheme makes, for a world of one (no MPI)."""

    size, rank = 1, 0

    def allgatherv(self, x, counts=None):
        return x.copy(), np.array([x.size])


LAYOUT = FusionLayout([("a", (40, 10)), ("b", (250,)), ("c", (3,)), ("empty", (0,))])


# ------------------------------------------------------------ Alg. 1 pieces
def test_layer_rank_is_floor_at_least_one():
    assert layer_rank(1000, 0.01) == 10
    assert layer_rank(1000, 0.0109) == 10  # floor, not round
    assert layer_rank(100, 0.29) == 29  # 0.29 * 100 = 28.999... in floats
    assert layer_rank(3, 0.01) == 1
    assert layer_rank(7, 1.0) == 7
    assert layer_rank(0, 0.5) == 0
    with pytest.raises(ValueError, match="density"):
        layer_rank(10, 0.0)
    with pytest.raises(ValueError, match="layer size"):
        layer_rank(-1, 0.5)


def test_recompute_schedule():
    assert [t for t in range(10) if recompute_due(t, 3)] == [0, 3, 6, 9]
    assert all(recompute_due(t, 1) for t in range(5))
    assert [t for t in range(3000) if recompute_due(t, 1000)] == [0, 1000, 2000]
    with pytest.raises(ValueError, match="lifespan"):
        recompute_due(3, 0)


def test_topk_threshold_is_kth_largest_magnitude():
    x = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    srt = np.sort(np.abs(x))[::-1]
    for k in (1, 7, 50, 4999, 5000):
        tau = topk_threshold(x, k)
        assert tau == srt[k - 1]
        assert np.count_nonzero(np.abs(x) >= tau) == k
    assert topk_threshold(x, 0) == math.inf


# --------------------------------------------------------- Laplace estimate
@pytest.mark.parametrize("mu,b", [(0.0, 1.0), (0.3, 1.5), (-2.0, 0.5)])
@pytest.mark.parametrize("p", [0.5, 0.25, 0.05, 0.01])
def test_laplace_fit_keeps_target_fraction(mu, b, p):
    x = np.random.default_rng(5).laplace(mu, b, size=2_000_000)
    tau = laplace_fit_threshold(x, p)
    kept = np.count_nonzero(np.abs(x) >= tau) / x.size
    assert kept == pytest.approx(p, rel=0.03)
    tau1 = laplace_fit_threshold(x, p, two_sided=False)  # the paper's literal P(R >= tau) = p
    assert np.count_nonzero(x >= tau1) / x.size == pytest.approx(p, rel=0.03)


def test_laplace_threshold_large_kept_fraction_below_mean():
    # |mu| >> b: the kept fraction above 1/2 needs tau < |mu| (the asinh branch)
    x = np.random.default_rng(6).laplace(3.0, 1.0, size=1_000_000)
    for p in (0.7, 0.9, 0.99):
        tau = laplace_fit_threshold(x, p)
        assert tau < 3.0
        assert np.count_nonzero(np.abs(x) >= tau) / x.size == pytest.approx(p, rel=0.01)


def test_laplace_threshold_closed_forms_and_edges():
    # zero mean: P(|R| >= tau) = exp(-tau / b)
    assert laplace_threshold(0.0, 2.0, 0.1) == pytest.approx(-math.log(0.1))
    assert laplace_threshold(0.0, 2.0, 1.0) == 0.0
    assert laplace_threshold(0.5, 2.0, 1.0, two_sided=False) == -math.inf
    assert laplace_threshold(0.5, 0.0, 0.3) == 0.5
    assert laplace_threshold(-0.5, 0.0, 0.3) == 0.5
    # the two branches meet continuously at tau = |mu|
    mu, var = 1.0, 0.5
    b = math.sqrt(var / 2)
    p0 = 0.5 * (1 + math.exp(-2 * mu / b))
    assert laplace_threshold(mu, var, p0) == pytest.approx(mu)
    assert laplace_threshold(mu, var, p0 + 1e-9) == pytest.approx(mu, abs=1e-6)
    assert laplace_threshold(1000.0, 1e-4, 0.8) == pytest.approx(1000.0 + math.sqrt(5e-5) * math.log(0.4))
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="kept_fraction"):
            laplace_threshold(0.0, 1.0, bad)
    with pytest.raises(ValueError, match="variance"):
        laplace_threshold(0.0, -1.0, 0.5)
    with pytest.raises(ValueError, match="empty"):
        laplace_fit_threshold(np.empty(0), 0.5)


# -------------------------------------------------------------- the scheme
def test_lifespan_validation():
    with pytest.raises(ValueError, match=r"--lifespan is 0; allowed range is \[1, inf\]"):
        DCT.validate_options({"lifespan": 0})
    assert DCT.validate_options({})["lifespan"] == 1000


def test_schedule_and_reference_one_rank():
    g = [np.random.default_rng([9, t]).standard_normal(LAYOUT.n).astype(np.float32) for t in range(7)]
    sch = create("dct", OneRank(), LAYOUT, 0.05, lifespan=3)
    resid = np.zeros(LAYOUT.n, np.float32)
    taus = None
    flags = []
    for t in range(7):
        out = sch.step(g[t].copy())
        flags.append(sch.recomputed)
        acc = resid + g[t]
        if t % 3 == 0:
            taus = [np.sort(np.abs(LAYOUT.view(acc, i)))[::-1][max(1, int(0.05 * s.size)) - 1]
                    for i, s in enumerate(LAYOUT.layers[:3])]
        mask = np.zeros(LAYOUT.n, bool)
        for i in range(3):
            LAYOUT.view(mask, i)[...] = np.abs(LAYOUT.view(acc, i)) >= taus[i]
        np.testing.assert_array_equal(out, np.where(mask, acc, 0))
        assert sch.taus[:3] == [float(x) for x in taus]
        resid = np.where(mask, 0, acc).astype(np.float32)
        np.testing.assert_array_equal(sch.memory.residual, resid)
        assert sch.selected_global() == np.count_nonzero(mask)
    assert flags == [t % 3 == 0 for t in range(7)]
    assert sch.recomputed_at == [0, 3, 6]


def test_state_round_trip_keeps_thresholds():
    g = np.random.default_rng(2).standard_normal(LAYOUT.n).astype(np.float32)
    a = create("dct", OneRank(), LAYOUT, 0.1, lifespan=4)
    for _ in range(2):
        a.step(g.copy())
    b = create("dct", OneRank(), LAYOUT, 0.1, lifespan=4)
    b.load_state_dict(a.state_dict())
    assert b.taus == a.taus and b.iteration == 2 and b.recomputed_at == [0]
    np.testing.assert_array_equal(b.step(g.copy()), a.step(g.copy()))
    assert not b.recomputed


def test_density_one_sends_everything_at_recompute_steps():
    g = np.random.default_rng(3).standard_normal(LAYOUT.n).astype(np.float32)
    sch = create("dct", OneRank(), LAYOUT, 1.0, lifespan=2)
    np.testing.assert_array_equal(sch.step(g.copy()), g)
    assert not np.any(sch.memory.residual)
