"""Tests for mpisparse.schemes.deft_partition (DEFT Alg. 2-5, eq. 4-6); plain pytest, no MPI.

The expected values of the worked examples were computed by hand from the
pseudocode boxes of Yoon & Oh, "DEFT", ICPP 2023; the working is in the
comments next to them.
"""

import math

import numpy as np
import pytest

from mpisparse.schemes.deft_partition import (Layer, assign_local_k, bin_pack, decode_bins, encode_bins, leader,
                                              my_part, split_large, two_stage_partition)
from mpisparse.schemes.deft_selection import layerwise_topk, predicted_speedup, selection_cost


def spans(layers):
    return [(l.start, l.end, l.source) for l in layers]


# --------------------------------------------------------------------------
# Alg. 2
# --------------------------------------------------------------------------


def test_partition_split_with_remainder():
    # n_g = 15, W = 3, thre_part = 5.  10 > 5: quotient 3, remainder 1 ->
    # pieces 4, 3, 3.  3 and 2 are <= 5 and stay whole.
    layers = two_stage_partition([10, 3, 2], 3)
    assert spans(layers) == [(0, 4, 0), (4, 7, 0), (7, 10, 0), (10, 13, 1), (13, 15, 2)]
    assert [l.size for l in layers] == [4, 3, 3, 3, 2]


def test_partition_remainder_spread_over_first_pieces():
    # n_g = 12, W = 4, thre_part = 3.  11 > 3: quotient 2, remainder 3 ->
    # pieces 3, 3, 3, 2.  1 stays whole.
    layers = two_stage_partition([11, 1], 4)
    assert spans(layers) == [(0, 3, 0), (3, 6, 0), (6, 9, 0), (9, 11, 0), (11, 12, 1)]


def test_partition_more_layers_than_workers():
    # n_g = 20, W = 2, thre_part = 10.  Only 12 > 10: pieces 6, 6.
    # 3, 4, 1 stay whole.
    layers = two_stage_partition([3, 12, 4, 1], 2)
    assert spans(layers) == [(0, 3, 0), (3, 9, 1), (9, 15, 1), (15, 19, 2), (19, 20, 3)]


def test_partition_fewer_layers_than_workers():
    # n_g = 7, W = 3: 7 > 7/3, quotient 2, remainder 1 -> 3, 2, 2.
    assert spans(two_stage_partition([7], 3)) == [(0, 3, 0), (3, 5, 0), (5, 7, 0)]
    # n_g = 6, W = 4, thre_part = 1.5: 5 > 1.5 -> quotient 1, remainder 1 ->
    # 2, 1, 1, 1; 1 <= 1.5 stays whole.
    assert spans(two_stage_partition([5, 1], 4)) == [
        (0, 2, 0), (2, 3, 0), (3, 4, 0), (4, 5, 0), (5, 6, 1)
    ]


def test_partition_size_equal_to_threshold_is_not_split():
    # n_g = 8, W = 2, thre_part = 4: 4 > 4 is false for both.
    assert spans(two_stage_partition([4, 4], 2)) == [(0, 4, 0), (4, 8, 1)]


def test_partition_tiny_tensor_gives_empty_pieces():
    # n_g = 2, W = 3, thre_part = 2/3: 2 > 2/3, quotient 0, remainder 2 ->
    # 1, 1, 0 (always n_workers pieces).
    assert spans(two_stage_partition([2], 3)) == [(0, 1, 0), (1, 2, 0), (2, 2, 0)]


def test_partition_one_worker_and_empty():
    assert spans(two_stage_partition([5, 3], 1)) == [(0, 5, 0), (5, 8, 1)]
    assert two_stage_partition([], 4) == []
    assert spans(two_stage_partition([0, 0], 2)) == [(0, 0, 0), (0, 0, 1)]


