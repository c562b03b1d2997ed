"""Overlap for :class:`mpisparse.torch.DistributedOptimizer`: buckets exchanged while backward runs.

``DistributedOptimizer(..., overlap=True)`` splits the fusion buffer into
buckets of consecutive layers, last layer first (the order backward
produces gradients), each at least ``bucket_cap_mb`` MB unless it is the
last. A gradient hook (``register_post_accumulate_grad_hook``) counts the
parameters of each bucket; when a bucket's gradients are all accumulated,
the hook copies them into the bucket's part of the fusion buffer and hands
the bucket to one communication thread, which runs the bucket's own
instance of the scheme (selection and exchange) while backward goes on.
:meth:`BucketExchange.finish` (called by ``synchronize``, which the
optimizer runs at the end of backward) starts any bucket whose hooks did
not fire (a parameter without a gradient counts as zeros) and waits for
the thread.

Rules that keep the ranks in step:

* buckets are handed to the thread strictly in bucket order, so every rank
  issues the same collectives in the same order whatever order its hooks
  fire in;
* the thread talks over its own duplicate of the communicator
  (``MPI_Comm_dup``), so a collective the training script makes meanwhile
  (e.g. ``hvd.allreduce`` of a metric) cannot match one of the buckets';
  this needs ``MPI_THREAD_MULTIPLE``, which mpi4py asks for by default.

Only schemes whose math is per element or per layer run bucket-wise (the
scheme class's ``bucket_reason``): ``dense``, ``topk --layerwise`` and
``threshold`` with a fixed ``--threshold``. For them one bucket-wise step
equals one step over the whole vector (tested). A rank whose bucket is not
finite sends zeros for it and flags it; the ranks then agree to skip the
step as without overlap, but the exchange has already run, so that step's
error-feedback entries sent by the ranks are dropped with it.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .. import backend
from ..backend.fusion import FusionLayout
from ..registry import create, scheme_class
from ..results.timing import PhaseTimer
from .guard import abs_max_into


def overlap_refusal(scheme: str, options: dict[str, Any]) -> str | None:
    """Why ``scheme`` with ``options`` cannot overlap (None when it can): one line for a ValueError."""
    cls = scheme_class(scheme)
    reason = getattr(cls, "bucket_reason", None)
    why = reason(options) if reason is not None else "it is not a data-parallel collective scheme"
    if why is None:
        return None
    return (f"overlap=True: scheme {scheme!r} cannot run bucket by bucket ({why}); allowed: dense, "
            f"topk with layerwise=True, threshold with a fixed threshold")


def _is_view(grad, view) -> bool:
    """Whether ``grad`` is ``view`` of the fusion buffer (what :meth:`_write_back` set, or the same memory)."""
    return grad is not None and (grad is view or (grad.data_ptr() == view.data_ptr() and grad.shape == view.shape
                                                  and grad.stride() == view.stride() and grad.dtype == view.dtype))


def _gather(p, view) -> None:
    """Parameter ``p``'s gradient into its ``view`` of the fusion buffer (zeros without one; nothing to copy
    when the gradient already is that view)."""
    if p.grad is None:
        view.zero_()
    elif not _is_view(p.grad, view):
        view.copy_(p.grad.detach().reshape(view.shape))


def fused_gather(params, views) -> None:
    """The gradients into their views of the fusion buffer on a device: one fused multi-tensor copy
    (``torch._foreach_copy_``, 16-bit gradients widened in it) of every gradient that is not its view
    already; zeros without a gradient."""
    dst, src = [], []
    for p, view in zip(params, views):
        if p.grad is None or p.grad.is_sparse:
            _gather(p, view)
        elif not _is_view(p.grad, view):
            dst.append(view)
            src.append(p.grad.detach())
    if dst:
        torch._foreach_copy_(dst, src)


def fused_write_back(params, srcs, scale: float = 1.0) -> int:
    """``srcs`` (the aggregate's views, one per parameter) into every parameter's ``.grad`` on a device, in
    one multi-tensor copy (``torch._foreach_copy_``; a 16-bit parameter's gradient converted in the same pass;
    ``scale`` != 1: one fused multiply after it); returns the fused operations issued.

    A copy into the ``.grad`` tensors backward made, rather than ``.grad`` as views of the buffer (DDP's
    ``gradient_as_bucket_view``): ``zero_grad()`` (``set_to_none=True``, torch's default) drops the views
    every step, so they would cost one checked ``.grad`` assignment per parameter per step from Python
    (and a 16-bit parameter cannot view the float32 buffer at all), while one multi-tensor launch does the
    whole write-back whatever the number of parameters, for one pass over the gradient on the device.
    A parameter without a gradient gets one (once; later steps reuse it until ``zero_grad``)."""
    grads = []
    for p, src in zip(params, srcs):
        if p.grad is None:
            p.grad = torch.empty_like(p)
        grads.append(p.grad)
    torch._foreach_copy_(grads, list(srcs))
    if scale != 1.0:
        torch._foreach_mul_(grads, scale)
        return 2
    return 1


#: the lines :func:`default_overlap` has said in this process (each once)
_SAID: set[str] = set()


def default_overlap(comm, scheme: str, options: dict[str, Any]) -> bool:
    """``overlap=None``: whether to overlap (the scheme runs bucket by bucket, more than one rank, a plain
    communicator and ``MPI_THREAD_MULTIPLE``); when the scheme or the communicator cannot, says so once in
    one line on rank 0 (standard error) and returns False. One rank has nothing to overlap: False, silently."""
    if comm.size <= 1:
        return False
    why = overlap_refusal(scheme, options)
    if why is not None:
        why = why.replace("overlap=True: ", "").split("; allowed:")[0]
    elif not hasattr(getattr(comm, "comm", None), "Dup"):
        why = "its communicator has no MPI communicator to duplicate (e.g. a hierarchical one)"
    else:
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            why = "MPI was started below MPI_THREAD_MULTIPLE"
    if why is None:
        return True
    line = (f"mpisparse: DistributedOptimizer exchanges after backward, not overlapped: {why}; "
            "overlap=False silences this")
    if comm.rank == 0 and line not in _SAID:
        _SAID.add(line)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return False


@dataclass
class Bucket:
    """Layers ``first..last`` of the layout (consecutive), their span of the fusion buffer and their scheme."""

    index: int
    layers: list[int]
    start: int
    end: int
    scheme: Any = None
    buffer: Any = None
    waiting: int = 0
    future: Future | None = field(default=None, repr=False)
    finite: bool = True


def plan_buckets(sizes: list[int], cap_elements: int) -> list[list[int]]:
    """Layer indices grouped into buckets, last layer first; each bucket holds at least ``cap_elements``
    entries unless it is the last one (a bucket holds whole layers, in descending order)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        total += sizes[i]
        if total >= cap_elements:
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


class BucketExchange:
    """The buckets of one optimizer, their hooks and the communication thread."""

    def __init__(self, owner, scheme: str, density: float, *, memory: bool, seed: int,
                 scheme_options: dict[str, Any], bucket_cap_mb: float):
        why = overlap_refusal(scheme, scheme_options)
        if why is not None:
            raise ValueError(why)
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb is {bucket_cap_mb}; allowed: > 0")
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise ValueError("overlap=True needs MPI_THREAD_MULTIPLE (MPI was initialised with a lower thread "
                             "level); allowed: start MPI with mpi4py's default (THREAD_MULTIPLE) or overlap=False")
        mpi_comm = getattr(owner.comm, "comm", None)
        if mpi_comm is None or not hasattr(mpi_comm, "Dup"):
            raise ValueError("overlap=True needs a plain Communicator (not a hierarchical one)")
        from ..mpi.comm import Communicator

        self.owner = owner
        self.comm = Communicator(mpi_comm.Dup(), check=owner.comm.check, cuda_aware=owner.comm.cuda_aware)
        layout: FusionLayout = owner.layout
        cap = max(1, int(bucket_cap_mb * 1e6 / 4))
        self.buckets: list[Bucket] = []
        for b, idx in enumerate(plan_buckets([s.size for s in layout.layers], cap)):
            ordered = sorted(idx)
            start, end = layout.layers[ordered[0]].offset, layout.layers[ordered[-1]].end
            sub = FusionLayout([(layout.layers[i].name, layout.layers[i].shape) for i in ordered])
            bucket = Bucket(b, ordered, start, end)
            bucket.buffer = backend.as_array(owner._flat[start:end])
            bucket.scheme = create(scheme, self.comm, sub, density, memory=memory,
                                   timer=PhaseTimer(enabled=False), seed=seed, **scheme_options)
            bucket.scheme.use_array_module(backend.array_module(bucket.buffer))
            self.buckets.append(bucket)
        self._bucket_of = {}
        for bucket in self.buckets:
            for i in bucket.layers:
                self._bucket_of[id(owner.params[i])] = bucket
        #: on a device, each bucket's largest gradient magnitude (its finite flag, read with the update's)
        self.amax = torch.zeros(len(self.buckets), dtype=torch.float32, device=owner.device)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpisparse-exchange")
        self._next = 0
        self.started_in_backward = 0  # buckets handed over from a hook (overlapped), for tests and reports
        self._reset()

    # ------------------------------------------------------------------ hooks
    def _reset(self) -> None:
        self._next = 0
        for bucket in self.buckets:
            bucket.waiting = len(bucket.layers)
            bucket.future = None
            bucket.finite = True

    def _armed(self) -> bool:
        """Whether this backward pass is the one whose gradients are exchanged (the last of
        ``backward_passes_per_step``) and the optimizer is not stepping a joined rank."""
        o = self.owner
        return o._passes == o.backward_passes_per_step - 1 and o._active

    def on_grad(self, param: torch.Tensor) -> None:
        """``param``'s gradient is accumulated (the optimizer's gradient hook): count it into its bucket and
        hand every bucket that is complete to the thread, in bucket order."""
        if not self._armed():
            return
        bucket = self._bucket_of[id(param)]
        if bucket.waiting <= 0:
            raise RuntimeError("overlap=True: a gradient was accumulated again after its bucket was sent "
                               "(a second backward pass before step()); allowed: one backward per step, or "
                               "backward_passes_per_step=N for N passes")
        bucket.waiting -= 1
        if bucket.waiting == 0:
            self._launch_ready(from_hook=True)

    def _launch_ready(self, *, from_hook: bool) -> None:
        """Hand every bucket that is ready to the thread, in bucket order, stopping at the first that is not."""
        while self._next < len(self.buckets) and self.buckets[self._next].waiting <= 0:
            self._launch(self.buckets[self._next])
            self.started_in_backward += int(from_hook)
            self._next += 1

    @torch.no_grad()
    def _launch(self, bucket: Bucket) -> None:
        o = self.owner
        flat = o._flat[bucket.start:bucket.end]
        if o._on_device:  # one fused copy; the flag stays on the device, a non-finite bucket zeroed there
            fused_gather([o.params[i] for i in bucket.layers], [o._grad_views[i] for i in bucket.layers])
            o._prepare(flat)
            amax = self.amax[bucket.index]
            abs_max_into(amax, [flat])
            flat.masked_fill_(torch.isfinite(amax).logical_not_(), 0.0)
        else:
            for i in bucket.layers:
                _gather(o.params[i], o._grad_views[i])
            o._prepare(flat)
            bucket.finite = bool(np.isfinite(backend.abs_max(bucket.buffer)))  # one read pass, one host read
            if not bucket.finite:  # zeros go out instead; the ranks agree on skipping afterwards
                flat.zero_()
        bucket.future = self._executor.submit(bucket.scheme.step, bucket.buffer, out=bucket.buffer)  # in place

    # ------------------------------------------------------------------ finish
    def finish(self):
        """Start the buckets not started yet, wait for all; returns (this rank finite -- on the host; on a
        device the buckets' flags are in :attr:`amax`, read with the update's --, the mean update as
        a torch tensor of the whole layout on the model's device: the fusion buffer itself, each bucket's
        scheme having written its update in place over its gradients)."""
        for bucket in self.buckets[self._next:]:
            bucket.waiting = 0
        self._launch_ready(from_hook=False)
        out = self.owner._flat
        finite = True
        try:
            for bucket in self.buckets:
                res = bucket.future.result()  # re-raises an exception of the thread here
                if res is not bucket.buffer:  # a scheme that wrote elsewhere: one copy of the bucket
                    out[bucket.start:bucket.end].copy_(backend.to_torch(res))
                finite = finite and bucket.finite
        finally:
            self._reset()
        return finite, out

    def close(self) -> None:
        """Stop the thread (the gradient hooks are the optimizer's: :meth:`DistributedOptimizer.close`)."""
        self._executor.shutdown(wait=True)

    @property
    def bytes_sent(self) -> int:
        return self.comm.bytes_sent
