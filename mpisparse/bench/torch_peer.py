"""``bench step --torch-peer``: the same exchange written the way a PyTorch user would, in the same run.

The peer of the toolkit's ``topk`` step (whole-vector top-k with error
feedback, indices and values gathered with Allgatherv, summed): plain torch
ops on the run's device and the same communicator's calls.

* ``compensate``: ``e += g`` (``Tensor.add_``);
* ``select``: ``torch.topk(e.abs(), k, sorted=False)``, the values gathered
  by index (``e[idx]``), the sent entries cleared from the residual
  (``e[idx] = 0``) and the indices narrowed to int32 (the toolkit's index
  width, so both send the same bytes);
* ``exchange_indices`` / ``exchange_values``: :meth:`Communicator.allgatherv`
  of the index and the value tensors (viewed zero-copy through DLPack: a
  CUDA tensor goes to MPI as the toolkit's device arrays do, staged or
  CUDA-aware by the same decision);
* ``update``: the gathered sets summed into a zeroed output with
  ``index_add_`` and scaled by ``1 / W``.

torch is imported only here, and only when the peer is asked for: ``bench
step`` without ``--torch-peer`` imports no torch.  The step's core
(:class:`TorchTopkPeer`) runs on CPU tensors too, so the CPU suite checks
that it computes the toolkit's update.
"""

from __future__ import annotations

import numpy as np

from .. import backend
from ..backend.fusion import FusionLayout
from ..models.shapes import layer_shapes
from ..results.build import collective_result
from ..results.timing import PhaseTimer
from .gradgen import SyntheticGradients

#: the peer's name in results and tables
NAME = "torch-topk"


class TorchTopkPeer:
    """One rank's state of the plain-PyTorch top-k step: residual, output, the device's tensors."""

    def __init__(self, comm, n: int, k: int, device: str = "cpu", timer: PhaseTimer | None = None):
        import torch

        self.torch, self.comm, self.n, self.k = torch, comm, int(n), int(k)
        self.device = torch.device(device)
        self.e = torch.zeros(self.n, dtype=torch.float32, device=self.device)
        self.out = torch.zeros(self.n, dtype=torch.float32, device=self.device)
        self.timer = timer if timer is not None else PhaseTimer(enabled=False)
        self.last_gathered = None

    def step(self, g):
        """One step on gradient tensor ``g`` (float32, ``n``, on the peer's device); returns the update."""
        torch, t = self.torch, self.timer
        with t.phase("compensate"):
            self.e.add_(g)
        with t.phase("select"):
            idx = torch.topk(self.e.abs(), self.k, sorted=False).indices
            vals = self.e[idx]
            self.e[idx] = 0
            idx32 = idx.to(torch.int32)
        with t.phase("exchange_indices"):
            all_idx, counts = self.comm.allgatherv(backend.as_array(idx32))
        with t.phase("exchange_values"):
            all_vals, _ = self.comm.allgatherv(backend.as_array(vals), counts)
        with t.phase("update"):
            self.out.zero_()
            self.out.index_add_(0, backend.to_torch(all_idx).to(torch.int64), backend.to_torch(all_vals))
            self.out.mul_(1.0 / self.comm.size)
        self.last_gathered = all_idx
        return self.out


def _torch_device(cfg_device: str, torch) -> str:
    if cfg_device != "cuda":
        return "cpu"
    import cupy  # the rank's device was picked for CuPy (mpisparse.mpi.device): torch uses the same one

    dev = int(cupy.cuda.runtime.getDevice())
    torch.cuda.set_device(dev)
    return f"cuda:{dev}"


def run_torch_peer(comm, cfg, *, progress=None):
    """``cfg``'s steps (model, density, iters, warmup, seed, device) as the plain-PyTorch peer: a RunResult."""
    import torch

    layout = FusionLayout(layer_shapes(cfg.model))
    gen = SyntheticGradients(layout, comm.rank, seed=cfg.seed)
    dev = _torch_device(cfg.device, torch)
    sync = torch.cuda.synchronize if dev != "cpu" else None
    timer = PhaseTimer(sync=sync)
    k = max(1, int(round(cfg.density * layout.n)))
    peer = TorchTopkPeer(comm, layout.n, k, dev, timer)
    drawn = layout.empty()
    g = torch.empty(layout.n, dtype=torch.float32, device=dev)
    before_staging = dict(getattr(comm, "staging", {}))
    step_bytes, selected, staging = [], [], []
    for it in range(cfg.warmup + cfg.iters):
        timer.recording = it >= cfg.warmup
        gen.fill(drawn, it)
        g.copy_(torch.from_numpy(drawn))  # host -> device before the step (untimed), as bench step does
        comm.barrier()
        before, staged = comm.bytes_sent, dict(getattr(comm, "staging", before_staging))
        with timer.step():
            peer.step(g)
        if timer.recording:
            step_bytes.append(comm.bytes_sent - before)
            selected.append(backend.unique_count(peer.last_gathered))
            if staged:
                staging.append({key: comm.staging[key] - staged[key] for key in staged})
        if progress is not None:
            progress(it + 1, cfg.warmup + cfg.iters)
    return collective_result(
        comm, scheme=NAME, density_target=cfg.density, timer=timer, step_bytes=step_bytes, selected=selected,
        n=layout.n, memory=True, k=k, layers=len(layout), staging=staging if dev != "cpu" else None,
        config={"model": cfg.model, "scheme": NAME, "density": float(cfg.density), "iters": cfg.iters,
                "warmup": cfg.warmup, "seed": cfg.seed, "device": cfg.device, "peer_of": "topk",
                "torch": torch.__version__})


def format_peer_table(results) -> str:
    """Per phase, ms per step: the toolkit's ``topk`` (and every other scheme run) beside the torch peer."""
    rows = [r for r in results or () if r.scheme in ("topk", NAME)]
    if len(rows) < 2:
        return ""
    phases = [p for p in ("compensate", "select", "exchange_indices", "exchange_values", "update")
              if any(p in (r.phases or {}) for r in rows)]
    head = f"{'phase (ms/step, max over ranks)':<34}" + "".join(f"{r.scheme:>14}" for r in rows)
    lines = [head]
    for p in phases + ["step"]:
        vals = [(r.phases or {}).get(p) if p != "step" else r.step_seconds for r in rows]
        lines.append(f"{p:<34}" + "".join(f"{v * 1e3:>14.3f}" if v is not None else f"{'-':>14}" for v in vals))
    tk, pe = rows[0].step_seconds, rows[-1].step_seconds
    if tk and pe:
        lines.append(f"plain PyTorch step / toolkit step: {pe / tk:.2f}x")
    return "\n".join(lines)


def numpy_reference(grads: list[np.ndarray], k: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """One rank's update and residual after ``steps`` steps of the peer's math (W = 1), in NumPy."""
    e = np.zeros_like(grads[0])
    out = e
    for s in range(steps):
        e = e + grads[s]
        idx = np.argsort(-np.abs(e), kind="stable")[:k]
        out = np.zeros_like(e)
        out[idx] = e[idx]
        e[idx] = 0
    return out, e
