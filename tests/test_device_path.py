"""The device-resident data-parallel step, proven on CPU with a strict fake device.

:mod:`gpu_emu.strictcupy` stands in for CuPy: its arrays refuse implicit
conversion to NumPy (as CuPy's do) and count every device-to-host copy; the
package's CUDA C kernels run on the CPU emulator.  The package's code is the
one a GPU runs: only the array module (and, for ``train``, the torch device)
is swapped.

* the strict fake itself behaves as CuPy where it matters;
* scheme state lives on the device, a checkpoint holds host arrays and loads
  back onto the device (round trip, same steps after);
* ``DistributedOptimizer`` keeps the fusion buffer on the device, writes the
  update into ``.grad`` in one fused copy and reads its finite flags once per
  agreement (``library`` of the MPI job below);
* ``tests/mpi/device_path.py`` at 1 and 2 ranks: every data-parallel scheme's
  ``bench step`` and a short ``train`` give exactly the CPU run's updates and
  losses, and the device-to-host copies per step are 0 for the exchange with
  a CUDA-aware MPI (only scalar reads the schemes and kernels make on
  purpose, none larger than 1 KiB; dense: none at all) and exactly the
  exchange buffers when staging.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import HERE, mpi_run
from gpu_emu import fakecupy, strictcupy
from mpisparse import backend
from mpisparse.backend.fusion import FusionLayout
from mpisparse.schemes import create
from mpisparse.results.timing import PhaseTimer
from mpisparse.runtimes import validate
from conftest import SelfComm  # noqa: E402

pytestmark = pytest.mark.skipif(not fakecupy.compiler_available(),
                                reason="the CPU emulator of the CUDA kernels needs g++ (or $CXX)")

#: the largest read a step makes on purpose: scalars (a threshold, a count, the finite flag) and DEFT's
#: per-layer norms (8 bytes a layer); every exchange buffer of these runs is larger (checked below)
SCALAR_BYTES = 1024


@pytest.fixture
def cp(monkeypatch):
    """Strict CuPy with the NumPy kernels behind the device wall (fast)."""
    return strictcupy.install(monkeypatch, kernels="host")


@pytest.fixture
def cp_emu(monkeypatch):
    """Strict CuPy with the package's CUDA C kernels on the CPU emulator (slow: a few launches only)."""
    return strictcupy.install(monkeypatch, kernels="emu")


# ----------------------------------------------------------------------------- the strict fake
def test_strict_arrays_refuse_implicit_conversion_and_count_copies(cp):
    x = cp.asarray(np.arange(6, dtype=np.float32))
    assert backend.array_module(x) is cp and backend.is_device_array(x)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(x)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.array(x)
    with pytest.raises(TypeError, match="Unsupported type"):
        x + np.ones(6, np.float32)  # mixing with a host array
    with pytest.raises(TypeError, match="Unsupported type"):
        x[np.array([1, 2])]  # host indices
    with pytest.raises(TypeError, match="array module"):
        np.concatenate([x, x])  # a NumPy function on device arrays
    strictcupy.reset_counts()
    y = x * np.float32(2) + 1  # NumPy scalars and Python numbers are fine, and stay on the device
    s = y.sum()
    assert isinstance(s, cp.ndarray) and s.shape == ()  # a reduction is a 0-d device array, as in CuPy
    assert strictcupy.COUNTS["d2h"] == 0
    assert float(s) == 36.0
    assert int(y[1]) == 3 and bool(y[0])
    assert y.get().tolist() == [1, 3, 5, 7, 9, 11]
    assert cp.asnumpy(y)[2] == 5
    assert y[3].item() == 7 and y[:2].tolist() == [1, 3]
    assert strictcupy.COUNTS["d2h"] == 7 and strictcupy.D2H_SIZES == [4, 4, 4, 24, 24, 4, 8]


def test_backend_helpers_stay_on_the_device(cp_emu):
    cp = cp_emu
    rng = np.random.default_rng(0)
    out_h = np.empty(50, np.float32)
    idx_h = np.concatenate([rng.choice(50, 7, replace=False), rng.choice(50, 9, replace=False)]).astype(np.int32)
    vals_h = rng.standard_normal(16).astype(np.float32)
    out_d = cp.empty(50, dtype=np.float32)
    strictcupy.reset_counts()
    backend.scatter_sum(out_d, cp.asarray(idx_h), cp.asarray(vals_h), np.array([7, 9]), 0.5)
    assert backend.unique_count(cp.asarray(idx_h)) == np.unique(idx_h).size
    assert bool(backend.all_finite(out_d)) and strictcupy.COUNTS["d2h"] == 1  # the bool() only
    backend.scatter_sum(out_h, idx_h, vals_h, np.array([7, 9]), 0.5)
    np.testing.assert_array_equal(out_d.get(), out_h)
    assert backend.to_module(out_d, np) is not None and isinstance(backend.to_module(out_d, np), np.ndarray)
    assert backend.array_module(backend.to_module(out_h, cp)) is cp