def test_partition_covers_every_element_once():
    rng = np.random.default_rng(12345)
    for _ in range(300):
        n_t = int(rng.integers(0, 12))
        sizes = [int(s) for s in rng.integers(0, 200, size=n_t)]
        w = int(rng.integers(1, 17))
        layers = two_stage_partition(sizes, w)
        n_g = sum(sizes)
        cover = np.zeros(n_g, dtype=np.int64)
        pos = 0
        for l in layers:
            assert l.start == pos  # contiguous, in order
            pos = l.end
            cover[l.start : l.end] += 1
            assert l.size <= -(-n_g // w)  # at most ceil(n_g / W)
        assert pos == n_g
        assert np.all(cover == 1)
        # the pieces of each tensor tile exactly that tensor's range
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        for t, size in enumerate(sizes):
            pieces = [l for l in layers if l.source == t]
            assert pieces[0].start == offsets[t] and pieces[-1].end == offsets[t + 1]
            assert len(pieces) in (1, w)
            if len(pieces) == w and w > 1:
                ps = [p.size for p in pieces]
                assert max(ps) - min(ps) <= 1
                assert ps == sorted(ps, reverse=True)  # +1 goes to the first ones


# --------------------------------------------------------------------------
# Alg. 3
# --------------------------------------------------------------------------


def test_local_k_basic_priority_order():
    # order: layer 1 (3), layer 2 (2), layer 0 (1); norm_remain = 6, k_remain = 12
    # layer 1: 12*3/6 = 6 -> 6; k_remain 6, norm_remain 3
    # layer 2: 6*2/3 = 4 -> 4; k_remain 2, norm_remain 1
    # layer 0: 2*1/1 = 2 -> 2
    ks = assign_local_k([100, 100, 100], [1.0, 3.0, 2.0], 12)
    assert ks.dtype == np.int64
    assert ks.tolist() == [2, 6, 4]
    assert ks.sum() == 12


def test_local_k_rounding_down_and_ties_by_index():
    # equal norms -> order 0, 1, 2; norm_remain 3, k_remain 10
    # layer 0: 10/3 = 3.33 -> 3; k_remain 7, norm_remain 2
    # layer 1: 7/2 = 3.5 -> 3; k_remain 4, norm_remain 1
    # layer 2: 4/1 = 4 -> 4
    assert assign_local_k([100, 100, 100], [1.0, 1.0, 1.0], 10).tolist() == [3, 3, 4]
    # 0.1-style norms are handled exactly: 9*0.3/0.9 = 3 (not 2.9999...)
    # order 0 (0.3), 1 (0.3), 2 (0.3): 9/3 = 3, 6/2 = 3, 3/1 = 3
    assert assign_local_k([50, 50, 50], [0.3, 0.3, 0.3], 9).tolist() == [3, 3, 3]


def test_local_k_cap_at_size_flows_to_later_layers():
    # order: 0 (4), 1 (2), 2 (2); norm_remain 8, k_remain 16
    # layer 0: 16*4/8 = 8 > size 2 -> k = 2; k_remain 14, norm_remain 4
    # layer 1: 14*2/4 = 7 -> 7; k_remain 7, norm_remain 2
    # layer 2: 7*2/2 = 7 -> 7
    ks = assign_local_k([2, 100, 100], [4.0, 2.0, 2.0], 16)
    assert ks.tolist() == [2, 7, 7]
    assert ks.sum() == 16


def test_local_k_equal_to_size_is_not_a_cap():
    # layer 0: 10*1/2 = 5, size 5 is not < 5 -> max(1, 5) = 5; layer 1: 5
    assert assign_local_k([5, 100], [1.0, 1.0], 10).tolist() == [5, 5]


def test_local_k_zero_norm_layers_get_one():
    # order: 0 (5), 2 (3), 1 (0); norm_remain 8, k_remain 8
    # layer 0: 8*5/8 = 5; k_remain 3, norm_remain 3
    # layer 2: 3*3/3 = 3; k_remain 0, norm_remain 0
    # layer 1: norm_remain = 0 -> k_temp 0 -> max(1, 0) = 1   (sum 9 > 8)
    ks = assign_local_k([50, 50, 50], [5.0, 0.0, 3.0], 8)
    assert ks.tolist() == [5, 1, 3]
    # all norms zero: every k_temp is 0 -> every k is 1
    assert assign_local_k([10, 10], [0.0, 0.0], 5).tolist() == [1, 1]


def test_local_k_floor_of_one_bites():
    # order 0 (1000), 1 (1); layer 0: 1*1000/1001 = 0.999 -> floor 0 -> 1;
    # k_remain 0; layer 1: 0*1/1 = 0 -> 1.  sum 2 > k_total 1.
    assert assign_local_k([100, 100], [1000.0, 1.0], 1).tolist() == [1, 1]
    # layer 0: 10*99/100 = 9.9 -> 9; k_remain 1; layer 1: 1*1/1 = 1
    assert assign_local_k([100, 100], [99.0, 1.0], 10).tolist() == [9, 1]


def test_local_k_empty_layer_gets_zero():
    # order 1 (1), 0 (0): layer 1: 5*1/1 = 5; layer 0: k_temp 0 -> max(1,0)
    # capped by size 0 -> 0
    assert assign_local_k([0, 10], [0.0, 1.0], 5).tolist() == [0, 5]


def test_local_k_fractional_total():
    # 7.5/2 = 3.75 -> 3; k_remain 4.5 -> 4.  sum = floor(7.5) = 7
    assert assign_local_k([100, 100], [1.0, 1.0], 7.5).tolist() == [3, 4]


def test_local_k_sum_equals_total_when_nothing_bites():
    rng = np.random.default_rng(7)
    for _ in range(100):
        n = int(rng.integers(1, 40))
        k_total = int(rng.integers(1000 * n, 5000 * n))
        sizes = [10**7] * n  # no cap
        norms = rng.uniform(1.0, 2.0, size=n)  # every k_temp >= ~300: no floor
        ks = assign_local_k(sizes, norms, k_total)
        assert int(ks.sum()) == k_total
        assert np.all(ks >= 1)


def test_local_k_bounds_random():
    rng = np.random.default_rng(8)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        sizes = rng.integers(0, 50, size=n)
        norms = rng.exponential(1.0, size=n) * (rng.random(n) > 0.2)
        ks = assign_local_k(sizes, norms, float(rng.uniform(0.5, 300)))
        assert np.all(ks <= sizes)
        assert np.all((ks >= 1) | (sizes == 0))


# --------------------------------------------------------------------------
# Alg. 4
# --------------------------------------------------------------------------

BP_SIZES = [10, 40, 30, 30, 10, 5]
BP_KS = [10, 2, 3, 3, 1, 5]
# costs (size * ln k): 23.026, 27.726, 32.958, 32.958, 0, 8.047


def test_bin_pack_by_hand():
    # order by cost, ties lower index: 2, 3, 1, 0, 5, 4.  Loads [0, 0]:
    # 2 -> bin 0 (tie)      [32.958, 0]
    # 3 -> bin 1            [32.958, 32.958]
    # 1 -> bin 0 (tie)      [60.684, 32.958]
    # 0 -> bin 1            [60.684, 55.984]
    # 5 -> bin 1            [60.684, 64.031]
    # 4 -> bin 0 (cost 0)
    assert bin_pack(BP_SIZES, BP_KS, 2) == [[2, 1, 4], [3, 0, 5]]


def test_bin_pack_three_workers_by_hand():
    # same costs, loads [0, 0, 0]:
    # 2 -> 0 [32.958, 0, 0]; 3 -> 1 [.., 32.958, 0]; 1 -> 2 [.., .., 27.726]
    # 0 -> 2 [32.958, 32.958, 50.752]; 5 -> 0 [41.005, 32.958, 50.752]
    # 4 -> 1
    assert bin_pack(BP_SIZES, BP_KS, 3) == [[2, 5], [3, 4], [1, 0]]


def test_split_large_tiles_each_layer_exactly_once():
    layers = [Layer(0, 10, 0), Layer(10, 13, 1), Layer(13, 13, 2), Layer(13, 30, 3)]
    got = split_large(layers, 4)
    # 10 -> 3 pieces 4, 3, 3; 3 stays; the empty layer stays; 17 -> 5 pieces 4, 4, 3, 3, 3
    assert [(l.start, l.end, l.source) for l in got] == [
        (0, 4, 0), (4, 7, 0), (7, 10, 0), (10, 13, 1), (13, 13, 2),
        (13, 17, 3), (17, 21, 3), (21, 24, 3), (24, 27, 3), (27, 30, 3)]
    rng = np.random.default_rng(3)
    for _ in range(50):
        sizes = rng.integers(0, 200, size=int(rng.integers(1, 12))).tolist()
        cap = int(rng.integers(1, 60))
        out = split_large(two_stage_partition(sizes, int(rng.integers(1, 6))), cap)
        assert out[0].start == 0 and out[-1].end == sum(sizes)
        assert all(a.end == b.start for a, b in zip(out, out[1:]))  # contiguous: every element once
        assert all(l.size <= cap for l in out)
    assert split_large(layers, 100) == layers
    with pytest.raises(ValueError, match="max_size must be at least 1, got 0"):
        split_large(layers, 0)


def test_bin_pack_size_cost_model_by_hand():
    # costs = sizes (every k > 0): 10, 40, 30, 30, 10, 5; order 1, 2, 3, 0, 4, 5.
    # 1 -> 0 [40, 0]; 2 -> 1 [40, 30]; 3 -> 1 [40, 60]; 0 -> 0 [50, 60];
    # 4 -> 0 [60, 60]; 5 -> 0 (tie) [65, 60]
    assert bin_pack(BP_SIZES, BP_KS, 2, "size") == [[1, 0, 4, 5], [2, 3]]
    # a layer with k = 0 costs 0 and is placed last
    assert bin_pack([5, 5], [0, 3], 2, "size") == [[1], [0]]
    with pytest.raises(ValueError, match="cost_model must be 'eq3' or 'size', got 'x'"):
        bin_pack([5], [1], 1, "x")


@pytest.mark.parametrize("model", ["resnet50", "lstm-wt2"])
@pytest.mark.parametrize("w", [2, 4, 8, 16])
def test_size_packing_balances_elements_on_model_shapes(model, w):
    """Alg. 2, split_large to n / (8 W), the size-cost Alg. 4 on real shapes: the bins tile the layers and hold <= 1.2x the mean elements."""
    from mpisparse.models.shapes import layer_shapes
    from mpisparse.backend.fusion import FusionLayout

    layout = FusionLayout(layer_shapes(model))
    layers = split_large(two_stage_partition([s.size for s in layout.layers], w), -(-layout.n // (8 * w)))
    sizes = [layer.size for layer in layers]
    bins = bin_pack(sizes, [1] * len(sizes), w, "size")
    assert sorted(i for b in bins for i in b) == list(range(len(layers)))
    loads = [sum(sizes[i] for i in b) for b in bins]
    assert sum(loads) == layout.n
    assert max(loads) <= 1.2 * layout.n / w, loads


def test_bin_pack_fewer_layers_than_workers_and_one_worker():
    # costs 5 ln2 = 3.47, 5 ln3 = 5.49 -> layer 1 to bin 0, layer 0 to bin 1
    assert bin_pack([5, 5], [2, 3], 4) == [[1], [0], [], []]
    assert bin_pack(BP_SIZES, BP_KS, 1) == [[2, 3, 1, 0, 5, 4]]
    assert bin_pack([], [], 3) == [[], [], []]


def test_bin_pack_all_zero_costs_pile_into_bin_zero():
    # all costs 0 (k = 1): order 0, 1, 2, 3; every load stays 0, so
    # size_bin.index(min(size_bin)) is bin 0 every time: all land in bin 0.
    assert bin_pack([4, 4, 4, 4], [1, 1, 1, 1], 2) == [[0, 1, 2, 3], []]


def _box_alg4(sizes, ks, n_workers):
    """Literal transcription of Alg. 4 l.4-15, for comparison only."""
    size_bin = [0.0] * n_workers
    alloc_bin = [[] for _ in range(n_workers)]
    cost = [sizes[i] * math.log(ks[i]) if ks[i] >= 1 else 0.0 for i in range(len(sizes))]
    for _ in range(len(sizes)):
        val_max = max(cost)
        idx_max = cost.index(val_max)
        bin_min = size_bin.index(min(size_bin))
        alloc_bin[bin_min].append(idx_max)
        size_bin[bin_min] += val_max
        cost[idx_max] = -1
    return alloc_bin


def test_bin_pack_matches_literal_box():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(0, 25))
        sizes = [int(s) for s in rng.integers(1, 60, size=n)]
        ks = [int(rng.integers(1, s + 1)) for s in sizes]
        if n > 3:  # force exact ties
            sizes[1], ks[1] = sizes[0], ks[0]
        w = int(rng.integers(1, 7))
        assert bin_pack(sizes, ks, w) == _box_alg4(sizes, ks, w)


def test_leader_rotation_and_parts():
    assert [leader(t, 3) for t in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [leader(t, 1) for t in range(3)] == [0, 0, 0]
    # iteration 1, W 3: cycle 1 -> parts (1+r) % 3
    assert [my_part(r, 1, 3) for r in range(3)] == [1, 2, 0]
    # iteration 5, W 4: cycle 1 -> parts 1, 2, 3, 0
    assert [my_part(r, 5, 4) for r in range(4)] == [1, 2, 3, 0]
    # iteration 0: identity
    assert [my_part(r, 0, 4) for r in range(4)] == [0, 1, 2, 3]
    for t in range(10):
        assert sorted(my_part(r, t, 5) for r in range(5)) == list(range(5))


def test_encode_decode_round_trip():
    alloc = [[2, 1, 4], [3, 0, 5]]
    arr = encode_bins(alloc, 6)
    assert arr.dtype == np.int32
    assert arr.tolist() == [1, 0, 0, 1, 0, 1]
    assert decode_bins(arr, 2) == [[1, 2, 4], [0, 3, 5]]
    np.testing.assert_array_equal(encode_bins(decode_bins(arr, 2), 6), arr)
    # with empty bins
    arr = encode_bins([[1], [0], [], []], 2)
    assert arr.tolist() == [1, 0]
    assert decode_bins(arr, 4) == [[1], [0], [], []]
    rng = np.random.default_rng(5)
    for _ in range(50):
        n, w = int(rng.integers(0, 30)), int(rng.integers(1, 6))
        sizes = [int(s) for s in rng.integers(1, 100, size=n)]
        ks = [int(rng.integers(1, s + 1)) for s in sizes]
        alloc = bin_pack(sizes, ks, w)
        assert decode_bins(encode_bins(alloc, n), w) == [sorted(b) for b in alloc]


def test_encode_rejects_missing_or_duplicate():
    with pytest.raises(ValueError, match="layer 2 is in none"):
        encode_bins([[0], [1]], 3)
    with pytest.raises(ValueError, match="layer 0 appears in both"):
        encode_bins([[0], [0, 1]], 2)
    with pytest.raises(ValueError, match="outside the allowed range"):
        encode_bins([[0, 5]], 2)
    with pytest.raises(ValueError, match="allowed range is 0 to 1"):
        decode_bins(np.array([0, 2], dtype=np.int32), 2)


# --------------------------------------------------------------------------
# Alg. 5
# --------------------------------------------------------------------------


def test_layerwise_topk_by_hand():
    grad = np.array([0.1, -5.0, 2.0, 0.0, 3.0, -1.0, 4.0, 0.5])
    layers = [Layer(0, 3, 0), Layer(3, 6, 1), Layer(6, 8, 2)]
    ks = [2, 1, 1]
    # part 2 first: |4.0, 0.5| -> top1 local 0 -> 6
    # part 0: |0.1, 5, 2| -> top2 local 1, 2 -> 1, 2
    idx, k = layerwise_topk(grad, layers, ks, [2, 0])
    assert idx.tolist() == [6, 1, 2]
    assert k == 3
    idx, k = layerwise_topk(grad, layers, ks, [])
    assert idx.tolist() == [] and k == 0


def test_layerwise_topk_ties_lower_index():
    grad = np.array([1.0, -2.0, 2.0, 1.0])
    idx, k = layerwise_topk(grad, [Layer(0, 4, 0)], [3], [0])
    assert idx.tolist() == [1, 2, 0] and k == 3


# --------------------------------------------------------------------------
# eq. 4-6
# --------------------------------------------------------------------------


def test_selection_cost_and_speedup_by_hand():
    alloc = [[2, 1, 4], [3, 0, 5]]
    c = selection_cost(BP_SIZES, BP_KS, alloc)
    # bin 0: 30 ln3 + 40 ln2 + 10 ln1 = 32.9584 + 27.7259 + 0 = 60.6843
    # bin 1: 30 ln3 + 10 ln10 + 5 ln5 = 32.9584 + 23.0259 + 8.0472 = 64.0314
    assert c == pytest.approx([60.68426, 64.03141], abs=1e-4)
    # n_g = 125, k = 24: 125 ln24 / 64.0314 = 397.2567 / 64.0314 = 6.2041
    assert predicted_speedup(125, 24, BP_SIZES, BP_KS, alloc) == pytest.approx(
        6.20409, abs=1e-4
    )
    assert selection_cost([5, 5], [2, 3], [[1], [0], [], []]).tolist()[2:] == [0.0, 0.0]


def test_speedup_degenerate():
    assert predicted_speedup(10, 5, [10], [1], [[0]]) == math.inf
    with pytest.raises(ValueError, match="0/0"):
        predicted_speedup(10, 1, [10], [1], [[0]])


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: two_stage_partition([1, 2], 0), "n_workers must be at least 1, got 0"),
        (lambda: two_stage_partition([1, -2], 2), r"tensor_sizes\[1\] must be non-negative"),
        (lambda: two_stage_partition([1.5], 2), "must be an integer"),
        (lambda: assign_local_k([1, 2], [1.0], 3), "same length, got 2 and 1"),
        (lambda: assign_local_k([1, 2], [1.0, 1.0], 0), "k_total must be a finite number greater than 0, got 0"),
        (lambda: assign_local_k([1, 2], [1.0, 1.0], -3.0), "greater than 0"),
        (lambda: assign_local_k([1, 2], [1.0, -1.0], 3), r"norms\[1\] must be a finite non-negative"),
        (lambda: assign_local_k([1, 2], [1.0, math.nan], 3), r"norms\[1\]"),
        (lambda: assign_local_k([1, 2], [math.inf, 1.0], 3), r"norms\[0\]"),
        (lambda: assign_local_k([-1, 2], [1.0, 1.0], 3), r"sizes\[0\] must be non-negative"),
        (lambda: bin_pack([1, 2], [1], 2), "same length"),
        (lambda: bin_pack([1, 2], [1, 1], 0), "n_workers must be at least 1"),
        (lambda: bin_pack([1, 2], [1, 3], 2), r"ks\[1\] must lie between 0 and the layer size 2, got 3"),
        (lambda: leader(3, 0), "n_workers must be at least 1"),
        (lambda: leader(-1, 2), "iteration must be non-negative"),
        (lambda: my_part(2, 0, 2), "rank must lie between 0 and 1, got 2"),
        (lambda: predicted_speedup(10, 0.5, [10], [2], [[0]]), "k must be a finite number of at least 1"),
    ],
)
def test_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()
