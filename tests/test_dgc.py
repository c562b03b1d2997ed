"""Unit tests (one process, no MPI) of DGC's pure functions and its memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpisparse.schemes import SCHEMES, scheme_class
from mpisparse.schemes import dgc


# ------------------------------------------------------------ adjust rule


@pytest.mark.parametrize("count, action", [(0, "lower"), (79, "lower"), (80, "accept"), (100, "accept"),
                                           (130, "accept"), (131, "trim"), (10_000, "trim")])
def test_adjust_rule_bands(count, action):
    assert dgc.adjust_rule(count, 100) == action


def test_adjust_rule_k1():
    assert dgc.adjust_rule(0, 1) == "lower"
    assert dgc.adjust_rule(1, 1) == "accept"
    assert dgc.adjust_rule(2, 1) == "trim"


def _upper_set(v, idx):
    """The selected entries are the largest |v| (every unselected one is not larger)."""
    a = np.abs(v)
    mask = np.zeros(v.size, bool)
    mask[idx] = True
    if mask.all() or not mask.any():
        return True
    return a[mask].min() >= a[~mask].max()


def _vec(n=10_000, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_refine_accepts_a_threshold_within_band():
    v = _vec()
    k = 100
    t = float(np.sort(np.abs(v))[::-1][109])  # the 110th largest: 110 candidates
    s = dgc.refine_selection(v, k, t)
    assert s.path == "accept" and s.lowerings == 0
    assert s.indices.size == 110 and s.candidates == 110
    assert _upper_set(v, s.indices)


def test_refine_trims_too_many_candidates_to_exact_topk():
    v = _vec()
    k = 100
    t = float(np.sort(np.abs(v))[::-1][999])  # 1000 candidates > 1.3 k
    s = dgc.refine_selection(v, k, t, rng=np.random.default_rng(1))
    assert s.path == "trim" and s.candidates == 1000
    assert s.indices.size == k and np.unique(s.indices).size == k
    assert s.indices.dtype == np.int32
    np.testing.assert_array_equal(np.sort(s.indices), np.sort(np.argsort(-np.abs(v))[:k]))


def test_refine_lowers_a_threshold_that_selects_too_few():
    v = _vec()
    k = 100
    a = np.sort(np.abs(v))[::-1]
    t = float(a[29])  # 30 candidates < 0.8 k
    s = dgc.refine_selection(v, k, t)
    assert s.lowerings >= 1 and s.path in ("accept", "trim")
    assert math.isclose(s.threshold, t * dgc.LOWERING_FACTOR ** s.lowerings)
    # each lowering halves the threshold until the count reaches the band
    for j in range(s.lowerings):
        assert np.count_nonzero(np.abs(v) >= np.float32(t * 0.5 ** j)) < dgc.LOWER * k
    assert dgc.LOWER * k <= s.indices.size <= dgc.UPPER * k
    assert _upper_set(v, s.indices)


def test_refine_falls_back_to_exact_topk():
    v = _vec()
    k = 100
    # far above max |v|: 4 halvings cannot reach the band
    s = dgc.refine_selection(v, k, 1e6)
    assert s.path == "topk" and s.lowerings == dgc.MAX_LOWERINGS
    np.testing.assert_array_equal(np.sort(s.indices), np.sort(np.argsort(-np.abs(v))[:k]))
    s = dgc.refine_selection(v, k, float("nan"))
    assert s.path == "topk" and s.indices.size == k


def test_refine_zero_threshold_and_all():
    v = _vec(1000)
    s = dgc.refine_selection(v, 10, 0.0)  # every entry is a candidate: trimmed to the top 10
    assert s.path == "trim" and s.indices.size == 10 and _upper_set(v, s.indices)
    s = dgc.refine_selection(v, 1000, 5.0)
    assert s.path == "all"
    np.testing.assert_array_equal(s.indices, np.arange(1000))


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 1.0])
@pytest.mark.parametrize("k", [1, 37, 500])
def test_dgc_select_count_band_and_determinism(fraction, k):
    v = np.random.default_rng(k).standard_t(3, 50_000).astype(np.float32)
    s1 = dgc.dgc_select(v, k, dgc.sampler(3, 1, 7), fraction)
    s2 = dgc.dgc_select(v, k, dgc.sampler(3, 1, 7), fraction, scratch=np.empty_like(v))
    np.testing.assert_array_equal(s1.indices, s2.indices)  # same (seed, rank, iteration): same set
    c = s1.indices.size
    assert c == k or dgc.LOWER * k <= c <= dgc.UPPER * k
    assert np.unique(s1.indices).size == c
    assert _upper_set(v, s1.indices)
    if fraction == 1.0:  # the whole vector is the sample: the exact k-th largest
        assert c == k


def test_sampler_depends_on_seed_rank_iteration():
    draw = lambda *a: dgc.sampler(*a).integers(0, 1 << 30, 4).tolist()
    assert draw(0, 1, 2) == draw(0, 1, 2)
    assert len({tuple(draw(*a)) for a in [(0, 1, 2), (1, 1, 2), (0, 0, 2), (0, 1, 3)]}) == 4


# --------------------------------------------------- momentum correction


def test_momentum_correction_hand_worked_example():
    """m = 0.5, five entries, k = 2, 2, 1; all numbers dyadic, so exact in float32."""
    mem = dgc.MomentumCorrectionMemory(0.5)
    f = lambda *x: np.array(x, dtype=np.float32)

    # step 1: u = g = v = [1, -2, 3, .5, -4]; top-2 of |v| = {2, 4}
    v = mem.compensate(f(1, -2, 3, 0.5, -4))
    np.testing.assert_array_equal(v, f(1, -2, 3, 0.5, -4))
    idx = np.argsort(-np.abs(v))[:2]
    assert sorted(idx.tolist()) == [2, 4]
    np.testing.assert_array_equal(v[np.sort(idx)], f(3, -4))  # what is sent
    mem.update(v, idx)
    np.testing.assert_array_equal(mem.u, f(1, -2, 0, 0.5, 0))  # masked momentum
    np.testing.assert_array_equal(mem.v, f(1, -2, 0, 0.5, 0))

    # step 2: u = .5 u + g = [2.5, 0, -1, .75, 2.5]; v = v + u = [3.5, -2, -1, 1.25, 2.5]
    v = mem.compensate(f(2, 1, -1, 0.5, 2.5))
    np.testing.assert_array_equal(mem.u, f(2.5, 0, -1, 0.75, 2.5))
    np.testing.assert_array_equal(v, f(3.5, -2, -1, 1.25, 2.5))
    idx = np.argsort(-np.abs(v))[:2]
    assert sorted(idx.tolist()) == [0, 4]
    mem.update(v, idx)
    np.testing.assert_array_equal(mem.u, f(0, 0, -1, 0.75, 0))
    np.testing.assert_array_equal(mem.v, f(0, -2, -1, 1.25, 0))

    # step 3, zero gradient: u = [0, 0, -.5, .375, 0]; v = [0, -2, -1.5, 1.625, 0]; top-1 = {1}
    v = mem.compensate(f(0, 0, 0, 0, 0))
    np.testing.assert_array_equal(mem.u, f(0, 0, -0.5, 0.375, 0))
    np.testing.assert_array_equal(v, f(0, -2, -1.5, 1.625, 0))
    mem.update(v, np.array([1]))
    np.testing.assert_array_equal(mem.v, f(0, 0, -1.5, 1.625, 0))
    assert mem.residual is mem.v


def test_memory_everything_sent_and_state_round_trip():
    mem = dgc.MomentumCorrectionMemory(0.9)
    g = np.arange(5, dtype=np.float32)
    mem.update(mem.compensate(g), None)
    assert not mem.u.any() and not mem.v.any()
    mem.compensate(g)
    mem.update(mem.v, np.array([0, 1]))
    st = mem.state_dict()
    other = dgc.MomentumCorrectionMemory(0.9)
    other.load_state_dict(st)
    np.testing.assert_array_equal(other.u, mem.u)
    np.testing.assert_array_equal(other.v, mem.v)
    assert other.u is not mem.u
    mem.reset()
    assert mem.u is None and mem.v is None


def test_memory_without_accumulation_keeps_momentum_drops_unsent():
    mem = dgc.MomentumCorrectionMemory(0.5, accumulate=False)
    f = lambda *x: np.array(x, dtype=np.float32)
    v = mem.compensate(f(1, 2))
    mem.update(v, np.array([1]))
    v = mem.compensate(f(1, 2))
    np.testing.assert_array_equal(v, f(1.5, 3))  # u = .5 u + g, nothing masked, nothing accumulated
    assert mem.residual is None


def test_memory_rejects_bad_momentum():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        dgc.MomentumCorrectionMemory(1.0)


# ---------------------------------------------------------------- clipping


def test_clip_scale():
    assert dgc.clip_scale(10.0, 4.0, 4) == pytest.approx(0.2)  # limit 4 / sqrt(4) = 2
    assert dgc.clip_scale(1.5, 4.0, 4) == 1.0  # within the limit
    assert dgc.clip_scale(10.0, 0.0, 4) == 1.0  # off
    assert dgc.clip_scale(0.0, 4.0, 4) == 1.0
    assert dgc.clip_scale(float("inf"), 4.0, 4) == 1.0
    assert dgc.clip_scale(9.0, 3.0, 1) == pytest.approx(1 / 3)
    g = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    s = dgc.clip_scale(float(np.linalg.norm(g)), 1.0, 9)
    assert np.linalg.norm(g * s) == pytest.approx(1 / 3, rel=1e-6)


# ----------------------------------------------------------------- warm-up


def test_warmup_matches_the_papers_four_epoch_schedule():
    target = 0.25 ** 5  # ~0.001, the paper's final density
    got = [dgc.warmup_density(t, target, 4) for t in range(7)]
    want = [0.25, 0.0625, 0.015625, 0.00390625, target, target, target]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_warmup_formula_and_limits():
    d, T = 0.01, 10
    for t in range(T):
        assert dgc.warmup_density(t, d, T) == pytest.approx(0.25 * (d / 0.25) ** (t / T))
    seq = [dgc.warmup_density(t, d, T) for t in range(2 * T)]
    assert all(a >= b for a, b in zip(seq, seq[1:]))  # non-increasing
    assert seq[0] == 0.25 and seq[T] == d and min(seq) == d
    assert dgc.warmup_density(0, d, 0) == d  # off
    assert dgc.warmup_density(0, 0.5, 10) == 0.5  # a target above 0.25 is used as is


# ---------------------------------------------------------------- options


def test_registered_with_momentum_flag():
    assert SCHEMES["dgc"] is dgc.DGC
    assert dgc.DGC.provides_momentum is True


def test_option_defaults():
    opts = scheme_class("dgc").validate_options({})
    assert opts == {"sample_fraction": 0.01, "momentum": 0.9, "clip_norm": 0.0, "density_warmup_iters": 0,
                    "wire_dtype": "float32"}


@pytest.mark.parametrize("name, value, pattern", [
    ("momentum", 1.0, r"--momentum is 1.0; allowed range is \[0, 1\)"),
    ("momentum", -0.1, r"--momentum is -0.1; allowed range is \[0, 1\)"),
    ("momentum", float("nan"), r"--momentum is nan; allowed range is \[0, 1\)"),
    ("momentum", "x", r"--momentum must be a float"),
    ("sample_fraction", 0.0, r"--sample-fraction is 0.0; allowed range is \(0, 1\]"),
    ("sample_fraction", 1.5, r"--sample-fraction"),
    ("clip_norm", -1.0, r"--clip-norm is -1.0; allowed range is \[0, inf\]"),
    ("density_warmup_iters", -1, r"--density-warmup-iters is -1; allowed range is \[0, inf\]"),
])
def test_invalid_options_raise(name, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        scheme_class("dgc").validate_options({name: value})
