"""One-process tests of the fusion layout, timers, memories, options and generator."""

import numpy as np
import pytest

from mpisparse.backend.fusion import FusionLayout
from mpisparse.bench.gradgen import SyntheticGradients
from mpisparse.schemes.memory import NoMemory, ResidualMemory, make_memory
from mpisparse.schemes import SCHEMES, SchemeOption, k_for, scheme_class, validate_density
from mpisparse.results import format_table
from mpisparse.results.timing import PHASES, PhaseTimer, reduce_over_ranks


# fusion ---------------------------------------------------------------------
def test_layout_offsets_views_and_round_trip():
    lay = FusionLayout([("w", (3, 4)), ("b", (4,)), ("s", ())])
    assert lay.n == 17 and list(lay.offsets) == [0, 12, 16] and list(lay.sizes) == [12, 4, 1]
    vec = np.arange(17, dtype=np.float32)
    views = lay.unflatten(vec)
    assert views[0].shape == (3, 4) and views[1].tolist() == [12, 13, 14, 15] and views[2].shape == ()
    views[1][0] = -1  # views, not copies
    assert vec[12] == -1
    again = lay.flatten([np.ones((3, 4)), np.zeros(4), np.array(5.0)])
    assert again.dtype == np.float32 and again.tolist() == [1] * 12 + [0] * 4 + [5]
    assert list(lay.layer_of(np.array([0, 11, 12, 16]))) == [0, 0, 1, 2]


@pytest.mark.parametrize("layers, msg", [
    ([("a", (2,)), ("a", (3,))], "appears twice"),
    ([("a", (-1,))], "dimensions must be >= 0"),
    ([], "at least one layer"),
])
def test_layout_rejects_bad_layers(layers, msg):
    with pytest.raises(ValueError, match=msg):
        FusionLayout(layers)


def test_flatten_checks_sizes():
    lay = FusionLayout([("w", (2, 2))])
    with pytest.raises(ValueError, match="expects 4 elements"):
        lay.flatten([np.zeros(3)])


# timing ---------------------------------------------------------------------
def test_timer_records_phases_per_step_and_skips_warmup():
    t = PhaseTimer()
    t.recording = False
    with t.step():
        with t.phase("select"):
            pass
    assert list(t.records) == []
    t.recording = True
    for _ in range(2):
        with t.step():
            with t.phase("select"):
                sum(range(1000))
            with t.phase("select"):
                pass
            with t.phase("update"):
                pass
    assert len(t.records) == 2
    m = t.means()
    assert set(m) == {"select", "update", "step"}
    assert m["step"] >= m["select"] + m["update"] > 0


def test_timer_keeps_the_last_records_and_averages_every_step(monkeypatch):
    """A long run keeps a bounded number of per-step records; the means still count every timed step."""
    import mpisparse.results.timing as timing

    monkeypatch.setattr(timing, "KEEP_STEPS", 3)
    t = PhaseTimer()
    for i in range(5):
        with t.step():
            t.carve("wait", float(i))  # no open phase: all of it to wait, a known value per step
    assert [r["wait"] for r in t.records] == [2.0, 3.0, 4.0] and t.steps == 5
    assert t.means()["wait"] == pytest.approx(2.0)  # (0 + 1 + 2 + 3 + 4) / 5, not the kept records' 3.0


def test_a_nested_phase_counts_once_in_the_innermost(monkeypatch):
    """The library's exchange runs inside a caller's ``backward`` phase: its phases are not counted twice."""
    import mpisparse.results.timing as timing

    t = PhaseTimer()
    clock = iter([0.0, 1.0, 3.0, 3.5, 4.0, 10.0, 11.0, 12.0])  # each phase opens, then closes innermost first
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    with t.step():  # 0.0
        with t.phase("backward"):  # 1.0
            with t.phase("exchange_values"):  # 3.0
                with t.phase("wait"):  # 3.5 .. 4.0
                    pass
            # exchange_values closes at 10.0
        # backward closes at 11.0 -> step ends at the next reading
    rec = t.records[0]
    assert rec["wait"] == pytest.approx(0.5)
    assert rec["exchange_values"] == pytest.approx(7.0 - 0.5)
    assert rec["backward"] == pytest.approx(10.0 - 7.0)  # 11 - 1, less the 7 s of the phases inside it
    assert rec["backward"] + rec["exchange_values"] + rec["wait"] == pytest.approx(10.0)


def test_slowest_step_over_ranks_matches_the_gathered_reference():
    from conftest import SelfComm

    from mpisparse.results.build import slowest_per_step, slowest_per_step_over_ranks

    records = [{"select": 1.0, "step": 2.0}, {"select": 3.0, "exchange_values": 0.5, "step": 4.5},
               {"select": 0.5, "step": 9.0}]
    mean, typical = slowest_per_step_over_ranks(SelfComm(), records, ("mean", "median"))
    assert mean == slowest_per_step([records]) and typical == slowest_per_step([records], over_steps="median")
    assert typical == {"select": 1.0, "exchange_values": 0.0, "step": 4.5}
    assert slowest_per_step_over_ranks(SelfComm(), [], ("mean",)) == [None]


