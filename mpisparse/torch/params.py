"""The parameters' side of a local-update scheme (``localsgd``) in :class:`mpisparse.torch.DistributedOptimizer`.

Such a scheme (``local_update``) leaves each rank's own gradient in
``.grad`` and exchanges nothing in backward; the wrapped optimizer steps
every rank on its own.  :class:`ParameterSync` gives the scheme the
parameters around that step: before it, ``theta_0`` of a period when the
scheme asks (:meth:`before_step`); after it, at the end of a period, one flat
float32 vector of this rank's parameters followed by the model's float
buffers (BatchNorm's running statistics), which the scheme synchronizes in
place with one Allreduce (:meth:`after_step`), then written back in each
tensor's dtype.  The vector is one tensor on the model's device, seen by the
scheme zero-copy (:func:`mpisparse.backend.as_array`), made once.  The
copies are timed as ``compensate`` (the vector the scheme exchanges is
prepared), the write-back as ``update``.
"""

from __future__ import annotations

import torch

from .. import backend

__all__ = ["NO_SYNC", "ParameterSync"]


class ParameterSync:
    """A local-update scheme's parameters and buffers as one flat float32 vector, before and after the step."""

    def __init__(self, opt, model: torch.nn.Module | None):
        self.opt = opt
        self.scheme = opt.scheme
        self.tensors = list(opt.params) + [b for b in (model.buffers() if model is not None else ())
                                           if b.is_floating_point() and b.numel()]
        sizes = [t.numel() for t in self.tensors]
        self._flat = torch.empty(sum(sizes), dtype=torch.float32, device=opt.device)
        self._views = list(torch.split(self._flat, sizes))
        self.vector = backend.as_array(self._flat)

    @torch.no_grad()
    def _gather(self) -> None:
        with self.opt.timer.phase("compensate"):
            for view, t in zip(self._views, self.tensors):
                view.copy_(t.detach().reshape(-1))

    def before_step(self) -> None:
        """Hand the scheme ``theta_0`` where it needs it (a period's start not known yet)."""
        if self.scheme.needs_start():
            self._gather()
            self.scheme.set_start(self.vector)

    @torch.no_grad()
    def after_step(self) -> bool:
        """At the end of a period: the scheme synchronizes the parameters and buffers (on every rank at the
        same step), written back; the guard's bound of the parameters is read again.  Returns whether it
        synchronized."""
        if not self.scheme.sync_due():
            return False
        self._gather()
        self.scheme.after_step(self.vector)
        with self.opt.timer.phase("update"):
            for view, t in zip(self._views, self.tensors):
                t.copy_(view.view(t.shape))
            if not self.opt._parameters_finite():  # the same on every rank: the same synchronized parameters
                raise FloatingPointError(f"scheme {self.scheme.name!r}: the synchronized parameters are not finite")
        return True


class _NoSync:
    """What a scheme that exchanges gradients has in :class:`ParameterSync`'s place: nothing before or after."""

    def before_step(self) -> None:
        pass

    def after_step(self) -> bool:
        return False


#: the optimizer's parameter side for every scheme that is not a local-update one
NO_SYNC = _NoSync()
