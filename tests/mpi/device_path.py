"""The device-resident step on a strict fake device: every data-parallel scheme, CPU run vs device runs.

Run as ``python -m mpi4py tests/mpi/device_path.py OUT.json WHAT [SCHEME ...]``
under ``mpiexec -n W`` (``WHAT``: ``bench``, ``train``, ``library`` or ``both``: all three).  CuPy is
replaced by :mod:`gpu_emu.strictcupy` (device arrays that refuse implicit
conversion to NumPy and count every device-to-host copy).  The selection
kernels are the NumPy ones behind the device wall (strictcupy's ``host``
kernel module: the emulated CUDA kernels take a fraction of a second per
launch; their ``threshold_select`` returns its set in reverse order here, as
CuPy's kernel may return it in any order: ``oktopk`` used it unsorted and
diverged on an H200); ``MPISPARSE_DEVICE_PATH_KERNELS=emu`` runs the package's CUDA C on
the CPU emulator instead (slow; kernel reads are then counted too).  For each scheme, three runs of the same
seed:

* ``cpu`` -- ``device="cpu"``, the ordinary host path;
* ``aware`` -- ``device="cuda"`` with a communicator that hands device
  buffers to MPI directly (CUDA-aware; the fake's pointers are host memory,
  so the MPI reads them as host buffers);
* ``staged`` -- ``device="cuda"`` with a communicator that stages device
  buffers through its pinned host buffers (a non-CUDA-aware MPI).

The only test hooks: the strict ``cupy`` module, ``backend.torch_array_module``
returning it for (CPU) torch tensors and ``device.torch_device`` returning
the CPU -- the stand-ins for a CUDA tensor and a CUDA device.  Everything
else is the package's code as it runs on a GPU.

Rank 0 writes, per scheme and run: the per-step device-to-host copies the
fake counted within the scheme's step (``bench``) or the optimizer's step
(``train``), the largest of them in bytes, the communicator's staging copies
per step, the result's ``staging_copies_per_step``, the largest difference
of the device runs' aggregated updates (bench) or losses (train) from the
CPU run's, and every rank's figures.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the gpu_emu package

import numpy as np  # noqa: E402
import torch  # noqa: E402

from gpu_emu import strictcupy  # noqa: E402

cupy = strictcupy.install_globally(os.environ.get("MPISPARSE_DEVICE_PATH_KERNELS", "host"))


def _unordered_threshold_select():
    """The host kernels' ``threshold_select`` with CuPy's contract: the same set "in no particular order"
    (the GPU kernel appends atomically); here reversed, so a scheme that needs them ascending must sort."""
    kern = sys.modules.get(strictcupy.HOST_KERNELS)
    if kern is None:  # the emulated CUDA kernels: their own order
        return
    ascending = kern.threshold_select

    def threshold_select(x, t, *, scratch=None):
        return ascending(x, t, scratch=scratch)[::-1].copy()

    kern.threshold_select = threshold_select


_unordered_threshold_select()

from mpisparse import backend, runtimes
from mpisparse.mpi import device  # noqa: E402
from mpisparse.backend import numpy_select  # noqa: E402
from mpisparse.mpi.comm import Communicator  # noqa: E402
from mpisparse.config import BenchConfig, TrainConfig  # noqa: E402
from mpisparse.schemes.base import CollectiveScheme  # noqa: E402
from mpisparse.torch import _DistributedMixin as DistributedOptimizer  # noqa: E402  (the class with the exchange)
from mpisparse.runtimes import validate

#: every data-parallel scheme (and topk's layer-wise variant) with the options of this check;
#: dgc samples its whole vector so its threshold estimate is exact on both paths (the GPU kernel samples
#: other positions than the NumPy kernel, which would change its selection)
SCHEMES = {
    "dense": ("dense", {}),
    "topk": ("topk", {}),
    "topk-layerwise": ("topk", {"layerwise": True}),
    "randomk": ("randomk", {}),
    "threshold": ("threshold", {}),
    "cltk": ("cltk", {}),
    "deft": ("deft", {}),
    "dct": ("dct", {"lifespan": 2}),
    "gtopk": ("gtopk", {}),
    "dgc": ("dgc", {"sample_fraction": 1.0}),
    "powersgd": ("powersgd", {}),
    "oktopk": ("oktopk", {}),
}

#: the collectives whose calls per step are recorded (oktopk's balancing Alltoallv depends on the data)
CALLS = ("allreduce", "alltoallv", "allgatherv")

_real_torch_module = backend.torch_array_module
_scheme_step = CollectiveScheme.step
_dopt_exchange = DistributedOptimizer._end_of_backward  # the step's exchange (DDP's contract: in backward)
RECORD: list[dict] | None = None


def _counted(fn, outputs: bool):
    def wrapper(self, *args, **kw):
        c0, s0 = dict(strictcupy.COUNTS), len(strictcupy.D2H_SIZES)
        comm = self.comm
        st0 = dict(comm.staging)
        calls0 = {op: comm.stats[op].calls if op in comm.stats else 0 for op in CALLS}
        result = fn(self, *args, **kw)
        if RECORD is not None:
            sizes = strictcupy.D2H_SIZES[s0:]
            rec = {"d2h": strictcupy.COUNTS["d2h"] - c0["d2h"], "d2h_max_bytes": max(sizes, default=0),
                   "staging_d2h": comm.staging["d2h"] - st0["d2h"],
                   "staging_h2d": comm.staging["h2d"] - st0["h2d"],
                   "calls": {op: (comm.stats[op].calls if op in comm.stats else 0) - calls0[op] for op in CALLS}}
            if outputs:
                rec["out"] = backend.to_host(result).copy()  # after the count: not part of the step
            RECORD.append(rec)
        return result
    return wrapper


def use_device(on: bool) -> None:
    """The test's stand-in for CUDA tensors: CPU tensors viewed as strict device arrays."""
    backend.torch_array_module = (lambda t: cupy) if on else _real_torch_module


