"""``localsgd``: local SGD, and DiLoCo's outer step, a peer that communicates less often instead of less.

Local SGD (periodic parameter averaging; Stich, "Local SGD Converges Fast and
Communicates Little", ICLR 2019) and DiLoCo (Douillard et al., "DiLoCo:
Distributed Low-Communication Training of Language Models", 2023, Algorithm 1).
Written from the papers.  With ``W`` ranks and ``H = --local-steps``:

1. a period starts from parameters ``theta_0``, the same on every rank;
2. for ``H`` steps each rank steps its own optimizer (the *inner* optimizer,
   the one :class:`mpisparse.torch.DistributedOptimizer` wraps) on its own
   gradient: this scheme's :meth:`step` returns the rank's gradient as the
   update and exchanges nothing (the 4-byte finite-flag agreement of the
   optimizer still runs every step, so a non-finite gradient on any rank is
   skipped on all of them and the periods stay in step);
3. after the optimizer's step that ends the period (:meth:`after_step`, called
   by the optimizer with a flat float32 copy of this rank's parameters
   ``theta_r``, then its float buffers such as BatchNorm's running statistics):
   one Allreduce of that vector, and
   * plain local SGD (``--outer-lr 1 --outer-momentum 0``, the defaults): the
     parameters become the mean ``(1/W) sum_r theta_r``;
   * DiLoCo's outer step otherwise: the outer gradient
     ``Delta = (1/W) sum_r (theta_0 - theta_r)`` (the Allreduce sums the
     ranks' changes) drives SGD with Nesterov momentum (PyTorch's convention,
     no dampening): ``m = mu m + Delta``, ``theta = theta_0 - lr (Delta + mu m)``
     with ``lr = --outer-lr``, ``mu = --outer-momentum``.  The paper's setting
     is ``--outer-lr 0.7 --outer-momentum 0.9`` (its inner optimizer is AdamW,
     here the one the optimizer wraps: ``train``'s SGD);
   the buffers become their mean either way; the new parameters start the next
   period (``theta_0``).  The inner optimizer's own state (momentum) stays
   each rank's.

Properties and decisions:

* ``H = 1`` with plain averaging and an optimizer without state is dense
  data-parallel SGD up to rounding (the mean of ``theta - lr g_r`` is
  ``theta - lr mean(g_r)``).
* **Bytes**: ``2 (W-1)/W 4 (n + b)`` per rank on a sync step (``b``: the float
  buffers' elements), nothing else but the flags: ``1/H`` of dense's per step.
* **Density** (``density_actual``, :meth:`selected_global`): ``n`` on a step
  that synchronized, 0 on a local step, so the run's mean is the fraction of
  steps that communicate, ``1/H``; ``--density`` is not used.
* **State** (checkpointed): the iteration (the position in the period is
  ``iteration mod H``), ``theta_0`` and the momentum ``m`` (DiLoCo only; both
  the same on every rank: a resume at another world size carries them over)
  and the count of syncs.  Between syncs the ranks' parameters and inner
  optimizer states differ: ``train`` checkpoints them per rank
  (:class:`mpisparse.train.loop.CollectiveStep`); at another world size every
  new rank starts from old rank 0's.
* Evaluating between syncs evaluates each rank's own parameters (on its share
  of the test set); after a sync every rank holds the same.
* The scheme averages parameters, so only a parameter owner runs it (``train``,
  ``bench tta``, :class:`~mpisparse.torch.DistributedOptimizer`); the drivers
  that see gradients only (``bench step``, a DDP hook, a pipeline's replicas)
  refuse it (:attr:`local_refusal`).  No overlap with backward (nothing is
  exchanged then), float32 on the wire; ``--hierarchical`` applies (one Allreduce).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from .base import CollectiveScheme, SchemeOption, register

__all__ = ["LocalSGD", "outer_step"]

LOCAL_STEPS = SchemeOption(
    "local_steps", int, 8,
    "localsgd, ps: minibatch steps of local SGD between two communications (localsgd: H, parameters averaged "
    "every H steps, default 8; plumpdp, slimdp: p, default 1)", low=1)


def outer_step(start, delta, velocity, lr: float, momentum: float):
    """DiLoCo's outer step (SGD with Nesterov momentum, PyTorch's convention) from ``start`` by the outer
    gradient ``delta``: returns ``(new parameters, new velocity)``; ``velocity`` None is a zero buffer (the
    first step: ``m = delta``).  Pure: works on NumPy or CuPy arrays, allocates its results."""
    velocity = delta.copy() if velocity is None else momentum * velocity + delta
    step = delta + momentum * velocity if momentum else delta
    return start - lr * step, velocity


@register("localsgd")
class LocalSGD(CollectiveScheme):
    """Local SGD: every rank steps on its own gradient; parameters averaged every ``--local-steps`` steps, or
    DiLoCo's outer Nesterov step on the averaged change (``--outer-lr``, ``--outer-momentum``)."""

    uses_memory = False
    local_update = True
    options = (
        LOCAL_STEPS,
        SchemeOption("outer_lr", float, 1.0,
                     "localsgd: the outer step's learning rate on the averaged change (1 with --outer-momentum 0: "
                     "plain averaging; DiLoCo: 0.7)", low=0.0, low_open=True),
        SchemeOption("outer_momentum", float, 0.0,
                     "localsgd: the outer step's Nesterov momentum (0: none; DiLoCo: 0.9)", low=0.0, high=0.999),
    )
    wire_refusal = "it averages float32 parameters"
    #: why a driver that sees gradients only cannot run it (bench step, a DDP hook, a pipeline's replicas)
    local_refusal = ("averages parameters every --local-steps steps, after the optimizer's step, not gradients: it "
                     "runs where the parameters are (train, bench tta, mpisparse.torch.DistributedOptimizer)")

    @classmethod
    def bucket_reason(cls, options):
        return "it exchanges parameters after the optimizer's step, not gradients during backward"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        o = self.opts
        self.local_steps = int(o["local_steps"])
        self.outer_lr, self.outer_momentum = float(o["outer_lr"]), float(o["outer_momentum"])
        #: plain averaging: the mean itself, no theta_0 kept (the outer step would round it)
        self.plain = self.outer_lr == 1.0 and self.outer_momentum == 0.0
        self.start = None  # theta_0 of the running period (DiLoCo), on the gradients' array module
        self.velocity = None  # the outer momentum buffer (DiLoCo)
        self.syncs = 0
        self._due = False  # the last step ended a period: after_step synchronizes
        self.synced = False  # the last step synchronized (selected_global)

    def _place_state(self) -> None:
        super()._place_state()
        for name in ("start", "velocity"):
            if getattr(self, name) is not None:
                setattr(self, name, backend.to_module(getattr(self, name), self.xp))

    # -------------------------------------------------------------- a local step
    def _step(self, grad):
        """Step 2: this rank's gradient is its update; nothing is exchanged."""
        self.synced = False
        self._due = (self.iteration + 1) % self.local_steps == 0
        if self._target is not None:
            if self._target is not grad:
                self._target[...] = grad
            return self._target
        out = self.output()
        out[...] = grad
        return out

    # -------------------------------------------------------------- the parameters' side
    def needs_start(self) -> bool:
        """Whether the optimizer must hand in ``theta_0`` before this step (DiLoCo, none known yet)."""
        return not self.plain and self.start is None

    def set_start(self, params) -> None:
        """``theta_0`` of the running period: a copy of the flat float32 parameters ``params``."""
        self.start = params[:self.n].copy()

    def sync_due(self) -> bool:
        """Whether the step just taken ends a period (then :meth:`after_step` synchronizes)."""
        return self._due

    def after_step(self, vec) -> bool:
        """Step 3 at the end of a period, in place on ``vec``: this rank's flat float32 parameters
        (``vec[:n]``) then its float buffers; afterwards they hold the synchronized values, the same on every
        rank.  Returns whether it synchronized (False on a local step: ``vec`` untouched)."""
        if not self._due:
            return False
        self._due = False
        W, n = self.comm.size, self.n
        scale = np.float32(1.0 / W)
        if self.plain:
            with self.phase("exchange_values"):
                self.comm.allreduce(vec, vec)
            with self.phase("update"):
                vec *= scale
        else:
            params = vec[:n]
            with self.phase("update"):  # this rank's change over the period, theta_0 - theta_r
                self.xp.subtract(self.start, params, out=params)
            with self.phase("exchange_values"):
                self.comm.allreduce(vec, vec)
            with self.phase("update"):
                vec *= scale
                theta, self.velocity = outer_step(self.start, params, self.velocity, self.outer_lr,
                                                  self.outer_momentum)
                params[...] = theta
                self.start = theta
        self.syncs += 1
        self.synced = True
        return True

    def selected_global(self) -> int:
        """``n`` when the last step synchronized (every parameter crossed the wire), else 0."""
        return self.n if self.synced else 0

    # -------------------------------------------------------------- state
    def _extra_state(self) -> dict[str, Any]:
        host = (lambda a: None if a is None else np.array(backend.to_host(a), dtype=np.float32, copy=True))
        return {"start": host(self.start), "velocity": host(self.velocity), "syncs": self.syncs}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self.syncs = int(extra.get("syncs", 0))
        for name in ("start", "velocity"):
            v = extra.get(name)
            if v is not None and np.shape(v) != (self.n,):
                raise ValueError(f"localsgd state {name!r} has shape {np.shape(v)}; expected ({self.n},)")
            setattr(self, name, None if v is None else backend.to_module(np.array(v, dtype=np.float32), self.xp))
        self._due = self.synced = False
