"""Unit tests (one process, no MPI) of mpisparse.schemes.deft and bench.select_deft."""

import math

import numpy as np
import pytest

from mpisparse.backend.fusion import FusionLayout
from mpisparse.bench.gradgen import SyntheticGradients
from mpisparse.schemes.deft_partition import Layer, assign_local_k, bin_pack, split_large, two_stage_partition
from mpisparse.schemes.deft_selection import layerwise_topk, predicted_speedup
from mpisparse.schemes import SCHEMES, create, k_for
from mpisparse.schemes.deft import (
    PACK_COST,
    PACK_LAYER_OVERHEAD,
    PACK_PIECES,
    deft_layers,
    layer_norms,
    local_k,
    select_layers,
    simulate_selection_times,
    size_bins,
)
from mpisparse.results.timing import PhaseTimer

LAYOUT = FusionLayout([("a.weight", (40, 25)), ("a.bias", (25,)), ("b.weight", (300,)),
                       ("c", (0,)), ("d.weight", (250,)), ("e", (7,))])


def grad_of(layout, rank=0, t=0, seed=1):
    return SyntheticGradients(layout, rank, seed=seed).fill(layout.empty(), t)


# --------------------------------------------------------------------------
# pure functions
# --------------------------------------------------------------------------


def test_deft_layers_is_alg2_on_the_layout_then_split_to_n_over_8w():
    sizes = [s.size for s in LAYOUT.layers]
    assert deft_layers(LAYOUT, 1) == two_stage_partition(sizes, 1)
    for w in (2, 3, 4, 16):
        cap = -(-LAYOUT.n // (PACK_PIECES * w))
        got = deft_layers(LAYOUT, w)
        assert got == split_large(two_stage_partition(sizes, w), cap)
        assert all(l.size <= cap for l in got)
    # n = 1582: a.weight (1000) > 1582 / 2 -> split in two at W = 2
    assert [(l.start, l.end) for l in two_stage_partition(sizes, 2)][:2] == [(0, 500), (500, 1000)]


def test_layer_norms_match_numpy_and_empty_layers_are_zero():
    g = grad_of(LAYOUT)
    layers = deft_layers(LAYOUT, 3)
    got = layer_norms(g, layers)
    assert got.dtype == np.float64 and got.shape == (len(layers),)
    want = [np.linalg.norm(g[l.start:l.end].astype(np.float64)) for l in layers]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert layer_norms(g, [Layer(3, 3, 0)]).tolist() == [0.0]


def test_layer_norms_fall_back_to_float64_on_overflow():
    v = np.full(10, 1e20, dtype=np.float32)  # float32 sum of squares is inf
    got = layer_norms(v, [Layer(0, 10, 0), Layer(0, 4, 0)])
    np.testing.assert_allclose(got, [math.sqrt(10) * 1e20, 2e20], rtol=1e-6)
    assert np.all(np.isfinite(got))


def test_local_k_is_alg3_below_density_one():
    sizes, norms = [100, 100, 100], [1.0, 3.0, 2.0]
    assert local_k(sizes, norms, 12).tolist() == assign_local_k(sizes, norms, 12).tolist() == [2, 6, 4]


def test_local_k_sends_everything_at_density_one():
    # Alg. 3 alone: order 0 (2), 1 (1); layer 0: 20 * 2/3 = 13.3 < 19 -> 13;
    # layer 1: 7 * 1/1 = 7 > 1 -> 1: only 14 of 20 would be sent.
    assert assign_local_k([19, 1], [2.0, 1.0], 20).tolist() == [13, 1]
    assert local_k([19, 1], [2.0, 1.0], 20).tolist() == [19, 1]
    assert local_k([19, 0, 1], [2.0, 0.0, 1.0], 20).tolist() == [19, 0, 1]
    assert local_k([19, 1], [2.0, 1.0], 20).dtype == np.int64


def test_select_layers_matches_the_alg5_reference():
    rng = np.random.default_rng(4)
    for _ in range(30):
        sizes = [int(s) for s in rng.integers(0, 300, size=int(rng.integers(1, 8)))]
        n = sum(sizes)
        if n == 0:
            continue
        vec = rng.standard_normal(n).astype(np.float32)
        before = vec.copy()
        layers = two_stage_partition(sizes, int(rng.integers(1, 5)))
        ks = [int(rng.integers(0, l.size + 1)) for l in layers]
        part = [int(x) for x in rng.permutation(len(layers))[: int(rng.integers(0, len(layers) + 1))]]
        want, kk = layerwise_topk(vec, layers, ks, part)
        for scratch in (None, np.empty_like(vec)):
            got = select_layers(vec, layers, ks, part, scratch)
            assert got.dtype == np.int32 and got.size == kk
            np.testing.assert_array_equal(np.sort(got), np.sort(want))
        np.testing.assert_array_equal(vec, before)  # never writes into the input


def test_select_layers_empty_part_and_zero_k():
    vec = np.arange(10, dtype=np.float32)
    layers = [Layer(0, 5, 0), Layer(5, 10, 1)]
    assert select_layers(vec, layers, [2, 2], []).tolist() == []
    assert select_layers(vec, layers, [0, 2], [0]).dtype == np.int32
    assert sorted(select_layers(vec, layers, [0, 2], [0, 1]).tolist()) == [8, 9]


# --------------------------------------------------------------------------
# simulate_selection_times
# --------------------------------------------------------------------------


@pytest.mark.parametrize("w", [1, 2, 3, 8])
def test_simulate_selection_times_shape_and_bookkeeping(w):
    g = grad_of(LAYOUT)
    res = simulate_selection_times(LAYOUT, g, 0.05, w, repeats=2)
    layers = deft_layers(LAYOUT, w)
    sizes = [l.size for l in layers]
    ks = local_k(sizes, layer_norms(g, layers), k_for(0.05, LAYOUT.n))
    bins = bin_pack(sizes, ks, w, PACK_COST, PACK_LAYER_OVERHEAD)
    assert res["world_size"] == w and res["layers"] == len(layers) and res["k"] == k_for(0.05, LAYOUT.n)
    assert res["selected"] == int(ks.sum())
    assert len(res["per_rank_seconds"]) == w and all(s >= 0 for s in res["per_rank_seconds"])
    assert res["per_rank_layers"] == [len(b) for b in bins]
    assert res["max_seconds"] == max(res["per_rank_seconds"])
    assert res["mean_seconds"] == pytest.approx(sum(res["per_rank_seconds"]) / w)
    assert res["imbalance"] >= 1.0
    assert res["predicted_speedup"] == pytest.approx(predicted_speedup(LAYOUT.n, res["k"], sizes, ks, bins))
    assert len(res["per_rank_cost"]) == w
    assert res["norms_seconds"] >= 0 and res["alloc_seconds"] >= 0


@pytest.mark.parametrize("kw, match", [
    ({"world_size": 0}, "world_size is 0; it must be an integer of at least 1"),
    ({"world_size": 2.5}, "world_size is 2.5"),
    ({"repeats": 0}, "repeats is 0; it must be an integer of at least 1"),
    ({"density": 0.0}, r"--density 0.0 is not in the allowed range \(0, 1\]"),
    ({"grad": np.zeros(5, np.float32)}, r"grad has shape \(5,\); the layout needs \(1582,\)"),
])
def test_simulate_selection_times_validation(kw, match):
    args = {"layout": LAYOUT, "grad": grad_of(LAYOUT), "density": 0.05, "world_size": 2, "repeats": 1}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        simulate_selection_times(**args)


# --------------------------------------------------------------------------
# the scheme at one rank, without MPI
# --------------------------------------------------------------------------


class SelfComm:
    """A one-rank stand-in for mpisparse.mpi.comm.Communicator."""

    size, rank = 1, 0
    bytes_sent = 0

    def bcast(self, x, root=0):
        assert root == 0
        return x

    def allgatherv(self, x, counts=None):
        return x.copy(), np.array([x.size])

    def allreduce(self, x, out=None, op="sum"):
        if out is None:
            return x.copy()
        out[...] = x
        return out

    def allgather_obj(self, obj):
        return [obj]


def test_scheme_is_registered_and_one_rank_is_layerwise_topk_with_norm_k():
    assert "deft" in SCHEMES and SCHEMES["deft"].__doc__
    timer = PhaseTimer()
    sch = create("deft", SelfComm(), LAYOUT, 0.05, timer=timer)
    layers = deft_layers(LAYOUT, 1)
    sizes = [l.size for l in layers]
    resid = np.zeros(LAYOUT.n, np.float32)
    for t in range(3):
        g = grad_of(LAYOUT, t=t)
        with timer.step():
            out = sch.step(g.copy())
        acc = resid + g
        ks = assign_local_k(sizes, [np.sqrt(float(np.dot(acc[l.start:l.end], acc[l.start:l.end])))
                                    for l in layers], k_for(0.05, LAYOUT.n))
        idx, _ = layerwise_topk(acc, layers, ks, list(range(len(layers))))
        want = np.zeros(LAYOUT.n, np.float32)
        want[idx] = acc[idx]
        np.testing.assert_allclose(out, want, rtol=1e-6)
        acc[idx] = 0
        resid = acc
        np.testing.assert_array_equal(sch.memory.residual, resid)
        assert sch.last_leader == 0 and sch.last_bins.tolist() == [0] * len(layers)
        assert sch.selected_global() == idx.size
        assert sch.last_select_seconds >= sch.last_topk_seconds > 0
    assert set(timer.records[0]) == {"compensate", "select", "exchange_indices", "exchange_values",
                                     "update", "step"}
    d = sch.diagnostics()
    assert d["select_seconds_max"] == d["select_seconds_mean"] == sch.last_select_seconds
    assert d["select_imbalance"] == 1.0
    assert d["error_norm"] == pytest.approx(float(np.linalg.norm(resid)), rel=1e-6)


@pytest.mark.parametrize("w", [1, 2, 3, 8])
def test_size_bins_are_the_packing_of_any_norms_and_k(w):
    """Under the size cost model the bins read no norm: size_bins (packed once) equals Alg. 4 on the ks of
    any norms, zero and tiny norms, k = 1 and k = n included (the layout has an empty layer)."""
    layers = deft_layers(LAYOUT, w)
    sizes = [l.size for l in layers]
    assert 0 in sizes
    rng = np.random.default_rng(w)
    want = size_bins(sizes, w)
    norm_sets = [rng.random(len(sizes)), np.zeros(len(sizes)), rng.random(len(sizes)) ** 40,
                 np.where(rng.random(len(sizes)) < 0.5, 0.0, 1e30)]
    for norms in norm_sets:
        for k in (1, 7, k_for(0.05, LAYOUT.n), LAYOUT.n - 1, LAYOUT.n):
            ks = local_k(sizes, norms, k)
            assert bin_pack(sizes, ks, w, "size", PACK_LAYER_OVERHEAD) == want, (norms, k)
    # the paper's cost reads k: there the leader's norms matter
    assert bin_pack(sizes, local_k(sizes, norm_sets[0], 7), w, "eq3") != want or w == 1


class CountingComm(SelfComm):
    def __init__(self):
        self.bcasts = 0

    def bcast(self, x, root=0):
        self.bcasts += 1
        return super().bcast(x, root)


@pytest.mark.parametrize("cost", ["size", "eq3"])
def test_bins_broadcast_only_when_the_cost_model_reads_k(monkeypatch, cost):
    """PACK_COST "size": the bins are packed at construction, no Bcast; "eq3": the leader packs and
    broadcasts every step (Alg. 4 l.3-16).  At one rank both select the same (one bin holds every layer)."""
    from mpisparse.schemes import deft
    ref = create("deft", SelfComm(), LAYOUT, 0.05)  # the default, "size"
    monkeypatch.setattr(deft, "PACK_COST", cost)
    comm = CountingComm()
    sch = create("deft", comm, LAYOUT, 0.05)
    for t in range(3):
        g = grad_of(LAYOUT, t=t)
        np.testing.assert_array_equal(sch.step(g.copy()), ref.step(g.copy()))
        assert sch.last_bins.tolist() == [0] * len(sch.layers)
    assert comm.bcasts == (3 if cost == "eq3" else 0)


def _fused_and_plain(monkeypatch, steps, record):
    """``{"1": [...], "0": [...]}``: ``record(scheme, t)`` for ``steps`` steps of a fresh one-rank deft scheme
    with the compiled loops (``MPISPARSE_FUSED=1``) and without; skipped without numba."""
    from mpisparse.backend import compiled_segments
    if not compiled_segments._HAVE_NUMBA:
        pytest.skip("numba is not installed (pip install mpisparse[fast])")
    runs = {}
    for env in ("1", "0"):
        monkeypatch.setenv("MPISPARSE_FUSED", env)
        sch = create("deft", SelfComm(), LAYOUT, 0.05)
        runs[env] = [record(sch, t) for t in range(steps)]
    return runs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_norms_step_equals_the_plain_step(monkeypatch, dtype):
    """The compiled pass (acc = e + g with the layer norms summed on the way) and the plain steps give the
    same output and residual, step after step; the fused norms agree with segment_norms to rounding."""
    from mpisparse.backend import compiled_compensate
    runs = _fused_and_plain(monkeypatch, 4, lambda sch, t: (sch.step(grad_of(LAYOUT, t=t).astype(dtype)).copy(),
                                                            sch.memory.residual.copy(), sch.last_ks.copy()))
    for (o1, r1, k1), (o0, r0, k0) in zip(runs["1"], runs["0"]):
        np.testing.assert_array_equal(k1, k0)
        np.testing.assert_array_equal(o1, o0)
        np.testing.assert_array_equal(r1, r0)
    monkeypatch.setenv("MPISPARSE_FUSED", "1")
    layers = deft_layers(LAYOUT, 2)
    starts, sizes = np.array([l.start for l in layers]), np.array([l.size for l in layers])
    e, g = np.zeros(LAYOUT.n, dtype), grad_of(LAYOUT).astype(dtype)
    got = compiled_compensate.compensate_norms(e, g, starts, sizes)
    np.testing.assert_array_equal(e, g)
    np.testing.assert_allclose(got, layer_norms(g, layers), rtol=1e-6)
    g[layers[1].start] = np.inf
    g[layers[2].start] = np.nan
    bad = compiled_compensate.compensate_norms(np.zeros_like(g), g, starts, sizes)
    assert np.isinf(bad[1]) and np.isnan(bad[2]) and np.isfinite(np.delete(bad, [1, 2])).all()
    assert compiled_compensate.compensate_norms(e, g, starts[::-1], sizes[::-1]) is None  # not ascending


def test_selection_from_the_pass_equals_the_plain_step(monkeypatch):
    """From the second step on (the last k sizes the guess), Alg. 5 takes the candidates the compensation
    pass collected in the rank's layers; output and residual equal the plain steps', also when the guess
    misses every layer (each then selected again from the compensated vector)."""
    def step(sch, t):
        if t == 3 and sch._prev_ks is not None and compiled_segments.enabled():
            sch._prev_ks = np.zeros_like(sch._prev_ks)  # a guess of 0 everywhere: no candidates
        out = sch.step(grad_of(LAYOUT, t=t)).copy()
        return out, sch.memory.residual.copy(), sch.last_from_pass, sch.last_reselected, \
            int(np.count_nonzero(sch.last_ks))

    from mpisparse.backend import compiled_segments
    runs = _fused_and_plain(monkeypatch, 5, step)
    assert [r[2] for r in runs["1"]] == [False, True, True, True, True]
    assert [r[2] for r in runs["0"]] == [False] * 5
    assert runs["1"][3][3] == runs["1"][3][4] > 0  # step 3: every layer with a k selected again
    assert runs["1"][1][3] == runs["1"][2][3] == 0
    for (o1, r1, *_), (o0, r0, *_) in zip(runs["1"], runs["0"]):
        np.testing.assert_array_equal(o1, o0)
        np.testing.assert_array_equal(r1, r0)


def test_scheme_density_one_is_dense_and_state_round_trips():
    sch = create("deft", SelfComm(), LAYOUT, 1.0)
    g = grad_of(LAYOUT)
    np.testing.assert_array_equal(sch.step(g.copy()), g)
    assert sch.selected_global() == LAYOUT.n
    sch = create("deft", SelfComm(), LAYOUT, 0.05)
    sch.step(g.copy())
    state = sch.state_dict()
    assert state["iteration"] == 1 and state["extra"] == {}
    other = create("deft", SelfComm(), LAYOUT, 0.05)
    other.load_state_dict(state)
    g2 = grad_of(LAYOUT, t=1)
    np.testing.assert_array_equal(sch.step(g2.copy()), other.step(g2.copy()))


# --------------------------------------------------------------------------
# bench.select_deft
# --------------------------------------------------------------------------


def test_deft_select_bench_rows(monkeypatch):
    from mpisparse.bench import select_deft

    monkeypatch.setattr(select_deft, "layer_shapes", lambda m: [("x", (3000,)), ("y", (1000,)), ("z", (50,))])
    rows = select_deft.run_deft_select_bench(models=("tiny",), worlds=(1, 2, 4), density=0.05, seed=0, repeats=1)
    assert [r["world_size"] for r in rows] == [1, 2, 4]
    for r in rows:
        assert r["model"] == "tiny" and r["n"] == 4050 and r["k"] == k_for(0.05, 4050)
        assert r["topk_seconds"] > 0 and r["deft_max_seconds"] > 0
        assert r["speedup_measured"] == pytest.approx(r["topk_seconds"] / r["deft_max_seconds"])
        assert r["speedup_predicted"] > 0
    text = select_deft.format_deft_select_bench(rows)
    assert "tiny" in text and "speedup" in text
    with pytest.raises(ValueError, match="worlds"):
        select_deft.run_deft_select_bench(models=("tiny",), worlds=(0,))
