"""Pure pieces of the peers' schemes, without MPI: PowerSGD's layer plan and orthogonalization, Ok-Topk's
boundaries, blocks and bisection, and both schemes' options and state on one rank."""

import numpy as np
import pytest

from conftest import SelfComm
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create, scheme_class
from mpisparse.schemes import oktopk as ok
from mpisparse.schemes.oktopk import block_sizes, kth_largest_bits, local_boundaries, oktopk_bound_bytes, region_bounds
from mpisparse.schemes.powersgd import matrix_shape, orthogonalize, plan_layers, should_compress

LAYERS = [("conv", (8, 3, 3, 3)), ("bias", (8,)), ("fc", (10, 72)), ("tiny", (3, 2)), ("scalar", ())]


def test_powersgd_views_layers_as_matrices_and_compresses_only_where_it_pays():
    assert matrix_shape((8, 3, 3, 3)) == (8, 27) and matrix_shape((5,)) == (5, 1) and matrix_shape(()) == (1, 1)
    assert should_compress(10, 72, 1, 2.0) and not should_compress(3, 2, 2, 2.0)  # (3+2)*2*2 = 20 >= 6
    assert not should_compress(8, 1, 1, 2.0) and should_compress(8, 1, 1, 0.5)  # a 1-D layer: only below rate 1
    plan = plan_layers(FusionLayout(LAYERS), 2, 2.0)
    assert [(f.rows, f.cols, f.rank) for f in plan.factors] == [(8, 27, 2), (10, 72, 2)]
    assert plan.dense == [(216, 224), (944, 951)]  # bias; tiny and the scalar, adjacent, merged
    assert (plan.dense_size, plan.p_size, plan.q_size) == (15, 36, 198)


def test_orthogonalize_gives_orthonormal_columns_and_epsilon_guards_a_zero_column():
    m = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)
    q = orthogonalize(m.copy())
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-5)
    np.testing.assert_allclose(np.linalg.matrix_rank(np.hstack([q, m])), 3)  # the same span
    z = orthogonalize(np.zeros((4, 1), np.float32), 1e-8)
    assert np.all(np.isfinite(z))


def test_oktopk_boundaries_blocks_and_search():
    assert local_boundaries(np.array([1, 5, 9, 20, 21, 40]), 3, 50).tolist() == [9.0, 21.0]
    assert local_boundaries(np.array([], dtype=np.int64), 2, 10).tolist() == [5.0]
    assert region_bounds(np.array([18.0, 41.0]), 2, 30).tolist() == [0, 9, 20, 30]  # floored means
    assert block_sizes(10, 4).tolist() == [3, 3, 2, 2] and block_sizes(0, 2).tolist() == [0, 0]
    mags = np.array([0.5, 3.0, 1e-30, 2.0, 2.0, 0.0], np.float32)
    bits = mags.view(np.int32)
    rounds = []

    def at_least(patterns):
        rounds.append(len(patterns))
        return np.array([np.count_nonzero(bits >= t) for t in patterns])

    for ways in (1, 15):  # bisection and the estimation's 15-way search find the same k-th largest
        for k, want in ((1, 3.0), (2, 2.0), (3, 2.0), (4, 0.5), (5, 1e-30), (6, 0.0), (7, 0.0)):
            got = np.array([kth_largest_bits(at_least, k, ways)], np.int32).view(np.float32)
            assert got[0] == np.float32(want), (ways, k, got)
    rounds.clear()
    kth_largest_bits(at_least, 2, ok.SEARCH_WAYS)
    assert len(rounds) <= 8 and max(rounds) <= ok.SEARCH_WAYS + 1  # one Allreduce of 16 counts a round
    assert oktopk_bound_bytes(100, 4) == 6 * 100 * 3 / 4 * 4


def test_oktopk_corrected_threshold_balance_and_packing():
    probes = ok.probe_thresholds(0.5)
    half = ok.PROBE_OCTAVES * ok.PROBES_PER_OCTAVE
    assert probes.dtype == np.float32 and probes.shape == (2 * half,) and np.all(np.diff(probes) > 0)
    assert probes[half] == np.float32(0.5) and probes[0] == np.float32(0.5 / 2 ** ok.PROBE_OCTAVES)
    mags = np.array([0.1, 0.5, 0.5, 0.9, 2.0], np.float32)
    np.testing.assert_array_equal(ok.counts_at_least(mags, np.array([0.05, 0.5, 0.6, 3.0], np.float32)), [5, 4, 2, 0])
    assert ok.closest_probe([9, 7, 5, 3], 6) == 2  # 7 and 5 tie: the higher threshold (fewer entries)
    assert ok.closest_probe([9, 7, 5, 3], 8) == 1 and ok.closest_probe([9, 7], 100) == 0
    counts, blocks = np.array([5, 0, 1]), block_sizes(6, 3)
    moves = ok.balance_moves(counts, blocks)
    # rank 0 keeps its first 2 and sends 2 on to rank 1 and 1 to rank 2; rank 2's one entry stays
    assert moves.tolist() == [[2, 2, 1], [0, 0, 0], [0, 0, 1]]
    assert (moves.sum(axis=1) == counts).all() and (moves.sum(axis=0) == blocks).all()
    assert ok.needs_balance(counts, blocks) and not ok.needs_balance(np.array([9, 8, 8]), block_sizes(25, 3))
    for idt in (np.int32, np.int64):
        idx = np.array([3, 7, 2 ** 30], dtype=idt)
        vals = np.array([-1.5, np.float32(1e-38), np.inf], np.float32)
        back_idx, back_vals = ok.unpack_entries(ok.pack_entries(idx, vals).reshape(-1))
        assert back_idx.dtype == idt and back_idx.tolist() == idx.tolist()
        assert back_vals.dtype == np.float32 and back_vals.tobytes() == vals.tobytes()


def test_options_are_validated_and_state_round_trips_on_one_rank():
    with pytest.raises(ValueError, match="--matrix-approximation-rank is 0"):
        scheme_class("powersgd").validate_options({"matrix_approximation_rank": 0})
    with pytest.raises(ValueError, match="--tau is 0"):
        scheme_class("oktopk").validate_options({"tau": 0})
    with pytest.raises(ValueError, match="allowed values are numpy, torch"):
        scheme_class("powersgd").validate_options({"init_rng": "cupy"})
    # powersgd's round trip on one rank (oktopk's needs Alltoallv: tests/mpi/check_oktopk.py has it)
    layout = FusionLayout(LAYERS)
    g = [np.random.default_rng(t).standard_normal(layout.n).astype(np.float32) for t in range(4)]
    a = create("powersgd", SelfComm(), layout, 0.1, seed=4, matrix_approximation_rank=2)
    a.step(g[0].copy())
    b = create("powersgd", SelfComm(), layout, 0.1, seed=4, matrix_approximation_rank=2)
    b.load_state_dict(a.state_dict())
    for t in (1, 2, 3):
        assert np.array_equal(a.step(g[t].copy()), b.step(g[t].copy())), t
