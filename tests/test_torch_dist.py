"""The schemes over torch.distributed (gloo, 2 CPU processes) and as a DDP communication hook."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import HERE, launch, mpi_run, mpi_script

torch = pytest.importorskip("torch")
SCRIPT = mpi_script("check_torch_dist.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_run(world: int, path) -> None:
    port = _free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    for v in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        env.pop(v, None)
    procs = [subprocess.Popen([sys.executable, SCRIPT, "gloo", str(path)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, f"gloo rank failed ({p.returncode}):\n{o[-2000:]}\n{e[-3000:]}"
    assert f"gloo OK on {world} ranks" in outs[0][0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("torch_dist")
    gloo_run(2, d / "gloo.npz")
    mpi_run(2, [SCRIPT, "mpi", str(d / "mpi.npz")])
    return np.load(d / "gloo.npz"), np.load(d / "mpi.npz")


WIRE_KEYS = [f"{name}/{wire}" for name in ("dense", "topk") for wire in ("float16", "bfloat16")]


@pytest.mark.mpi
@pytest.mark.parametrize("scheme", ["dense", "topk", "randomk", "threshold", "cltk", "deft", "dct", "gtopk", "dgc",
                                    "oktopk", *WIRE_KEYS])
def test_gloo_gives_the_mpi_aggregate_and_bytes(runs, scheme):
    gloo, mpi = runs
    for t in range(4):
        np.testing.assert_allclose(gloo[f"{scheme}/{t}"], mpi[f"{scheme}/{t}"], rtol=1e-6, atol=1e-9,
                                   err_msg=f"{scheme} step {t}")
        assert int(gloo[f"{scheme}/bytes/{t}"][0]) == int(mpi[f"{scheme}/bytes/{t}"][0]), (scheme, t)
    assert np.count_nonzero(gloo[f"{scheme}/3"]) > 0


def _bfloat16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def _wire_mean(grads: np.ndarray, wire: str) -> np.ndarray:
    """NumPy's dense mean over ranks (rows of ``grads``) with ``wire`` values on the wire: each rank's values
    rounded (float16: ``g / W``, so that the sum cannot overflow), summed in float32 in rank order, the sum
    rounded once more, then divided by W as the scheme does."""
    world = grads.shape[0]
    if wire == "float16":
        parts = (grads / np.float32(world)).astype(np.float16).astype(np.float32)
    else:
        parts = _bfloat16(grads)
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    if wire == "float16":
        total = total.astype(np.float16).astype(np.float32) * np.float32(world)
    else:
        total = _bfloat16(total)
    return total * np.float32(1.0 / world)


@pytest.mark.mpi
@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_gloo_sums_16_bit_values_as_numpy_does(runs, wire):
    gloo, _ = runs
    for t in range(4):
        want = _wire_mean(gloo[f"dense/{wire}/grads/{t}"], wire)
        np.testing.assert_array_equal(gloo[f"dense/{wire}/{t}"], want, err_msg=f"dense {wire} step {t}")
        assert not np.array_equal(want, gloo[f"dense/{t}"])  # the rounding is there: not the float32 mean
    # a step sends half the bytes of a float32 ring Allreduce (the reduce-scatter and the gather of 16-bit
    # blocks); the counts are cumulative over the run
    def step_bytes(key):
        return int(gloo[f"{key}/bytes/3"][0]) - int(gloo[f"{key}/bytes/2"][0])

    assert step_bytes(f"dense/{wire}") * 2 == step_bytes("dense") > 0


@pytest.mark.mpi
def test_ddp_with_the_hook_keeps_ranks_identical_and_dense_equals_ddps_own_allreduce(runs):
    gloo, _ = runs
    builtin = gloo["ddp/builtin"]
    for scheme in ("dense", "topk", "deft", "oktopk", "dense/float16", "topk/bfloat16"):
        params = gloo[f"ddp/{scheme}"]
        assert np.array_equal(params[0], params[1]), f"{scheme}: ranks differ"
        assert int(gloo[f"ddp/{scheme}/buckets"][0]) >= 2, "the test model should span several buckets"
    np.testing.assert_allclose(gloo["ddp/dense"][0], builtin[0], rtol=1e-5, atol=1e-6)
    # float16 values on the wire: DDP's own trajectory up to their rounding
    np.testing.assert_allclose(gloo["ddp/dense/float16"][0], builtin[0], rtol=1e-2, atol=1e-3)
    assert not np.array_equal(gloo["ddp/dense/float16"][0], builtin[0])
    for sparse in ("topk", "oktopk", "topk/bfloat16"):
        assert not np.allclose(gloo[f"ddp/{sparse}"][0], builtin[0]), sparse  # sparsified: another trajectory


def _rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``x`` rounded to torch's ``dtype`` (bfloat16, float16) and back, as a bucket holds it."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(getattr(torch, dtype)).float().numpy()


def _hook_steps(gloo, case: str):
    """(step, bucket, every rank's bucket input, every rank's bucket output) of a DDP hook case."""
    for t in range(3):
        for b in gloo[f"hook/{case}/buckets/{t}"]:
            yield t, int(b), gloo[f"hook/{case}/in/{t}/{b}"], gloo[f"hook/{case}/out/{t}/{b}"]


@pytest.mark.mpi
@pytest.mark.parametrize("case, dtype", [("bf16/dense", "bfloat16"), ("fp16/dense", "float16"),
                                         ("bf16/dense/wire16", "bfloat16")])
def test_the_hook_averages_16_bit_buckets_in_float32_and_rounds_once(runs, case, dtype):
    """A bfloat16 (float16) model under DDP: each bucket's mean is NumPy's float32 mean of every rank's
    widened gradient, rounded to the bucket's dtype once (with a float16 wire: the wire's mean, then
    rounded); the ranks' parameters are equal, and equal to a torch replica stepped with the mean."""
    gloo, _ = runs
    buckets = set()
    for t, b, given, got in _hook_steps(gloo, case):
        buckets.add(b)
        mean = _wire_mean(given, "float16") if case.endswith("wire16") else given.sum(0) * np.float32(0.5)
        want = _rounded(mean, dtype)
        assert np.array_equal(got[0], want) and np.array_equal(got[1], want), (case, t, b)
        assert not np.array_equal(given[0], given[1])  # the ranks' gradients differ: the mean is not either one
    assert len(buckets) >= 2, "the test model should span several buckets"
    params, start = gloo[f"hook/{case}/params"], gloo[f"hook/{case}/start"]
    assert np.array_equal(params[0], params[1]), f"{case}: ranks differ"
    if f"hook/{case}/ref" in gloo:
        ref = gloo[f"hook/{case}/ref"]
        eps = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11  # the dtype's relative rounding
        np.testing.assert_allclose(params[0], ref, rtol=2 * eps, atol=1e-6)
        assert np.abs(ref - start).max() > 10 * eps * np.abs(start).max()  # it trained: more than the tolerance


