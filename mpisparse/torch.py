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
broadcast to every rank.  Each :meth:`DistributedOptimizer.step` copies the
gradients into the fusion buffer, checks them for NaN/Inf on every rank (any
non-finite value anywhere skips the step on all ranks, counted in
``skipped_steps``; parameters stay unchanged), exchanges them with the
scheme, writes the aggregated mean update back into ``.grad`` and steps the
wrapped optimizer.  An exchanged update that is not finite (finite
gradients can overflow in the sum) is skipped and counted the same way,
agreed by the same 4-byte Allreduce; a step of the optimizer that leaves
a parameter non-finite is undone (the parameters are restored from a copy
taken before it; the optimizer's own state, e.g. momentum, is not) and
counted as skipped: parameters never become non-finite.  Momentum
therefore acts on the aggregated update (as in Alg. 1 of DEFT and of ScaleCom); a scheme that brings its own momentum
(``provides_momentum``, e.g. DGC's correction) requires an optimizer without
momentum.

Device residency: the fusion buffer is a torch tensor on the model's device
(the gradients are copied into it with torch ops, never through the host),
viewed zero-copy as an array of that device's array module through DLPack
(:func:`mpisparse.backend.as_array`: NumPy for a CPU model, CuPy for a CUDA
one); the scheme works on that array and keeps its state there, and its
output is viewed back as a torch tensor (:func:`mpisparse.backend.to_torch`)
and copied into ``.grad`` on the device.  The only host reads of a step made
here are two non-finite flags (one byte each: whether this rank's gradient
is finite, before the exchange, and whether the exchanged update is, after
it), each agreed on by the ranks with a 4-byte host Allreduce.  The
CPU path is the same code with NumPy as the array module.

Phases: the copy into the fusion buffer and the local finite check are
timed as ``compensate`` (they prepare the vector the scheme compensates);
the 4-byte Allreduce that agrees on skipping is ``wait`` (mostly waiting
for the slowest rank's backward pass); the copy back and the optimizer step
are ``update``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import backend
from .comm import Communicator
from .fusion import FusionLayout
from .schemes import create
from .timing import PhaseTimer


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class DistributedOptimizer:
    """Wrap ``optimizer`` so that each step exchanges gradients with ``scheme``.

    Parameters
    ----------
    optimizer: a ``torch.optim.Optimizer`` over ``model``'s parameters.
    model: the module whose trainable parameters form the fusion buffer.
    scheme, density, memory, seed, **scheme_options: passed to the scheme.
    comm: a :class:`mpisparse.comm.Communicator` (COMM_WORLD when omitted).
    timer: a :class:`mpisparse.timing.PhaseTimer` to time the phases.
    broadcast: broadcast rank 0's parameters and buffers first.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, scheme: str = "dense",
                 density: float = 1.0, *, comm: Communicator | None = None, timer: PhaseTimer | None = None,
                 memory: bool = True, seed: int = 0, broadcast: bool = True, **scheme_options: Any):
        self.optimizer = optimizer
        self.model = model
        self.comm = comm if comm is not None else Communicator()
        self.timer = timer if timer is not None else PhaseTimer(enabled=False)
        named = _trainable(model)
        if not named:
            raise ValueError("the model has no trainable parameters")
        self.params = [p for _, p in named]
        self.layout = FusionLayout([(n, tuple(p.shape)) for n, p in named])
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
        self._flag = np.zeros(1, dtype=np.int32)
        self.skipped_steps = 0
        self.steps = 0
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
        for b in self.model.buffers():
            if b.is_floating_point() and b.numel():
                arr = b.detach().to(torch.float32).reshape(-1).clone()
                self.comm.bcast(backend.as_array(arr), root)
                b.copy_(arr.view_as(b))

    # -------------------------------------------------------------- step
    def zero_grad(self, set_to_none: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _gather_grads(self) -> None:
        """Copy ``.grad`` into the fusion buffer (torch ops on the device) and flag a non-finite value."""
        for p, view in zip(self.params, self._grad_views):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad.detach().reshape(view.shape))
        finite = backend.all_finite(self.buffer)  # on the buffer's device
        self._flag[0] = 0 if bool(finite) else 1  # an explicit host read (1 byte)

    def _all_finite(self) -> bool:
        """Agree over ranks (4-byte Allreduce, max) whether every rank's gradient is finite."""
        self.comm.allreduce(self._flag, self._flag, op="max")
        return self._flag[0] == 0

    def _write_back(self, out) -> None:
        """The scheme's output into ``.grad``: a zero-copy torch view of it, copied on the device."""
        flat = backend.to_torch(out)
        for p, s in zip(self.params, self.layout.layers):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(flat[s.offset:s.end].view(p.grad.shape))

    @torch.no_grad()
    def step(self, closure=None) -> bool:
        """Exchange gradients and step; returns False when the step was skipped."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        with self.timer.phase("compensate"):
            self._gather_grads()
        with self.timer.phase("wait"):
            finite = self._all_finite()
        if not finite:
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=False)
            return False
        out = self.scheme.step(self.buffer)
        if not self._update_finite(out):  # the exchange overflowed: skipped like a non-finite gradient
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=False)
            return False
        with self.timer.phase("update"):
            self._write_back(out)
            self._snapshot_parameters()
            self.optimizer.step()
            if not self._parameters_finite():
                self._restore_parameters()
                self.skipped_steps += 1
                return False
        self.steps += 1
        return True

    # ------------------------------------------------ non-finite results (overflow)
    def _update_finite(self, out) -> bool:
        """Agree over ranks (the same 4-byte Allreduce) whether the exchanged update is finite.

        Finite gradients can still sum to Inf in the exchange (values near
        3.4e38); the result is checked where it lies (``backend.array_module``)
        and the ranks agree, so a scheme whose ranks could see different
        results still skips on all of them together.
        """
        xp = backend.array_module(out)
        self._flag[0] = 0 if bool(xp.isfinite(out).all()) else 1
        with self.timer.phase("wait"):
            return self._all_finite()

    def _snapshot_parameters(self) -> None:
        """Keep the parameters before the optimizer's step (to restore them if it overflows)."""
        if getattr(self, "_saved_params", None) is None:
            self._saved_params = [torch.empty_like(p) for p in self.params]
        torch._foreach_copy_(self._saved_params, [p.detach() for p in self.params])

    def _parameters_finite(self) -> bool:
        """Whether every parameter is finite after the step (the same on every rank: same parameters,
        same update)."""
        return bool(torch.stack([torch.isfinite(p).all() for p in self.params]).all())

    def _restore_parameters(self) -> None:
        torch._foreach_copy_([p.detach() for p in self.params], self._saved_params)

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheme": self.scheme.state_dict(),
                "skipped_steps": self.skipped_steps, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any], *, scheme_state: bool = True) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.steps = int(state.get("steps", 0))
        if scheme_state and "scheme" in state:
            self.scheme.load_state_dict(state["scheme"])