# ----------------------------------------------------------------------------- state on the device
LAYOUT = FusionLayout([("a", (40, 30)), ("b", (30,)), ("c", (700,))])
STATEFUL = [("topk", {}), ("threshold", {}), ("dgc", {"sample_fraction": 1.0}), ("cltk", {"beta": 0.5}),
            ("dct", {"lifespan": 3}), ("gtopk", {}), ("deft", {}), ("randomk", {})]


def grads(n, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("name,opts", STATEFUL + [("dense", {})], ids=[s for s, _ in STATEFUL] + ["dense"])
def test_the_update_written_into_a_device_gradient_is_the_own_output(cp, name, opts):
    """step(g, out=g) on (strict) device arrays: the same update as the scheme's own device output, in g."""
    g = grads(LAYOUT.n, 4, seed=len(name) + 1)
    own, into = (create(name, SelfComm(), LAYOUT, 0.05, timer=PhaseTimer(enabled=False), seed=4, **opts)
                 for _ in range(2))
    for sch in (own, into):
        sch.use_array_module(cp)
    for t in range(4):
        want = own.step(cp.asarray(g[t]))
        x = cp.asarray(g[t])
        assert into.step(x, out=x) is x
        np.testing.assert_array_equal(x.get(), want.get())
    assert into._out is None


@pytest.mark.parametrize("name,opts", STATEFUL, ids=[s for s, _ in STATEFUL])
def test_checkpoint_round_trip_of_device_state(cp, name, opts):
    g = grads(LAYOUT.n, 5, seed=len(name))
    a = create(name, SelfComm(), LAYOUT, 0.05, timer=PhaseTimer(enabled=False), seed=4, **opts)
    a.use_array_module(cp)
    for t in range(2):
        a.step(cp.asarray(g[t]))
    diag = a.diagnostics()  # runs on device state (no implicit conversion anywhere)
    assert diag["error_norm"] >= 0.0
    state = a.state_dict()
    buffers = [v for v in state["memory"].values() if isinstance(v, (np.ndarray, cp.ndarray))]
    assert all(type(v) is np.ndarray for v in buffers)  # a checkpoint holds host arrays
    assert name == "randomk" or buffers  # every scheme with memory saved some
    b = create(name, SelfComm(), LAYOUT, 0.05, timer=PhaseTimer(enabled=False), seed=4, **opts)
    b.use_array_module(cp)
    b.load_state_dict(state)
    for attr in a.memory.buffers:
        if state["memory"].get(attr) is not None:  # what a checkpoint keeps (working buffers are remade)
            restored = getattr(b.memory, attr)
            assert isinstance(restored, cp.ndarray), attr  # back on the device
            np.testing.assert_array_equal(restored.get(), getattr(a.memory, attr).get())
    for t in range(2, 5):
        np.testing.assert_array_equal(a.step(cp.asarray(g[t])).get(), b.step(cp.asarray(g[t])).get())


def test_state_loaded_before_the_first_step_moves_to_the_device_with_it(cp):
    g = grads(LAYOUT.n, 3)
    a = create("dgc", SelfComm(), LAYOUT, 0.05, timer=PhaseTimer(enabled=False), sample_fraction=1.0)
    for t in range(2):
        a.step(g[t].copy())  # host
    b = create("dgc", SelfComm(), LAYOUT, 0.05, timer=PhaseTimer(enabled=False), sample_fraction=1.0)
    b.load_state_dict(a.state_dict())
    out = b.step(cp.asarray(g[2]))
    assert isinstance(out, cp.ndarray) and isinstance(b.memory.u, cp.ndarray)
    np.testing.assert_array_equal(out.get(), a.step(g[2].copy()))


# ----------------------------------------------------------------------------- DistributedOptimizer
def test_distributed_optimizer_keeps_the_step_on_the_device(cp_emu, monkeypatch):
    cp = cp_emu
    from mpisparse.torch import DistributedOptimizer

    def run(device: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        if device:
            monkeypatch.setattr(backend, "torch_array_module", lambda t: cp)  # a CPU tensor stands in for CUDA
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, "topk",
                                   0.2, comm=SelfComm(), seed=1)
        monkeypatch.setattr(backend, "torch_array_module", lambda t: np)
        assert isinstance(opt.buffer, cp.ndarray) == device
        x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 3
        reads = []
        for t in range(4):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if t == 2:  # one weight's gradient NaN: the exchange at the end of backward skips the step
                loss = loss + float("nan") * model[0].weight[0, 0]
            before = strictcupy.COUNTS["d2h"]
            loss.backward()  # the exchange runs here (DDP's contract); step() applies
            opt.step()
            reads.append(strictcupy.COUNTS["d2h"] - before)
        return [p.detach().clone() for p in model.parameters()], opt, reads

    host_params, host_opt, host_reads = run(False)
    dev_params, dev_opt, dev_reads = run(True)
    for a, b in zip(host_params, dev_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert host_opt.skipped_steps == dev_opt.skipped_steps == 1
    assert host_reads == [0, 0, 0, 0]
    # the finite flags (one 12-byte read per agreement: the gradient's; on stepped steps also the update's), plus
    # the top-k kernel's own count reads
    assert all(r >= 1 for r in dev_reads) and dev_reads[2] == 1
    assert max(strictcupy.D2H_SIZES) <= SCALAR_BYTES


# ----------------------------------------------------------------------------- every scheme, 1 and 2 ranks
def expected_staging_d2h(key: str, rank: int, world: int, step: int, calls: dict) -> int:
    """Device-to-host staging copies of one step: the exchange buffers the scheme hands to MPI (``calls``:
    the step's collective calls by name)."""
    if key in ("dense", "randomk"):
        return 1  # one Allreduce
    if key == "powersgd":
        return 3  # Allreduces of the dense layers (the models' biases), of every P, of every Q
    if key == "oktopk":
        # split: one Alltoallv of (index, value) pairs; balance (only when a rank holds over 1/8 more than an
        # equal block: the data decide, never at W = 1): one more; the gather: one Allgatherv of pairs (the
        # probe counts' Allgatherv between estimations, the boundaries, counts and search rounds are host arrays)
        assert calls["alltoallv"] in ((1,) if world == 1 else (1, 2)), calls
        assert calls["allgatherv"] in ((1,) if world == 1 else (1, 2)), calls
        return calls["alltoallv"] + 1
    if key == "cltk":
        return 1 + (rank == step % world)  # the leader's index Bcast, then the values' Allreduce
    if key == "gtopk":
        return 0 if world == 1 else 2  # indices and values of the one doubling round (W = 2)
    return 2  # Allgatherv of indices and of values (deft: indices Allgatherv, values Allreduce)


#: one rank: the same path without a peer (extended: CI runs it, the default suite the two-rank job)
@pytest.fixture(scope="module", params=[pytest.param(1, marks=pytest.mark.extended), 2])
def device_runs(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("devpath") / "report.json"
    mpi_run(request.param, [str(HERE / "mpi" / "device_path.py"), str(out), "both"], timeout=600)
    return request.param, json.loads(out.read_text())


def test_every_scheme_equals_the_cpu_run_and_copies_only_exchange_buffers(device_runs):
    world, report = device_runs
    report = {k: v for k, v in report.items() if k != "library"}
    assert {k.split(":")[0] for k in report} == {"bench", "train"} and len(report) == 24
    for key, entry in report.items():
        kind, scheme = key.split(":")
        aware, staged = entry["aware"], entry["staged"]
        for mode in (aware, staged):
            assert mode["same_steps"] and mode["steps"] >= 3, key
            assert mode["max_diff"] == 0.0, (key, mode["max_diff"])  # same updates / losses as the CPU run
            assert mode["cpu_result_staging"] is None  # a CPU run reports no staging
        for rank, (a, s) in enumerate(zip(aware["ranks"], staged["ranks"])):
            steps = len(a["d2h"])
            # CUDA-aware: nothing staged; the device-to-host reads left are scalars the step reads on purpose
            assert a["staging_d2h"] == [0] * steps and a["staging_h2d"] == [0] * steps, key
            assert a["d2h_max_bytes"] <= SCALAR_BYTES, (key, a["d2h_max_bytes"])
            if scheme == "dense":
                # train: one read of the finite flags (the gradient's and the update's, agreed together after
                # the exchange: an overflowing sum, or a non-finite gradient anywhere, skips on every rank)
                assert a["d2h"] == [0 if kind == "bench" else 1] * steps, key
            # staging: exactly the exchange buffers on top, counted alike by the fake and the communicator
            want = [expected_staging_d2h(scheme.split("-")[0], rank, world, t, s["calls"][t]) for t in range(steps)]
            assert s["calls"] == a["calls"], key  # staged or not, the same collectives
            assert s["staging_d2h"] == want, (key, rank, s["staging_d2h"], want)
            assert [x - y for x, y in zip(s["d2h"], a["d2h"])] == want, (key, rank)
            if any(want):
                assert s["d2h_max_bytes"] > SCALAR_BYTES, key  # the bound tells staging from scalar reads
        assert aware["staging_copies_per_step"] == {"d2h": 0.0, "h2d": 0.0, "d2h_bytes": 0.0, "h2d_bytes": 0.0}
        per_rank_mean = [np.mean(s["staging_d2h"]) for s in staged["ranks"]]
        assert staged["staging_copies_per_step"]["d2h"] == pytest.approx(max(per_rank_mean)), key


def test_the_library_reads_its_flags_once_a_step_and_writes_back_in_one_fused_copy(device_runs):
    """``library`` of the same job: ``DistributedOptimizer`` on the strict fake device at W ranks (a bfloat16
    parameter among float32 ones), 5 steps, the last rank's gradient NaN at step 3 (``NAN_STEP``).

    Per step: the host reads of finite flags, counted by the library (``flag_reads``) and, independently, by
    the fake device (every device-to-host copy; the host kernels behind it read nothing); the write-back's
    fused operations (``write_back_ops``) and the calls of ``torch._foreach_copy_`` (the gather's and the
    write-back's: no per-parameter copies); ``.grad`` after backward against the NumPy mean of all ranks'
    gradients (in each parameter's dtype). The first step also reads the parameters' check at once (its
    snapshot: nothing is known of them yet); from the second on a step reads once -- dense and the
    overlapped exchange -- or twice -- topk --layerwise after backward, whose error feedback must not take
    in a non-finite gradient, so the gradient is agreed before its exchange and the update after it.
    """
    world, report = device_runs
    lib = report["library"]
    assert set(lib) == {"dense", "topk-layerwise", "dense-overlap", "topk-layerwise-overlap"}
    for key, run in lib.items():
        steps = run["steps"]
        assert run["params_equal_on_ranks"], key
        reads = 2 if key == "topk-layerwise" else 1
        gathers = max(run["buckets"], 1)  # one fused gather per bucket (one without overlap)
        for t, st in enumerate(steps):
            assert st["d2h"] == st["flag_reads"], (key, t, st)  # every device-to-host copy is a flag read
            if t == 3:  # NAN_STEP: skipped on every rank, every .grad NaN, nothing written back
                assert st["skipped"] == 1 and not st["stepped"] and st["all_nan"], (key, st)
                assert st["write_back_ops"] == 0 and st["foreach_copies"] == gathers, (key, st)
                assert st["flag_reads"] == 1, (key, st)  # topk: the gradient's agreement, no exchange
                continue
            assert st["stepped"] and st["skipped"] == 0 and not st["all_nan"], (key, t, st)
            assert st["diff"] <= (0.0 if world <= 2 else 1e-6), (key, t, st["diff"])  # the mean of all ranks
            assert st["write_back_ops"] == 1, (key, t, st)
            snapshot = t == 0  # the first step's snapshot copy and its immediate parameter read
            assert st["foreach_copies"] == gathers + 1 + snapshot, (key, t, st)
            assert st["flag_reads"] == reads + snapshot, (key, t, st)


# ----------------------------------------------------------------------------- options and refusals
def test_device_option_is_validated_and_refused_where_the_runtime_stays_on_the_host():
    from mpisparse.config import BenchConfig, MPConfig, TrainConfig

    with pytest.raises(ValueError, match="--device"):
        validate(TrainConfig(device="gpu"))
    with pytest.raises(ValueError, match="--device"):
        validate(BenchConfig(model="ncf", device="tpu"))
    validate(TrainConfig(device="cuda", scheme="deft"), 2)  # data parallel: accepted
    validate(BenchConfig(model="ncf", scheme="dgc", device="cuda"), 2)
    with pytest.raises(ValueError, match=r"^--device cuda: the parameter-server runtime \(scheme slimdp\)"):
        validate(TrainConfig(device="cuda", scheme="slimdp"), 3)
    with pytest.raises(ValueError, match=r"^--device cuda: the pipeline runtime \(--mp-stages\)"):
        validate(TrainConfig(device="cuda", mp=MPConfig(stages=2)), 2)


def test_cuda_without_cupy_is_one_usage_line_before_mpi(monkeypatch):
    import sys

    from click.testing import CliRunner

    from mpisparse.cli.main import cli

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    for args in (["bench", "step", "--device", "cuda", "--model", "ncf"], ["train", "--device", "cuda"],
                 ["bench", "overlap", "--device", "cuda"]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, res.output
        assert "--device cuda is not usable here: CuPy is not installed" in res.output