def test_timer_rejects_unknown_phase_and_disabled_is_noop():
    t = PhaseTimer(enabled=False)
    with pytest.raises(ValueError, match="unknown phase 'selekt'"):
        t.phase("selekt")
    with t.step():
        with t.phase("select"):
            pass
    assert list(t.records) == [] and t.means() == {}
    assert "exchange_values" in PHASES and "server_apply" in PHASES


class FakeComm:
    def __init__(self, values):
        self.values = values

    def allgather_obj(self, obj):
        return self.values


def test_reduce_over_ranks_mean_and_max_missing_counts_zero():
    r = reduce_over_ranks(FakeComm([{"select": 1.0, "step": 2.0}, {"step": 4.0, "update": 1.0}]), {})
    assert r["select"] == {"mean": 0.5, "max": 1.0}
    assert r["step"] == {"mean": 3.0, "max": 4.0}
    assert list(r) == ["select", "update", "step"]
    text = format_table("T", r, {"bytes": "10"})
    assert "select" in text and "step" in text and "bytes" in text


# memory ---------------------------------------------------------------------
def test_residual_memory_conserves_mass():
    rng = np.random.default_rng(0)
    mem = ResidualMemory()
    total_in = np.zeros(50)
    total_sent = np.zeros(50)
    for _ in range(5):
        g = rng.standard_normal(50).astype(np.float32)
        total_in += g
        acc = mem.compensate(g)
        idx = rng.choice(50, 7, replace=False)
        sent = np.zeros(50)
        sent[idx] = acc[idx]
        before = acc.astype(np.float64).copy()
        mem.update(acc, idx)
        np.testing.assert_allclose(sent + mem.residual, before, rtol=1e-6)
        total_sent += sent
    np.testing.assert_allclose(total_sent + mem.residual, total_in, rtol=1e-5, atol=1e-5)


def test_residual_memory_state_round_trip_and_no_memory():
    mem = ResidualMemory()
    mem.update(mem.compensate(np.ones(4, np.float32)), np.array([1]))
    other = ResidualMemory()
    other.load_state_dict(mem.state_dict())
    assert other.residual.tolist() == [1, 0, 1, 1]
    nm = make_memory(False)
    g = np.ones(3, np.float32)
    assert isinstance(nm, NoMemory) and nm.compensate(g) is g and nm.state_dict() == {}


# options and registry ---------------------------------------------------------
def test_density_validation_messages():
    assert validate_density("0.5") == 0.5
    for bad in (0, 1.01, -1, "x", None):
        with pytest.raises(ValueError, match="--density"):
            validate_density(bad)


def test_k_for_bounds():
    assert k_for(0.001, 10) == 1 and k_for(1.0, 10) == 10 and k_for(0.5, 11) == 6


def test_scheme_option_ranges():
    o = SchemeOption("beta", float, 1.0, "h", low=0.0, high=1.0, low_open=True)
    assert o.validate("0.5") == 0.5
    with pytest.raises(ValueError, match=r"--beta is 0.0; allowed range is \(0, 1\]"):
        o.validate(0.0)
    with pytest.raises(ValueError, match="--beta must be a float"):
        o.validate("x")


def test_registry_and_unknown_names():
    assert {"dense", "topk", "randomk", "threshold"} <= set(SCHEMES)
    with pytest.raises(ValueError, match="unknown scheme 'nope'; choose one of: "):
        scheme_class("nope")
    with pytest.raises(ValueError, match="scheme 'dense' has no option --layerwise"):
        scheme_class("dense").validate_options({"layerwise": True})


def test_every_scheme_has_docs_and_declared_options():
    for name, cls in SCHEMES.items():
        assert cls.name == name and cls.__doc__ or cls.__module__
        for o in cls.options:
            assert o.help and o.flag.startswith("--")


# synthetic gradients --------------------------------------------------------------
def test_synthetic_gradients_are_seeded_and_partially_shared():
    lay = FusionLayout([("a", (1000,)), ("b", (3000,))])
    g0 = SyntheticGradients(lay, 0, seed=1).fill(lay.empty(), 5)
    again = SyntheticGradients(lay, 0, seed=1).fill(lay.empty(), 5)
    g1 = SyntheticGradients(lay, 1, seed=1).fill(lay.empty(), 5)
    np.testing.assert_array_equal(g0, again)
    corr = np.corrcoef(g0, g1)[0, 1]
    assert 0.2 < corr < 0.8, corr  # shared component: ranks correlate, but are not equal
    later = SyntheticGradients(lay, 0, seed=1).fill(lay.empty(), 6)
    assert not np.array_equal(g0, later)
