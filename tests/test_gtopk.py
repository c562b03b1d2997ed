"""Unit tests of gTop-k's pure functions (merge, keep-top-k, schedule, bytes), no MPI."""

import numpy as np
import pytest

from mpisparse.backend import compiled
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create
from mpisparse.schemes.gtopk import (doubling_schedule, gtopk_bytes, in_sorted, keep_topk,
                                     largest_power_of_two, merge_sets, merge_topk)


def as_set(idx, vals):
    return np.asarray(idx, np.int32), np.asarray(vals, np.float32)


def dict_merge_topk(a: dict, b: dict, k: int) -> dict:
    """Plain-dict reference: sum equal indices in float32, keep k by (-|v|, index)."""
    d = dict(a)
    for i, v in b.items():
        d[i] = np.float32(d[i] + v) if i in d else np.float32(v)
    return dict(sorted(d.items(), key=lambda iv: (-abs(float(iv[1])), iv[0]))[:k])


def test_largest_power_of_two():
    assert [largest_power_of_two(w) for w in range(1, 10)] == [1, 2, 2, 4, 4, 4, 4, 8, 8]
    with pytest.raises(ValueError, match="world size"):
        largest_power_of_two(0)


def test_keep_topk_ties_go_to_smaller_index():
    idx, vals = as_set([1, 4, 6, 9, 12], [1.0, -3.0, 2.0, -2.0, 2.0])
    i, v = keep_topk(idx, vals, 3)
    assert i.tolist() == [4, 6, 9] and v.tolist() == [-3.0, 2.0, -2.0]
    i, v = keep_topk(idx, vals, 2)
    assert i.tolist() == [4, 6]
    assert keep_topk(idx, vals, 5)[0].tolist() == idx.tolist()
    assert keep_topk(idx, vals, 0)[0].size == 0


def test_merge_sets_sums_equal_indices_sorted():
    i, v = merge_sets(*as_set([2, 5, 7], [1.0, 2.0, 3.0]), *as_set([0, 5, 8], [4.0, -2.5, 1.0]))
    assert i.tolist() == [0, 2, 5, 7, 8]
    assert v.tolist() == [4.0, 1.0, -0.5, 3.0, 1.0]
    i, v = merge_sets(*as_set([], []), *as_set([3], [1.0]))
    assert i.tolist() == [3] and v.tolist() == [1.0]


@pytest.mark.parametrize("seed", range(20))
def test_merge_topk_matches_dict_reference_and_is_symmetric(seed):
    rng = np.random.default_rng(seed)
    n, k = 60, 12
    # few distinct magnitudes: many ties and many shared indices
    sets = []
    for _ in range(2):
        idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int32)
        sets.append((idx, rng.integers(-4, 5, k).astype(np.float32) / 2))
    i1, v1 = merge_topk(*sets[0], *sets[1], k)
    i2, v2 = merge_topk(*sets[1], *sets[0], k)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(v1, v2)
    ref = dict_merge_topk(dict(zip(sets[0][0].tolist(), sets[0][1])), dict(zip(sets[1][0].tolist(), sets[1][1])), k)
    assert i1.tolist() == sorted(ref)
    assert v1.tolist() == [float(ref[i]) for i in sorted(ref)]
    assert i1.size == k and np.all(np.diff(i1) > 0)


@pytest.mark.parametrize("world", range(1, 10))
def test_schedule_pairs_match(world):
    scheds = [doubling_schedule(r, world) for r in range(world)]
    p = largest_power_of_two(world)
    for r, steps in enumerate(scheds):
        exchanges = [peer for kind, peer in steps if kind == "exchange"]
        if r < p:
            assert len(exchanges) == p.bit_length() - 1
            for j, peer in enumerate(exchanges):  # reciprocal, same round
                assert peer == r ^ (1 << j)
                assert [q for kd, q in scheds[peer] if kd == "exchange"][j] == r
        else:
            assert steps == [("fold_send", r - p)]
            assert scheds[r - p][0] == ("fold_recv", r) and scheds[r - p][-1] == ("unfold_send", r)


def simulate(sets, k):
    """Every rank's final set when each follows doubling_schedule (merges in schedule order)."""
    w = len(sets)
    cur = [dict(s) for s in sets]
    p = largest_power_of_two(w)
    for r in range(p, w):  # fold-in
        cur[r - p] = dict_merge_topk(cur[r - p], cur[r], k)
    d = 1
    while d < p:
        cur = [dict_merge_topk(cur[r], cur[r ^ d], k) if r < p else cur[r] for r in range(w)]
        d <<= 1
    for r in range(p, w):  # fold-out
        cur[r] = cur[r - p]
    return cur