@pytest.mark.mpi
def test_the_hook_runs_topk_on_bfloat16_buckets_with_float32_error_feedback(runs):
    """topk on a bfloat16 model: per rank, acc = residual + widened gradient; the entries sent are a top-k of
    |acc| (ties may go either way), the residual keeps acc's other entries exactly in float32, and the bucket
    gets the mean of what the ranks sent, rounded to bfloat16 once."""
    gloo, _ = runs
    case, previous = "bf16/topk", {}
    in_float32_only = 0
    for t, b, given, got in _hook_steps(gloo, case):
        res, sid = gloo[f"hook/{case}/res/{t}/{b}"], int(gloo[f"hook/{case}/sid/{t}/{b}"][0])
        before = previous.get(b, (None, np.zeros_like(given)))
        acc = (before[1] if before[0] == sid else np.zeros_like(given)) + given
        n = given.shape[1]
        k = max(1, min(n, round(0.1 * n)))
        sent = np.zeros_like(acc)
        for r in range(2):
            chosen = (res[r] == 0) & (acc[r] != 0)
            assert np.array_equal(res[r][~chosen], acc[r][~chosen]), (t, b, r)  # kept exactly, float32
            assert chosen.sum() <= k
            others = np.abs(acc[r][~chosen])
            if chosen.sum() < k:
                assert not others.any()
            else:
                assert np.abs(acc[r][chosen]).min() >= others.max(), (t, b, r)
            sent[r][chosen] = acc[r][chosen]
        in_float32_only += int(np.count_nonzero(_rounded(res, "bfloat16") != res))
        want = _rounded(sent.sum(0) * np.float32(0.5), "bfloat16")
        assert np.array_equal(got[0], want) and np.array_equal(got[1], want), (t, b)
        previous[b] = (sid, res)
    assert in_float32_only > 0, "the residual should hold values a bfloat16 bucket cannot (kept in float32)"
    params = gloo[f"hook/{case}/params"]
    assert np.array_equal(params[0], params[1]) and not np.array_equal(params[0], gloo[f"hook/{case}/start"])


