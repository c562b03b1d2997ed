"""What keeps :class:`mpisparse.torch.DistributedOptimizer`'s parameters finite: the finite flags of a step,
the agreement on a non-finite exchanged update, and the snapshot taken before an optimizer step that could
overflow.

A mixin of the optimizer class (it reads the optimizer's ``comm``, ``timer``,
``params``, ``param_groups``, ``op``, ``gradient_predivide_factor``, ``buffer``,
``device``, its 4-byte flag agreement ``_all_finite`` and its ``_write_back``).

**Finite flags on a device.** Every check of a step -- the gathered gradient's,
the exchanged update's, the parameters' after the optimizer's step -- writes the
largest magnitude it found into one slot of a small device vector
(:attr:`OverflowGuard._dflags`: gradient, update, parameters) with device
reductions and no host read; the host reads the whole vector with one
device-to-host copy (:meth:`OverflowGuard._read_flags`, counted in
``flag_reads``) where a decision needs it:

* once per step where the gradient's agreement can wait for the update's: the
  ``dense`` scheme (its update is the sum of every rank's whole gradient and it
  keeps no state, so a non-finite gradient anywhere makes every rank's update
  non-finite and changes nothing a later step sees) and the overlapped exchange
  (its buckets are exchanged before any agreement anyway; a non-finite bucket is
  zeroed on the device before it is sent); the ranks then agree once, with one
  4-byte Allreduce;
* twice for the other schemes after backward: their error feedback must never
  take in a non-finite gradient, so the ranks agree on the gradient before the
  exchange and on the update after it;
* the parameters' check after the optimizer's step is read with the next step's
  flags (the bound of :meth:`_near_overflow` says it cannot fail); only a step
  that took a snapshot reads it at once, to restore the parameters in that step.

A skipped step is skipped on every rank, sets every ``.grad`` to NaN and counts
once, as before.  On the host (NumPy) every check reads its value at once: a
read costs nothing there.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import backend

#: slots of the device flag vector
GRAD, UPDATE, PARAMS = 0, 1, 2
#: schemes whose update is the plain sum of every rank's whole gradient and that keep no state: the
#: gradient's agreement waits for the update's (one read and one Allreduce per step on a device)
SUM_SCHEMES = ("dense",)


def abs_max_into(out: torch.Tensor, tensors) -> None:
    """The largest magnitude over ``tensors`` (NaN propagating) written into the 0-d tensor ``out`` on the
    tensors' device, without a host read: many CUDA tensors in one fused multi-tensor launch (the inf-norm),
    else one ``aminmax`` pass per tensor (no temporary as large as a tensor)."""
    ts = [t.detach().reshape(-1) for t in tensors if t.numel()]
    if not ts:
        out.zero_()
    elif len(ts) > 1 and all(t.is_cuda for t in ts):
        torch.amax(torch.stack(torch._foreach_norm(ts, float("inf"))).to(out.dtype), dim=0, out=out)
    elif len(ts) == 1:
        lo, hi = torch.aminmax(ts[0])
        torch.maximum(lo.neg_(), hi, out=out)
    else:
        parts = [torch.maximum(lo.neg_(), hi) for lo, hi in map(torch.aminmax, ts)]
        torch.amax(torch.stack(parts).to(out.dtype), dim=0, out=out)


class OverflowGuard:
    """Non-finite results (overflow): the finite flags, the exchanged update's check, and the parameters'
    snapshot and check."""

    def _init_flags(self) -> None:
        """The device flag vector (on a device) and the counters of host reads and write-back operations."""
        self._on_device = backend.is_device_array(self.buffer)
        self._dflags = torch.zeros(3, dtype=torch.float32, device=self.device) if self._on_device else None
        self._dflags_arr = backend.as_array(self._dflags) if self._on_device else None  # read with one copy
        self._grad_pending = False  # the gradient's slot is agreed with the update's (one agreement)
        self._params_pending = False  # the parameters' slot waits for the next read
        #: host reads of finite flags (device to host copies) and fused write-back operations, since creation
        self.flag_reads = 0
        self.write_back_ops = 0

    def _read_flags(self) -> np.ndarray:
        """The flag vector on the host: one device-to-host copy (one synchronisation). A parameter check
        left from the last step is settled here: non-finite parameters raise (its bound said they could not)."""
        vals = backend.to_host(self._dflags_arr)
        self.flag_reads += 1
        if self._params_pending:
            self._params_pending = False
            self._param_amax = float(vals[PARAMS])
            if not np.isfinite(self._param_amax):
                raise FloatingPointError("the last optimizer step made a parameter non-finite (found at this "
                                         "step's flag read; its bound said it could not); parameters lost")
        return vals

    def _gradient_flag(self) -> None:
        """This rank's gradient flag before the agreement (device: one read of the flag vector)."""
        if self._on_device:
            self._flag[0] = 0 if np.isfinite(self._read_flags()[GRAD]) else 1

    def _one_agreement(self) -> bool:
        """Whether this step's gradient is agreed together with its update (see the module's doc)."""
        return (self._on_device and self.scheme.name in SUM_SCHEMES and getattr(self, "rows", None) is None
                and not self.scheme.local_update)

    def _update_finite(self, out) -> bool:
        """Agree over ranks (the same 4-byte Allreduce) whether the exchanged update is finite (with a
        gradient not agreed yet: whether both are).

        Finite gradients can still sum to Inf in the exchange (values near
        3.4e38); the result is checked where it lies (``backend.array_module``)
        and the ranks agree, so a scheme whose ranks could see different
        results still skips on all of them together.
        """
        if self._on_device:
            abs_max_into(self._dflags[UPDATE], [self._flat if out is self.buffer else backend.to_torch(out)])
            vals = self._read_flags()  # the one read of this agreement
            self._update_amax = float(vals[UPDATE])
            bad = not np.isfinite(self._update_amax) or (self._grad_pending and not np.isfinite(vals[GRAD]))
        else:
            self._update_amax = backend.abs_max(out)  # one read pass, one host read
            bad = not np.isfinite(self._update_amax)
        self._grad_pending = False
        self._flag[0] = int(bad)
        with self.timer.phase("wait"):
            return self._all_finite()

    def _finish_sync(self, out) -> bool:
        """The exchanged update agreed on, then written into ``.grad`` (or the step skipped on every rank)."""
        finite = self._update_finite(out)
        if not self._others_active:  # every rank has joined (an agreement after the exchange)
            self._sync_ok = False
            return False
        if not finite:  # the exchange overflowed (or a gradient agreed with it): skipped on every rank
            return self._skip()
        with self.timer.phase("update"):
            self._write_back(out)
        self._sync_ok = True
        return True

    def _skip(self) -> bool:
        """A step every rank skips: the aggregate is not finite, and ``.grad`` says so (NaN) on every rank."""
        self.skipped_steps += 1
        for p in self.params:
            if p.grad is None:
                p.grad = torch.full_like(p, float("nan"))
            else:
                p.grad.fill_(float("nan"))
        self._sync_ok = False
        return False

    def _near_overflow(self) -> bool:
        """Whether the coming optimizer step could make a parameter non-finite (then snapshot first).

        Bound: a step moves a parameter by at most ``lr * |update| / (1 -
        momentum)`` plus weight decay (SGD), or by about ``lr`` (Adam-type);
        with |parameter| and that move both below 1e30 (float32 ends at
        3.4e38) no parameter can overflow, so the copy of every parameter is
        taken only when the last known |parameter| or ``lr * max|update| *
        1e3`` reaches 1e30 (or the last parameter check is not read yet).
        """
        scale = max(self.comm.size if self.op == "sum" else 1, 1) * self.gradient_predivide_factor
        lr = max(float(g.get("lr", 1.0)) for g in self.param_groups)
        return self._params_pending or not (self._param_amax < 1e30 and lr * self._update_amax * scale * 1e3 < 1e30
                                            and lr < 1e27)

    def _snapshot_parameters(self) -> None:
        """Keep the parameters before the optimizer's step (to restore them if it overflows)."""
        self.snapshots += 1
        if getattr(self, "_saved_params", None) is None:
            self._saved_params = [torch.empty_like(p) for p in self.params]
        torch._foreach_copy_(self._saved_params, [p.detach() for p in self.params])

    def _check_parameters(self, snapshot: bool) -> bool:
        """After the optimizer's step: whether the parameters are finite. On a device without a snapshot the
        check goes to its flag slot and is read with the next step's flags (True here: the bound holds)."""
        if (self._on_device and not snapshot and getattr(self, "rows", None) is None
                and not self.scheme.local_update):
            abs_max_into(self._dflags[PARAMS], self.params)
            self._params_pending = True
            return True
        return self._parameters_finite()

    def _parameters_finite(self) -> bool:
        """Whether every parameter is finite after the step (the same on every rank: same parameters,
        same update); records the largest |parameter| for the next step's bound."""
        if self._on_device:
            abs_max_into(self._dflags[PARAMS], self.params)
            self._params_pending = False
            self._param_amax = float(self._read_flags()[PARAMS])
        else:
            self._param_amax = backend.abs_max(self.params)  # one read pass (aminmax), one host read
        return bool(np.isfinite(self._param_amax))

    def _restore_parameters(self) -> None:
        torch._foreach_copy_([p.detach() for p in self.params], self._saved_params)
        self._param_amax = float("inf")