@pytest.mark.parametrize("world", [1, 2, 3, 5, 6, 8])
def test_simulated_merge_tree_agrees(world):
    rng = np.random.default_rng(world)
    n, k = 200, 15
    grads = rng.standard_normal((world, n)).astype(np.float32)
    local = [np.sort(np.argsort(-np.abs(g), kind="stable")[:k]).astype(np.int32) for g in grads]
    # run the pure functions in schedule order
    cur = [(local[r], grads[r][local[r]]) for r in range(world)]
    p = largest_power_of_two(world)
    for r in range(p, world):
        cur[r - p] = merge_topk(*cur[r - p], *cur[r], k)
    d = 1
    while d < p:
        cur = [merge_topk(*cur[r], *cur[r ^ d], k) if r < p else cur[r] for r in range(world)]
        d <<= 1
    for r in range(p, world):
        cur[r] = cur[r - p]
    ref = simulate([dict(zip(local[r].tolist(), grads[r][local[r]])) for r in range(world)], k)
    for r in range(world):
        assert cur[r][0].tolist() == sorted(ref[0])
        np.testing.assert_array_equal(cur[r][1], [ref[0][i] for i in sorted(ref[0])])


def test_bytes_model():
    assert gtopk_bytes(0, 1, 100) == 0
    assert gtopk_bytes(0, 2, 100) == 800 + 16
    assert gtopk_bytes(1, 4, 100) == 2 * (800 + 16)
    # W = 3: rank 2 folds into rank 0 and gets the result back
    assert gtopk_bytes(2, 3, 100) == 800
    assert gtopk_bytes(0, 3, 100) == 800 + 16 + 800
    assert gtopk_bytes(1, 3, 100) == 800 + 16
    assert gtopk_bytes(0, 2, 100, index_itemsize=8) == 1200 + 16


def test_in_sorted():
    s = np.array([2, 5, 9], np.int32)
    assert in_sorted(np.array([9, 1, 5, 10, 2]), s).tolist() == [True, False, True, False, True]
    assert not in_sorted(np.array([1]), s[:0]).any()


class OneRank:
    size, rank = 1, 0


def test_one_rank_is_local_topk_with_error_feedback():
    layout = FusionLayout([("a", (30, 10)), ("b", (100,))])
    g = np.random.default_rng(4).standard_normal(layout.n).astype(np.float32)
    sch = create("gtopk", OneRank(), layout, 0.05)
    out = sch.step(g.copy())
    top = np.argsort(-np.abs(g))[: sch.k]
    np.testing.assert_array_equal(np.flatnonzero(out), np.sort(top))
    np.testing.assert_array_equal(out[top], g[top])
    resid = g.copy()
    resid[top] = 0
    np.testing.assert_array_equal(sch.memory.residual, resid)
    assert sch.selected_global() == sch.k == 20


@pytest.mark.skipif(not compiled.available(), reason="numba is not installed")
@pytest.mark.parametrize("sizes", [(3000, 2500), (0, 40), (40, 0), (1, 1)])
def test_the_compiled_merge_of_two_sets_is_the_sorting_one(sizes, monkeypatch):
    rng = np.random.default_rng(sum(sizes))
    shared = rng.choice(10_000, size=min(sizes) // 2, replace=False)
    sets = []
    for s in sizes:
        idx = np.unique(np.concatenate([shared[:s], rng.choice(10_000, size=s, replace=False)]))[:s]
        vals = rng.standard_normal(idx.size).astype(np.float32)
        vals[:2] = -0.0
        sets += [idx.astype(np.int32), vals]
    monkeypatch.setenv("MPISPARSE_FUSED", "1")
    assert compiled.merge_sets(*sets) is not None
    fast = merge_sets(*sets)
    monkeypatch.setenv("MPISPARSE_FUSED", "0")
    assert compiled.merge_sets(*sets) is None
    plain = merge_sets(*sets)  # the stable sort of the concatenation
    assert np.array_equal(fast[0], plain[0]) and np.array_equal(fast[1].view(np.int32), plain[1].view(np.int32))
    monkeypatch.setenv("MPISPARSE_FUSED", "1")
    if sizes[0] > 1:  # a set that is not ascending is left to the sorting merge
        assert compiled.merge_sets(sets[0][::-1].copy(), sets[1], sets[2], sets[3]) is None