device.torch_device = lambda kind, comm=None: torch.device("cpu")  # the model stays in (host) memory


def run(what: str, key: str, mode: str, W: int):
    global RECORD
    name, opts = SCHEMES[key]
    on_device = mode != "cpu"
    use_device(on_device)
    comm = Communicator(cuda_aware=(mode == "aware"))
    numpy_select._default_rng = np.random.default_rng(0)  # the sampled top-k's positions: the same in every run
    strictcupy.reset_counts()
    dev = "cuda" if on_device else "cpu"
    RECORD = []
    losses: list[float] = []
    try:
        if what == "bench":
            CollectiveScheme.step = _counted(_scheme_step, outputs=True)
            cfg = validate(BenchConfig(model="ncf", scheme=name, density=0.01, iters=3, warmup=0, seed=3,
                              scheme_options=dict(opts), device=dev), W)
            res = runtimes.bench_step(comm, cfg)
        else:
            DistributedOptimizer._end_of_backward = _counted(_dopt_exchange, outputs=False)
            cfg = validate(TrainConfig(model="mlp", data="digits", scheme=name, density=0.05, epochs=1, batch_size=256,
                              lr=0.1, seed=1, scheme_options=dict(opts), device=dev), W)
            res = runtimes.train(comm, cfg, step_log=lambda r: losses.append(float(r["loss"])))
    finally:
        CollectiveScheme.step = _scheme_step
        DistributedOptimizer._end_of_backward = _dopt_exchange
        use_device(False)
    rec, RECORD = RECORD, None
    return rec, losses, res


#: the library's own device path (``library`` in the report): plain and overlapped, dense and topk --layerwise
LIBRARY = {"dense": ("dense", {}, False), "topk-layerwise": ("topk", {"layerwise": True}, False),
           "dense-overlap": ("dense", {}, True), "topk-layerwise-overlap": ("topk", {"layerwise": True}, True)}
#: the step whose gradient is made NaN on the last rank (every rank skips it)
NAN_STEP = 3