@pytest.mark.mpi
@pytest.mark.parametrize("scheme", ["dense", "topk"])
def test_the_overlapped_hook_gives_the_synchronous_ones_parameters_bit_for_bit(runs, scheme):
    gloo, _ = runs
    over, sync = gloo[f"hook/f32/{scheme}/overlap/params"], gloo[f"hook/f32/{scheme}/sync/params"]
    assert np.array_equal(over, sync) and np.array_equal(over[0], over[1])
    assert not np.array_equal(over[0], gloo[f"hook/f32/{scheme}/sync/start"])


@pytest.mark.mpi
def test_an_exception_in_the_exchange_thread_is_raised_by_backward(runs):
    """Planted in every rank's bucket step at the third step: backward() raises, naming the bucket and the
    exception (the job ends instead of hanging); the hook state keeps the original exception."""
    gloo, _ = runs
    message = str(gloo["hook/failing/message"][0])
    assert "mpisparse DDP hook: bucket" in message and "ValueError: planted in the exchange" in message, message
    assert str(gloo["hook/failing/recorded"][0]) == "ValueError"


def test_the_hook_refuses_a_parameter_server_scheme_and_needs_an_initialised_group():
    from mpisparse.runtimes import schemes_of
    from mpisparse.torch.dist import TorchDistCommunicator, comm_hook

    with pytest.raises(ValueError, match="not a data-parallel") as err:
        comm_hook("dgs")
    # the refusal names every scheme the hook accepts (from the registry: the gradient exchanges), one line
    hooked = [s for s in schemes_of("collective") if s != "localsgd"]
    assert str(err.value).endswith("a DDP hook can run " + ", ".join(hooked))
    assert "oktopk" in str(err.value) and "powersgd" in str(err.value) and "\n" not in str(err.value)
    for name in hooked:
        comm_hook(name)  # accepted without a process group (it is needed at the first bucket only)
    with pytest.raises(ValueError, match="scheme 'localsgd' averages parameters .* a DDP hook can run"):
        comm_hook("localsgd")  # a hook sees gradient buckets only
    # a bad option or density is refused up front, before any process group work
    with pytest.raises(ValueError, match="scheme 'gtopk' sends float32 values only"):
        comm_hook("gtopk", wire_dtype="float16")
    with pytest.raises(ValueError, match="allowed values are float32, float16, bfloat16"):
        comm_hook("topk", wire_dtype="int8")
    with pytest.raises(ValueError, match="allowed range"):
        comm_hook("topk", density=0)
    with pytest.raises(ValueError, match="overlap is 'yes'; allowed: True or False"):
        comm_hook("dense", overlap="yes")
    # a bucket of another dtype is refused in one line before any exchange (no process group needed)
    from mpisparse.torch.dist import sparse_hook

    class Bucket:
        def buffer(self):
            return torch.zeros(6, dtype=torch.float64)

        def parameters(self):
            return [torch.zeros(2, 3, dtype=torch.float64)]

        def index(self):
            return 0

    state, _ = comm_hook("dense")
    with pytest.raises(TypeError, match=r"bucket 0 is torch.float64; allowed: float32, bfloat16, float16"):
        sparse_hook(state, Bucket())
    with pytest.raises(RuntimeError, match="init_process_group"):
        TorchDistCommunicator()


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_horovod_style_functions(ranks):
    from conftest import TORCH_CASES, rank_case

    rank_case("torch_api", ranks, family=TORCH_CASES)


@pytest.mark.mpi
def test_an_exception_on_one_rank_ends_a_plain_python_job_within_seconds():
    """Library mode: plain `mpiexec -n 2 python script.py` (no `-m mpi4py`); init() installs the abort hook."""
    import time

    from conftest import mpiexec_prefix

    argv, extra = mpiexec_prefix(timeout=60)
    env = dict(os.environ, **extra, PYTHONPATH=str(HERE.parent), OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    p = launch([*argv, "-n", "2", sys.executable, mpi_script("check_torch_api.py"), "--raise"],
               capture_output=True, text=True, timeout=90, env=env)
    took = time.monotonic() - t0
    assert p.returncode != 0
    assert "planted failure on the last rank" in p.stderr
    assert took < 20, f"the job took {took:.1f} s to end (start-up included)"
