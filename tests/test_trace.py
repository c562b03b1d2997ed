"""The Chrome trace of a run: one process per rank, steps with their phases nested inside."""

import json
import time

import pytest

from conftest import SelfComm  # noqa: E402
from mpisparse.results.trace import trace_events, write_trace
from mpisparse.results.timing import PhaseTimer
from mpisparse.runtimes import validate


def check_trace(obj, ranks, steps, phases):
    """Spans nest in their step and the steps cover their phases: what a trace viewer needs."""
    events = obj["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(ranks)}
    for r in range(ranks):
        mine = [e for e in events if e["ph"] == "X" and e["pid"] == r]
        step_events = [e for e in mine if e["cat"] == "step"]
        assert [e["name"] for e in step_events] == [f"step {i}" for i in range(steps)]
        for st in step_events:
            inside = [e for e in mine if e["cat"] == "phase" and e["args"]["step"] == st["args"]["step"]]
            assert {e["name"] for e in inside} == set(phases)
            for e in inside:
                assert st["ts"] <= e["ts"] and e["ts"] + e["dur"] <= st["ts"] + st["dur"] + 1e-3, (st, e)
            assert sum(e["dur"] for e in inside) <= st["dur"] + 1e-3
    assert min(e["ts"] for e in events if e["ph"] == "X") == 0


def test_a_traced_timer_writes_nested_phases(tmp_path):
    timer = PhaseTimer(trace=True)
    timer.recording = False
    with timer.step():  # a warm-up step: not recorded, not traced
        pass
    timer.recording = True
    for _ in range(3):
        with timer.step():
            with timer.phase("select"):
                time.sleep(0.002)
            with timer.phase("exchange_values"):
                time.sleep(0.001)
    path = tmp_path / "trace.json"
    write_trace(path, SelfComm(), timer)
    obj = json.loads(path.read_text())
    check_trace(obj, 1, 3, ["select", "exchange_values"])
    sel = [e for e in obj["traceEvents"] if e.get("name") == "select"]
    assert all(e["dur"] >= 2000 for e in sel)  # microseconds


def test_events_align_ranks_on_the_earliest_start():
    ev = trace_events([[("step", 10.0, 10.5, 0), ("select", 10.1, 10.2, 0)],
                       [("step", 10.25, 10.75, 0), ("select", 10.3, 10.4, 0)]])
    steps = {e["pid"]: e for e in ev if e.get("cat") == "step"}
    assert steps[0]["ts"] == 0 and steps[1]["ts"] == pytest.approx(250000) and steps[1]["dur"] == pytest.approx(5e5)


def test_an_untraced_timer_keeps_no_spans():
    timer = PhaseTimer()
    with timer.step():
        with timer.phase("select"):
            pass
    assert timer.spans is None and len(timer.records) == 1


# --------------------------------------------------------------------------- --trace on real runs
def _check_trace(path, ranks, phases):
    """Valid Chrome trace JSON: every rank's process, steps in order, phases nested in their step and covering
    at most the step."""
    doc = json.loads(path.read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == set(range(ranks))
    for rank in range(ranks):
        steps = sorted((e for e in events if e["pid"] == rank and e["cat"] == "step"), key=lambda e: e["ts"])
        assert steps and [e["args"]["step"] for e in steps] == list(range(len(steps)))
        for a, b in zip(steps, steps[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3  # ordered, not overlapping
        for st in steps:
            inner = [e for e in events if e["pid"] == rank and e["cat"] == "phase"
                     and e["args"]["step"] == st["args"]["step"]]
            assert inner, st
            for e in inner:
                assert st["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= st["ts"] + st["dur"] + 1e-3, (e, st)
            # a phase may nest in another (the library's exchange runs at the end of backward): the outermost
            # phases do not overlap, so their durations add up to at most the step
            outer = [e for e in inner if not any(o is not e and o["ts"] - 1e-3 <= e["ts"] and
                                                 e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 1e-3 and o["dur"] > e["dur"]
                                                 for o in inner)]
            assert sum(e["dur"] for e in outer) <= st["dur"] + 1e-3
        names = {e["name"] for e in events if e["pid"] == rank and e["cat"] == "phase"}
        assert set(phases) <= names, names
    return events


@pytest.mark.mpi
def test_bench_step_trace_two_ranks_two_schemes(tmp_path):
    from conftest import mpi_run

    trace = tmp_path / "t.json"
    mpi_run(2, ["bench", "step", "--model", "ncf", "--scheme", "topk", "--scheme", "cltk", "--iters", "3",
                "--warmup", "1", "--trace", str(trace)], module=True)
    events = _check_trace(tmp_path / "t-topk.json", 2, ("compensate", "select", "exchange_indices", "update"))
    assert len([e for e in events if e["cat"] == "step"]) == 2 * 3  # timed steps only, not the warm-up
    _check_trace(tmp_path / "t-cltk.json", 2, ("compensate", "exchange_values"))
    assert not trace.exists()


@pytest.mark.mpi
def test_train_trace_has_forward_and_backward(tmp_path):
    from conftest import mpi_run

    trace = tmp_path / "train.json"
    mpi_run(2, ["train", "--model", "mlp", "--data", "digits", "--scheme", "topk", "--density", "0.05",
                "--epochs", "1", "--trace", str(trace)], module=True)
    _check_trace(trace, 2, ("forward", "backward", "compensate", "select"))


def test_trace_refuses_what_it_cannot_trace():
    from mpisparse.config import BenchConfig, MPConfig, TrainConfig

    with pytest.raises(ValueError, match="--trace applies to the data-parallel schemes .*; scheme 'slimdp' is not one"):
        validate(BenchConfig(scheme="slimdp", trace="t.json"), 3)
    with pytest.raises(ValueError, match="--trace applies to data-parallel training; a pipeline"):
        validate(TrainConfig(scheme="dense", mp=MPConfig(stages=2), trace="t.json"), 2)