class _Net(torch.nn.Module):
    """Two float32 layers and a bfloat16 gain (the write-back converts into a 16-bit ``.grad``)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)
        self.gain = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)) * self.gain.float())


def library_check(W: int) -> dict:
    """DistributedOptimizer on the strict fake device, W ranks, 5 steps each way: per step the host reads of
    finite flags (the library's ``flag_reads`` and the fake's device-to-host copies), the write-back's fused
    operations (``write_back_ops`` and calls of ``torch._foreach_copy_``), and the largest difference of
    every ``.grad`` after backward from the NumPy mean of all ranks' gradients (computed again with plain
    torch, gathered); at step ``NAN_STEP`` the last rank's gradient is NaN: skipped on every rank."""
    from mpisparse.torch import DistributedOptimizer as make
    from mpisparse.torch.sgd import SGD  # torch.optim's would import torch._dynamo (seconds of the job)

    rank = Communicator().rank
    calls = [0]
    real = torch._foreach_copy_

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    out = {}
    for key, (name, opts, overlap) in LIBRARY.items():
        use_device(True)
        torch._foreach_copy_ = counted
        try:
            torch.manual_seed(0)
            net = _Net()
            opt = make(SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(),
                       comm=Communicator(cuda_aware=True), scheme=name, density=1.0, overlap=overlap, **opts)
            assert opt._on_device, "the fake device did not reach the optimizer"
            g = torch.Generator().manual_seed(100 + rank)
            rows = []
            for t in range(5):
                x, y = torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)
                scale = float("nan") if t == NAN_STEP and rank == W - 1 else 1.0
                loss = lambda: torch.nn.functional.cross_entropy(net(x), y) * scale  # noqa: E731
                mine = [gr.detach().float().numpy().copy()
                        for gr in torch.autograd.grad(loss(), list(net.parameters()))]
                mean = np.mean(np.stack([np.concatenate([m.ravel() for m in r])
                                         for r in Communicator().allgather_obj(mine)]), axis=0, dtype=np.float32)
                # the mean in each parameter's dtype (the bfloat16 gain's .grad is the mean rounded to it)
                want = np.concatenate([torch.from_numpy(m).to(p.dtype).float().numpy() for m, p in
                                       zip(np.split(mean, np.cumsum([p.numel() for p in net.parameters()])[:-1]),
                                           net.parameters())])
                opt.zero_grad()
                r0, d0, w0 = opt.flag_reads, strictcupy.COUNTS["d2h"], opt.write_back_ops
                c0, s0 = calls[0], opt.skipped_steps
                loss().backward()  # the exchange runs here (DDP's contract)
                got = np.concatenate([p.grad.detach().float().numpy().ravel() for p in net.parameters()])
                stepped = opt.step()
                skipped = opt.skipped_steps - s0
                rows.append({"flag_reads": opt.flag_reads - r0, "d2h": strictcupy.COUNTS["d2h"] - d0,
                             "write_back_ops": opt.write_back_ops - w0, "foreach_copies": calls[0] - c0,
                             "stepped": bool(stepped), "skipped": skipped, "all_nan": bool(np.isnan(got).all()),
                             "diff": None if skipped else float(np.max(np.abs(got - want)
                                                                       / np.maximum(np.abs(want), 1e-3)))})
            params = np.concatenate([p.detach().float().numpy().ravel() for p in net.parameters()])
            same = all(np.array_equal(params, q) for q in Communicator().allgather_obj(params))
            out[key] = {"steps": rows, "params_equal_on_ranks": same, "buckets": len(opt.overlap.buckets)
                        if opt.overlap is not None else 0}
            opt.close()
        finally:
            torch._foreach_copy_ = real
            use_device(False)
    return out


def main() -> None:
    out_path, what = sys.argv[1], sys.argv[2]
    keys = sys.argv[3:] or list(SCHEMES)
    W = Communicator().size
    report: dict = {}
    for kind in (("bench", "train") if what == "both" else (what,) if what != "library" else ()):
        for key in keys:
            runs = {mode: run(kind, key, mode, W) for mode in ("cpu", "aware", "staged")}
            cpu_rec, cpu_losses, cpu_res = runs["cpu"]
            entry: dict = {}
            for mode in ("aware", "staged"):
                rec, losses, res = runs[mode]
                if kind == "bench":
                    diff = max(float(np.max(np.abs(a["out"] - b["out"]))) for a, b in zip(rec, cpu_rec))
                    same_steps = len(rec) == len(cpu_rec)
                else:
                    diff = max((abs(a - b) for a, b in zip(losses, cpu_losses)), default=0.0)
                    diff = max(diff, abs(res.final_metrics["test_loss"] - cpu_res.final_metrics["test_loss"]))
                    same_steps = len(losses) == len(cpu_losses) and len(rec) == len(cpu_losses)
                mine = {"d2h": [r["d2h"] for r in rec], "d2h_max_bytes": max(r["d2h_max_bytes"] for r in rec),
                        "staging_d2h": [r["staging_d2h"] for r in rec],
                        "staging_h2d": [r["staging_h2d"] for r in rec],
                        "calls": [r["calls"] for r in rec]}
                everyone = Communicator().allgather_obj(mine)
                entry[mode] = {"ranks": everyone, "max_diff": diff, "same_steps": same_steps,
                               "steps": len(rec), "staging_copies_per_step": res.staging_copies_per_step,
                               "cpu_result_staging": cpu_res.staging_copies_per_step}
            report[f"{kind}:{key}"] = entry
    if what in ("both", "library"):
        report["library"] = library_check(W)
    if Communicator().rank == 0:
        Path(out_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
