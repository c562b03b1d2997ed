"""``bench step --separate-wait``: a barrier before every collective, its time in phase ``wait``, so the
exchange phases hold the transfer alone (``PhaseTimer.carve``, ``Communicator.wait_timer``)."""

from __future__ import annotations

import pytest

from conftest import bench_step
from mpisparse.config import BenchConfig
from mpisparse.results.timing import PhaseTimer
from mpisparse.runtimes import validate


def test_carve_moves_time_from_the_open_phase_to_wait():
    t = PhaseTimer()
    with t.step():
        with t.phase("exchange_values"):
            t.carve("wait", 0.25)
        with t.phase("update"):
            pass
    [rec] = t.records
    assert rec["wait"] == 0.25 and rec["exchange_values"] < 0  # the phase itself took ~0 s
    assert rec["exchange_values"] + rec["wait"] >= 0
    t.carve("wait", 1.0)  # outside a timed step: nothing recorded
    t.recording = False
    with t.step():
        t.carve("wait", 1.0)
    assert list(t.records) == [rec]
    with pytest.raises(ValueError, match="unknown phase 'idle'"):
        t.carve("idle", 0.1)


def test_separate_wait_applies_to_flat_data_parallel_schemes_only():
    validate(BenchConfig(scheme="deft", separate_wait=True), 2)
    with pytest.raises(ValueError, match="--separate-wait .* not to 'cltk' with --hierarchical"):
        validate(BenchConfig(scheme="cltk", separate_wait=True, hierarchical=True), 4)
    with pytest.raises(ValueError, match=r"--separate-wait .* not to 'asgd' \(ps runtime\)"):
        validate(BenchConfig(scheme="asgd", separate_wait=True), 3)
    with pytest.raises(ValueError, match="--separate-wait"):
        validate(BenchConfig(scheme="topk", separate_wait="yes"), 2)


def test_bench_step_times_the_wait_before_each_collective_as_its_own_phase(tmp_path):
    """Rank 1 waits for rank 0 at every collective; with --separate-wait that time is 'wait', and what
    is left in the exchange phases is the transfer."""
    plain = bench_step(2, tmp_path, "--scheme", "cltk", "--scheme", "deft", "--density", "0.01", "--iters", "3",
                       "--warmup", "1", name="plain")
    split = bench_step(2, tmp_path, "--scheme", "cltk", "--scheme", "deft", "--density", "0.01", "--iters", "3",
                       "--warmup", "1", "--separate-wait", name="split")
    for p, s in zip(plain, split):
        assert "wait" not in p["phases"] and s["config"]["separate_wait"] is True
        assert s["phases"]["wait"] > 0
        assert s["phases_mean_over_ranks"]["exchange_indices"] >= 0
        assert s["phases_slowest_step"]["step"] >= s["step_seconds_mean_over_ranks"] * 0.5
