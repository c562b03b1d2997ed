"""``bench step --floor``: the floor pass (``e += g``) timed in the same job as the step's phases, and the
device synchronisation that makes a GPU phase time its kernels (``device.synchronizer``)."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

from conftest import GatherComm, bench_step
from mpisparse.mpi import device
from mpisparse.bench.step import FloorPass
from mpisparse.config import BenchConfig
from mpisparse.backend.fusion import FusionLayout
from mpisparse.results import RunResult
from mpisparse.results.tables import compute_seconds, format_run
from mpisparse.runtimes import validate


def test_the_floor_pass_adds_the_gradient_and_keeps_only_the_recorded_times():
    layout = FusionLayout([("w", (3, 4)), ("b", (5,))])
    calls = []
    floor = FloorPass(layout, np, sync=lambda: calls.append(1))
    g = np.arange(layout.n, dtype=np.float32)
    floor.run(g, record=False)  # a warm-up step: the pass runs, nothing is kept
    floor.run(g, record=True)
    floor.run(g, record=True)
    np.testing.assert_array_equal(floor.buf, 3 * g)  # it did the work it times
    assert len(floor.seconds) == 2 and all(s > 0 for s in floor.seconds)
    assert len(calls) == 6  # a synchronisation before and after each pass


def test_the_floor_result_is_the_max_over_ranks_of_means_and_the_median_of_the_steps_slowest_rank():
    floor = FloorPass(FusionLayout([("w", (4,))]), np)
    floor.seconds = [1.0, 5.0, 3.0]  # this rank: mean 3
    res = floor.result(GatherComm([[2.0, 2.0, 8.0]]))  # the other rank: mean 4
    assert res == {"seconds": 4.0, "seconds_median": 5.0}  # per step max: 2, 5, 8


def test_floor_is_a_flag_of_the_data_parallel_schemes():
    assert validate(BenchConfig(model="ncf", scheme="dgc", floor=True), 2).floor is True
    with pytest.raises(ValueError, match=r"--floor applies to the data-parallel schemes, not to 'asgd' \(ps runtime\)"):
        validate(BenchConfig(model="ncf", scheme="asgd", floor=True), 3)
    with pytest.raises(ValueError, match="--floor is 'yes'; allowed values are True, False"):
        validate(BenchConfig(model="ncf", floor="yes"))


def test_the_table_prints_compute_over_the_floor():
    res = RunResult(scheme="topk", runtime="collective", world_size=2, density_target=0.01, density_actual=0.01,
                    bytes_sent_per_rank=8.0, phases={"compensate": 0.004, "select": 0.001, "exchange_values": 0.5,
                                                     "update": 0.001},
                    phases_mean_over_ranks={}, step_seconds=0.6, step_seconds_mean_over_ranks=0.6, n=10,
                    config={"model": "ncf"}, layers=1, gradient_buffer_bytes=40, peak_rss_bytes_per_rank=400,
                    floor={"seconds": 0.004, "seconds_median": 0.004})
    assert compute_seconds(res) == pytest.approx(0.006)  # the exchange is not compute
    assert "floor e += g      4.000 ms; compute 6.000 ms = 1.50x floor" in format_run(res, "bench step")
    assert RunResult.from_dict(res.to_dict()).floor == res.floor


def test_bench_step_reports_the_floor_beside_the_phases(tmp_path):
    runs = bench_step(2, tmp_path, "--scheme", "topk", "--scheme", "dense", "--density", "0.01", "--iters", "3",
                      "--warmup", "1", "--floor", name="floor")
    for r in runs:
        assert r["config"]["floor"] is True
        assert r["floor"]["seconds"] > 0 and r["floor"]["seconds_median"] > 0
    plain = bench_step(1, tmp_path, "--scheme", "topk", "--iters", "1", "--warmup", "0", name="plain")
    assert "floor" not in plain and plain["config"]["floor"] is False


def test_the_synchronizer_is_none_on_the_host_and_the_current_streams_on_cupy(monkeypatch):
    assert device.synchronizer(np) is None
    assert device.synchronizer(types.SimpleNamespace(__name__="fake_device")) is None
    synced = []
    stream = types.SimpleNamespace(synchronize=lambda: synced.append(1))
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: stream)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    sync = device.synchronizer(fake)
    sync()
    sync()
    assert synced == [1, 1]


def test_the_torch_synchronizer_is_none_on_the_cpu_and_synchronizes_a_cuda_device(monkeypatch):
    torch = pytest.importorskip("torch")
    assert device.torch_synchronizer(torch.device("cpu")) is None
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(dev))
    dev = torch.device("cuda", 1)
    device.torch_synchronizer(dev)()
    assert calls == [dev]


def test_floor_is_in_the_help():
    out = subprocess.run([sys.executable, "-m", "mpisparse", "bench", "step", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    assert "--floor" in out and "compute / floor" in out
