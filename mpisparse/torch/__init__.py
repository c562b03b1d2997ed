"""PyTorch integration: a distributed optimizer wrapper, Horovod-style.

::

    from mpisparse.torch import DistributedOptimizer
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = DistributedOptimizer(opt, model, scheme="deft", density=0.01)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

At construction rank 0's parameters (and floating-point buffers) are
broadcast to every rank.  DDP's gradient contract: when ``backward()``
returns, ``.grad`` holds the aggregate.  A hook on every parameter queues a
callback at the end of backward (as DDP's reducer does) that copies the
gradients into the fusion buffer, checks them for NaN/Inf on every rank (any
non-finite value anywhere skips the step on all ranks, counted in
``skipped_steps``: every ``.grad`` is then NaN on every rank, so a
``GradScaler`` skips and backs off alike everywhere, and the parameters stay
unchanged), exchanges them with the scheme and writes the aggregated mean
update back into ``.grad``; so ``clip_grad_norm_``, ``scaler.step(opt)`` and
any code between ``backward()`` and :meth:`DistributedOptimizer.step` see
the aggregate, and ``step()`` only applies it with the wrapped optimizer
(where no backward ran, e.g. :func:`join` or gradients set by hand, ``step()``
exchanges first).  ``scaler=`` (a ``torch.amp.GradScaler``): the gradients are
divided by its scale before the exchange and multiplied back after, so the
scheme's error feedback stays in unscaled units when the scale changes
(exact for the scaler's powers of two).  Parameters may be float32,
bfloat16, float16 or float64: the fusion buffer is float32 (gradients
widened into it), the aggregate written back in each parameter's dtype.
An exchanged update that is not finite (finite
gradients can overflow in the sum) is skipped and counted the same way,
agreed by the same 4-byte Allreduce; a step of the optimizer that leaves
a parameter non-finite is undone (the parameters are restored from a copy
taken before it; the optimizer's own state, e.g. momentum, is not) and
counted as skipped: parameters never become non-finite.  Momentum
therefore acts on the aggregated update (as in Alg. 1 of DEFT and of ScaleCom); a scheme that brings its own momentum
(``provides_momentum``, e.g. DGC's correction) requires an optimizer without
momentum. A local-update scheme (``localsgd``) leaves each rank's own gradient in ``.grad`` and
synchronizes the parameters after the optimizer's step (:mod:`mpisparse.torch.params`).

Device residency: the fusion buffer is a torch tensor on the model's device,
viewed zero-copy as an array of that device's array module through DLPack
(:func:`mpisparse.backend.as_array`: NumPy for a CPU model, CuPy for a CUDA
one); the scheme works on that array and keeps its state there, writing its
update over the gathered gradient.  On the host each float32 parameter's
``.grad`` then becomes its view of the buffer; on a device the gather and the
write-back are one fused multi-tensor copy each, and the finite checks write a
device flag vector that the host reads once per agreement
(:mod:`mpisparse.torch.guard`: once per step for dense and the overlapped
exchange, twice for the other schemes; ``flag_reads`` and ``write_back_ops``
count them).  The CPU path is the same code with NumPy as the array module.

Phases: the copy into the fusion buffer and the local finite check are
timed as ``compensate`` (they prepare the vector the scheme compensates);
the 4-byte Allreduce that agrees on skipping is ``wait`` (mostly waiting
for the slowest rank's backward pass); the update's check, setting ``.grad`` and the optimizer
step are ``update``.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any

import numpy as np
import torch

from .. import backend
from ..mpi.comm import Communicator
from ..backend.fusion import FusionLayout
from ..backend.pages import settle
from ..schemes import create
from ..results.timing import PhaseTimer
from .guard import GRAD, OverflowGuard, abs_max_into
from .rows import RowsMixin
from .overlap import _gather, _is_view, fused_gather, fused_write_back
from .params import NO_SYNC, ParameterSync


from .api import (Average, Compression, Max, Min, Sum, allgather, allgather_object, allreduce,  # noqa: E402
                  broadcast, broadcast_, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                  communicator, init, is_initialized, local_rank, local_size, rank, size)

__all__ = ["Average", "Compression", "DistributedOptimizer", "Max", "Min", "Sum", "allgather", "allgather_object",
           "allreduce", "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state",
           "broadcast_parameters", "comm_hook", "communicator", "init", "is_initialized", "join", "local_rank", "local_size",
           "rank", "size"]


def _launched_size() -> int:
    """The world size an MPI launcher announced in the environment (1 when none)."""
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


#: the parameter dtypes the library takes: gathered into the float32 fusion buffer (widened), the update
#: written back in the parameter's own dtype
_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class _DistributedMixin(OverflowGuard):
    """The exchange added to a torch optimizer's class by :func:`DistributedOptimizer`.

    An instance shares ``param_groups``, ``state`` and ``defaults`` with the
    wrapped optimizer (the same objects), so it is a ``torch.optim.Optimizer``
    that learning-rate schedulers and checkpoints treat as the wrapped one.
    """

    def _setup(self, optimizer, named, model, scheme, density, comm, timer, memory, seed, broadcast,
               compression, backward_passes_per_step, op, gradient_predivide_factor, scheme_options,
               overlap=False, bucket_cap_mb=25.0, scaler=None):
        self.optimizer = optimizer
        self.model = model
        self.comm = comm if comm is not None else _default_comm()
        self.timer = timer if timer is not None else PhaseTimer(enabled=False)
        if not named:
            raise ValueError("the model has no trainable parameters")
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step is {backward_passes_per_step}; allowed: an integer >= 1")
        if op not in ("average", "sum"):
            raise ValueError(f"op is {op!r}; allowed: Average, Sum")
        if not gradient_predivide_factor > 0:
            raise ValueError(f"gradient_predivide_factor is {gradient_predivide_factor}; allowed: > 0")
        self.params = [p for _, p in named]
        bad = [(n, p.dtype) for n, p in named if p.dtype not in _GRAD_DTYPES]
        if bad:
            raise ValueError(f"parameter {bad[0][0]!r} is {bad[0][1]}; allowed: floating-point parameters of "
                             "dtype float32, bfloat16, float16 or float64")
        if scaler is not None and not (hasattr(scaler, "get_scale") and hasattr(scaler, "is_enabled")):
            raise ValueError(f"scaler is {type(scaler).__name__}; allowed: a torch.amp.GradScaler or None")
        #: the loss scaler whose scale divides the gradients before the exchange (scheme state in unscaled units)
        self.scaler = scaler
        self.layout = FusionLayout([(n, tuple(p.shape)) for n, p in named])
        self.compression = compression
        scheme_options = _wire_options(scheme, compression, scheme_options)
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.scheme = create(scheme, self.comm, self.layout, density, memory=memory, timer=self.timer,
                             seed=seed, **scheme_options)
        if self.scheme.provides_momentum:
            for g in optimizer.param_groups:
                if g.get("momentum", 0):
                    raise ValueError(
                        f"scheme {scheme!r} applies momentum itself (momentum correction); "
                        f"the wrapped optimizer has momentum {g['momentum']}, it must be 0")
        self.device = self.params[0].device
        # the fusion buffer: one tensor on the model's device, seen by the scheme zero-copy (DLPack)
        self._flat = torch.zeros(self.layout.n, dtype=torch.float32, device=self.device)
        self._grad_views = [self._flat[s.offset:s.end].view(s.shape) for s in self.layout.layers]
        self.buffer = backend.as_array(self._flat)
        self.scheme.use_array_module(backend.array_module(self.buffer))
        self._flag = np.zeros(3, dtype=np.int32)  # [non-finite, active (not joined), rank joining now]
        self._init_flags()  # the device flag vector, the counters of flag reads and write-back operations
        self._active, self._joining_now = 1, -1
        self.skipped_steps = 0
        self.steps = 0
        self.snapshots = 0
        self._param_amax = float("inf")  # largest |parameter| after the last step (inf: unknown)
        self._synchronized = False
        self._sync_ok = False
        self._skip_sync = False
        self._passes = 0
        self._backward_seen = False  # a backward pass ended since the last step()
        self._queued = False  # the end-of-backward callback is queued for the running backward pass
        self._loss_scale = None  # the scaler's scale for the pass being exchanged (read once per pass)
        #: the bucket-wise exchange started from gradient hooks (None without overlap)
        self.overlap = None
        if overlap is None:  # the default: overlap where the scheme (and the communicator) allow
            from .overlap import default_overlap

            overlap = default_overlap(self.comm, scheme, scheme_options)
        self._local = ParameterSync(self, model) if self.scheme.local_update else NO_SYNC  # localsgd's parameters
        if overlap:
            from .overlap import BucketExchange

            self.overlap = BucketExchange(self, scheme, density, memory=memory, seed=seed,
                                          scheme_options=scheme_options, bucket_cap_mb=bucket_cap_mb)
        # every scheme's compiled loops loaded now (the buckets' too), LLVM's code pages unmapped after
        settle(self.scheme, *(b.scheme for b in self.overlap.buckets) if self.overlap else ())
        # DDP's contract: a hook per parameter queues the exchange at the end of backward (weakly held: a
        # dropped optimizer exchanges nothing)
        ref = weakref.ref(self)

        def hook(param, ref=ref):
            owner = ref()
            if owner is not None:
                owner._on_grad(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in self.params]
        if broadcast:
            self.broadcast_parameters()

    # ------------------------------------------------------------ set-up
    @torch.no_grad()
    def broadcast_parameters(self, root: int = 0) -> None:
        """Make every rank's parameters and float buffers equal to ``root``'s (on their device)."""
        flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in self.params])
        self.comm.bcast(backend.as_array(flat), root)
        for p, s in zip(self.params, self.layout.layers):
            p.copy_(flat[s.offset:s.end].view(p.shape))
        for b in (self.model.buffers() if self.model is not None else ()):
            if b.is_floating_point() and b.numel():
                arr = b.detach().to(torch.float32).reshape(-1).clone()
                self.comm.bcast(backend.as_array(arr), root)
                b.copy_(arr.view_as(b))

    # ------------------------------------------------------- end of backward
    def _on_grad(self, param) -> None:
        """A parameter's gradient is accumulated: queue the exchange for the end of this backward pass
        (once a pass, as DDP's reducer does) and, with overlap, count the parameter into its bucket."""
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        if self.overlap is not None:
            self.overlap.on_grad(param)

    def _end_of_backward(self) -> None:
        """Run when backward is done: the N-th pass of ``backward_passes_per_step`` exchanges now, so that
        ``.grad`` holds the aggregate when ``backward()`` returns (the earlier passes accumulate locally)."""
        self._queued = False
        self._backward_seen = True
        self._passes += 1
        if self._passes < self.backward_passes_per_step:
            return
        self._passes = 0
        self._synchronized = False  # a new exchange: an earlier one that was never stepped is stale
        self.synchronize()

    def close(self) -> None:
        """Remove the gradient hooks (and stop the overlap's thread): this optimizer exchanges no more."""
        for h in getattr(self, "_hooks", ()):
            h.remove()
        self._hooks = []
        if self.overlap is not None:
            self.overlap.close()

    def _scale(self) -> float:
        """The loss scale of the pass being exchanged (1.0 without a scaler or with a disabled one): one host
        read per pass."""
        if self._loss_scale is None:
            self._loss_scale = float(self.scaler.get_scale()) if self.scaler is not None and \
                self.scaler.is_enabled() else 1.0
        return self._loss_scale

    # -------------------------------------------------------------- step
    def _write_back(self, out) -> None:
        """The scheme's output as ``.grad``. On the host without a copy when it is the fusion buffer (always,
        but for a scheme that writes elsewhere): each float32 parameter's ``.grad`` becomes its view of the
        buffer, as DDP's ``gradient_as_bucket_view``. On a device one fused multi-tensor copy into the
        ``.grad`` tensors backward made (:func:`~mpisparse.torch.overlap.fused_write_back`, which says why).
        Op Sum and a predivide factor scale the buffer in place first (one pass, only then)."""
        flat = self._flat if out is self.buffer else backend.to_torch(out)
        scale = (self.comm.size if self.op == "sum" else 1) * self.gradient_predivide_factor * self._scale()
        ours = flat.data_ptr() == self._flat.data_ptr() and flat.numel() == self._flat.numel()
        if ours and scale != 1.0:
            self._flat.mul_(scale)
            self.write_back_ops += self._on_device
        if self._on_device:
            srcs = self._grad_views if ours else [flat[s.offset:s.end].view(s.shape) for s in self.layout.layers]
            self.write_back_ops += fused_write_back(self.params, srcs, 1.0 if ours else scale)
            return
        for p, s, view in zip(self.params, self.layout.layers, self._grad_views):
            if ours and p.dtype == view.dtype:
                if not _is_view(p.grad, view):
                    p.grad = view
                continue
            if p.grad is None:
                p.grad = torch.empty_like(p)
            src = view if ours else flat[s.offset:s.end].view(p.grad.shape)
            if scale == 1.0 or ours:
                p.grad.copy_(src)
            else:
                torch.mul(src, scale, out=p.grad)

    def _prepare(self, flat: torch.Tensor) -> None:
        """Predivide a part of the fusion buffer in place, before the exchange, by the predivide factor and
        the loss scale (the scheme then sees, and keeps its error feedback in, unscaled units; a power-of-two
        scale divides and multiplies back exactly). fp16 compression is the scheme's wire dtype: the
        scheme rounds what it sends, :func:`_wire_options`."""
        div = self.gradient_predivide_factor * self._scale()
        if div != 1.0:
            flat.div_(div)

    def _gather_grads(self) -> None:
        """Copy ``.grad`` into the fusion buffer (torch ops on the device) and check it for a non-finite value.
        On a device the copies are one fused multi-tensor launch, not one launch per parameter, and the check
        goes to the device flag vector (no read here, :mod:`~mpisparse.torch.guard`)."""
        if self._on_device:
            fused_gather(self.params, self._grad_views)
            self._prepare(self._flat)
            abs_max_into(self._dflags[GRAD], [self._flat])
            return
        for p, view in zip(self.params, self._grad_views):
            _gather(p, view)
        self._prepare(self._flat)
        # one read pass (no temporary), one host read of the largest magnitude
        self._flag[0] = 0 if np.isfinite(backend.abs_max(self.buffer)) else 1

    def _all_finite(self) -> bool:
        """Agree over ranks (4-byte Allreduce, max) whether every rank's gradient is finite."""
        self._flag[1], self._flag[2] = self._active, self._joining_now
        self.comm.allreduce(self._flag, self._flag, op="max")
        self._others_active = bool(self._flag[1])
        return self._flag[0] == 0

    @torch.no_grad()
    def synchronize(self) -> bool:
        """Exchange the gradients now and write the aggregate into ``.grad`` (Horovod's ``synchronize``).

        The exchange normally runs by itself at the end of ``backward()``
        (DDP's contract); then this returns at once.  Returns False (the
        gradients set to NaN on every rank, so that a ``GradScaler`` and any
        check see a non-finite step alike; a skipped step counted) when a
        rank's gradient or the exchanged update is not finite.
        """
        if self._synchronized:
            return self._sync_ok
        self._synchronized = True
        try:
            return self._synchronize()
        finally:
            self._loss_scale = None

    def _synchronize(self) -> bool:
        if self.overlap is not None:
            return self._synchronize_overlapped()
        one = self._one_agreement()  # the gradient's flag agreed with the update's, after the exchange
        with self.timer.phase("compensate"):
            self._gather_grads()
            if not one:
                self._gradient_flag()  # a device: the one read before the exchange
        if one:
            self._grad_pending = True
            return self._finish_sync(self.scheme.step(self.buffer, out=self.buffer))
        with self.timer.phase("wait"):
            finite = self._all_finite()
        if not self._others_active:  # every rank has joined (see join()): no exchange
            self._sync_ok = False
            return False
        if not finite:
            return self._skip()
        out = self.scheme.step(self.buffer, out=self.buffer)  # the update replaces the gathered gradient:
        # the scheme keeps no output vector of its own (one model-sized buffer less on the host or GPU)
        return self._finish_sync(out)

    def _synchronize_overlapped(self) -> bool:
        """The buckets' exchanges (most started during backward) finished, then the same agreement."""
        with self.timer.phase("exchange_values"):  # what is left of the exchange after backward
            finite, agg = self.overlap.finish()
        if self._on_device:  # the buckets' flags agreed with the update's: one read, one agreement
            torch.amax(self.overlap.amax, dim=0, out=self._dflags[GRAD])
            self._grad_pending = True
            return self._finish_sync(self.buffer if agg is self._flat else backend.as_array(agg))
        self._flag[0] = 0 if finite else 1
        with self.timer.phase("wait"):
            finite = self._all_finite()
        if not self._others_active:
            self._sync_ok = False
            return False
        if not finite:
            return self._skip()
        return self._finish_sync(backend.as_array(agg))

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, :meth:`step` does not exchange again (call :meth:`synchronize` first)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    @torch.no_grad()
    def step(self, closure=None) -> bool:
        """Exchange gradients (unless already synchronized) and step; returns False when skipped.

        With ``backward_passes_per_step`` N > 1 the gradients accumulate
        locally in ``.grad`` and only every N-th call exchanges and steps
        (the other calls return False without counting a skipped step).
        """
        if closure is not None:
            with torch.enable_grad():
                closure()
        if not self._synchronized:
            if self._skip_sync:
                raise RuntimeError("step() inside skip_synchronize() needs synchronize() first")
            if self._backward_seen:  # a pass of backward_passes_per_step that accumulates locally
                self._backward_seen = False
                return False
            # no backward since the last step (join(), or gradients set by hand): count the pass here
            self._passes += 1
            if self._passes < self.backward_passes_per_step:
                return False
            self._passes = 0
            self.synchronize()
        self._backward_seen = False
        self._synchronized = False
        if not self._sync_ok:
            return False
        self._sync_ok = False
        with self.timer.phase("update"):
            snap = self._near_overflow()
            if snap:
                self._snapshot_parameters()
            self._local.before_step()
            super().step()
            ok = self._check_parameters(snap)
            if not ok:
                if not snap:  # cannot happen for the optimizers the bound covers; fail loudly otherwise
                    why = ("a .grad was made non-finite after backward() (the exchanged aggregate was finite)"
                           if not np.isfinite(backend.abs_max([p.grad for p in self.params if p.grad is not None]))
                           else "its bound said it could not")
                    raise FloatingPointError(f"the optimizer step made a parameter non-finite: {why}; "
                                             "parameters lost")
                self._restore_parameters()
                self.skipped_steps += 1
        self._local.after_step()  # a local-update scheme's sync: every rank at the same steps, undone or not
        self.steps += ok
        return ok

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._passes:  # accumulating over backward_passes_per_step: keep the local sum
            return
        super().zero_grad(set_to_none=set_to_none)

    def selected_global(self) -> int:
        """Distinct elements the last exchange updated, over all ranks: the scheme's count, or with overlap
        the sum of the buckets' (each bucket's scheme covers its own span of the fusion buffer)."""
        if self.overlap is not None:
            return int(sum(b.scheme.selected_global() for b in self.overlap.buckets))
        return int(self.scheme.selected_global())

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict plus ``scheme``, ``skipped_steps`` and ``steps``."""
        state = dict(super().state_dict())
        state.update({"scheme": self.scheme.state_dict(), "skipped_steps": self.skipped_steps,
                      "steps": self.steps})
        if self.overlap is not None:
            state["buckets"] = [b.scheme.state_dict() for b in self.overlap.buckets]
        return state

    def load_state_dict(self, state: dict[str, Any], *, scheme_state: bool = True) -> None:
        base = state["optimizer"] if "optimizer" in state else {k: v for k, v in state.items()
                                                               if k in ("state", "param_groups")}
        super().load_state_dict(base)
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.steps = int(state.get("steps", 0))
        if scheme_state and "scheme" in state:
            self.scheme.load_state_dict(state["scheme"])
        if scheme_state and self.overlap is not None and "buckets" in state:
            for b, st in zip(self.overlap.buckets, state["buckets"]):
                b.scheme.load_state_dict(st)


_instances: "weakref.WeakSet" = weakref.WeakSet()
_last_created = None


def join(device: int = -1) -> int:
    """Take part in the other ranks' exchanges with zero gradients until every rank has called join().

    For uneven step counts: a rank out of batches calls ``join()`` and keeps
    stepping the most recently created :class:`DistributedOptimizer` with
    the aggregate of the others (its own contribution zero), so parameters
    stay equal on all ranks.  Returns the rank that joined last.
    """
    opt = _last_created() if _last_created is not None else None
    if opt is None:
        from . import api as torch_api

        return int(max(torch_api.allgather_object(torch_api.rank())))  # nothing to mirror: all arrive
    opt._active, first = 0, True
    try:
        while True:
            opt._joining_now = opt.comm.rank if first else -1
            first = False
            opt._passes = 0
            for p in opt.params:
                p.grad = torch.zeros_like(p)
            opt.step()
            if not opt._others_active:
                return int(opt._flag[2])
    finally:
        opt._active, opt._joining_now = 1, -1


def _wire_options(scheme: str, compression, options: dict[str, Any]) -> dict[str, Any]:
    """The scheme's options with ``Compression.fp16`` as its wire dtype (``wire_dtype="float16"``: float16
    values on the wire, half the bytes); ValueError for a ``wire_dtype`` that disagrees."""
    if getattr(compression, "__name__", "") != "_FP16Compression":
        return options
    given = options.get("wire_dtype")
    if given not in (None, "float16"):
        raise ValueError(f"compression=Compression.fp16 sends float16 values but wire_dtype is {given!r}; "
                         "allowed: wire_dtype='float16' or omitted")
    return {**options, "wire_dtype": "float16"}


def _default_comm() -> Communicator:
    from . import api as torch_api

    return torch_api.communicator()


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step: int = 1, op: str = "average",
                         gradient_predivide_factor: float = 1.0, scheme: str = "dense", density: float = 1.0, *,
                         comm: Communicator | None = None, timer: PhaseTimer | None = None, memory: bool = True,
                         seed: int = 0, broadcast: bool | None = None, model: torch.nn.Module | None = None,
                         overlap: bool | None = None, bucket_cap_mb: float = 25.0, scaler=None,
                         **scheme_options: Any):
    """``optimizer`` made distributed: an instance of a subclass of its own class (Horovod's signature).

    named_parameters: ``model.named_parameters()`` (None: all of the
    optimizer's parameters, named by position); an ``nn.Module`` is also
    accepted (the older form ``DistributedOptimizer(opt, model, scheme,
    density)``), and then its float buffers are broadcast with the parameters.
    compression: ``Compression.none`` or ``Compression.fp16`` (float16 values on
    the wire, half the bytes: the scheme's ``wire_dtype="float16"``; ``wire_dtype="bfloat16"``
    is the other 16-bit wire, see docs/torch.md). op: Average or Sum.
    scheme, density, memory, seed, **scheme_options: passed to the scheme.
    comm: a :class:`mpisparse.mpi.comm.Communicator` (the one ``init()`` started when omitted).
    broadcast: broadcast rank 0's parameters first (default: only with a model).
    overlap: exchange bucket by bucket from gradient hooks while backward runs
    (:mod:`mpisparse.torch.overlap`; schemes whose math is per element or per
    layer: dense, topk with layerwise=True, threshold with a fixed threshold).
    None (the default, as Horovod and DDP always overlap): overlap where the
    scheme allows with more than one rank, else the plain step, said once in
    one line on rank 0 (the scheme's ``bucket_reason``); False: the plain
    step (the exchange after backward); True: overlap or a ValueError.
    bucket_cap_mb: the least size of a bucket. sparse_rows: the embedding tables (:mod:`mpisparse.torch.rows`).
    """
    if isinstance(named_parameters, torch.nn.Module):  # older positional form: (opt, model, scheme, density)
        model = named_parameters
        named_parameters = None
        if isinstance(compression, str):
            scheme, compression = compression, None
            if not isinstance(backward_passes_per_step, int) or isinstance(backward_passes_per_step, float):
                density, backward_passes_per_step = float(backward_passes_per_step), 1
    if compression is None:
        from .api import Compression

        compression = Compression.none
    if model is not None and named_parameters is None:
        named = _trainable(model)
    elif named_parameters is not None:
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
    else:
        named = [(f"param.{i}", p) for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
                 if p.requires_grad]
    seen = {id(p) for g in optimizer.param_groups for p in g["params"]}
    extra = [n for n, p in named if id(p) not in seen]
    if extra:
        raise ValueError(f"named_parameters has {len(extra)} parameters the optimizer does not hold, "
                         f"e.g. {extra[0]!r}; allowed: the optimizer's parameters")
    cls = type(type(optimizer).__name__, (RowsMixin, _DistributedMixin, type(optimizer)), {})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)  # the same param_groups, state and defaults objects
    dist._setup(optimizer, named, model, scheme, density, comm, timer, memory, seed,
                bool(model is not None) if broadcast is None else broadcast, compression,
                backward_passes_per_step, op, gradient_predivide_factor, scheme_options, overlap, bucket_cap_mb,
                scaler)
    global _last_created
    _last_created = weakref.ref(dist)
    return dist


def __getattr__(name: str):
    if name == "comm_hook":  # imported lazily: torch.distributed is only needed by the DDP hook
        from .dist import comm_hook

        return comm_hook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# under an MPI launcher with more than one rank: start MPI now so that an uncaught exception on any
# rank aborts the whole job (torch_api's hook); a plain single process never starts MPI here
if _launched_size() > 1:
    init()
