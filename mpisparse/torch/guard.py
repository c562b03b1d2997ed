"""What keeps :class:`mpisparse.torch.DistributedOptimizer`'s parameters finite: the agreement on a
non-finite exchanged update, and the snapshot taken before an optimizer step that could overflow.

A mixin of the optimizer class (it reads the optimizer's ``comm``, ``timer``,
``params``, ``param_groups``, ``op``, ``gradient_predivide_factor`` and its
4-byte flag agreement ``_all_finite``).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import backend


class OverflowGuard:
    """Non-finite results (overflow): the exchanged update's check, and the parameters' snapshot and check."""

    def _update_finite(self, out) -> bool:
        """Agree over ranks (the same 4-byte Allreduce) whether the exchanged update is finite.

        Finite gradients can still sum to Inf in the exchange (values near
        3.4e38); the result is checked where it lies (``backend.array_module``)
        and the ranks agree, so a scheme whose ranks could see different
        results still skips on all of them together.
        """
        self._update_amax = backend.abs_max(out)  # one read pass, one host read
        self._flag[0] = 0 if np.isfinite(self._update_amax) else 1
        with self.timer.phase("wait"):
            return self._all_finite()

    def _near_overflow(self) -> bool:
        """Whether the coming optimizer step could make a parameter non-finite (then snapshot first).

        Bound: a step moves a parameter by at most ``lr * |update| / (1 -
        momentum)`` plus weight decay (SGD), or by about ``lr`` (Adam-type);
        with |parameter| and that move both below 1e30 (float32 ends at
        3.4e38) no parameter can overflow, so the copy of every parameter is
        taken only when the last known |parameter| or ``lr * max|update| *
        1e3`` reaches 1e30.
        """
        scale = max(self.comm.size if self.op == "sum" else 1, 1) * self.gradient_predivide_factor
        lr = max(float(g.get("lr", 1.0)) for g in self.param_groups)
        return not (self._param_amax < 1e30 and lr * self._update_amax * scale * 1e3 < 1e30 and lr < 1e27)

    def _snapshot_parameters(self) -> None:
        """Keep the parameters before the optimizer's step (to restore them if it overflows)."""
        self.snapshots += 1
        if getattr(self, "_saved_params", None) is None:
            self._saved_params = [torch.empty_like(p) for p in self.params]
        torch._foreach_copy_(self._saved_params, [p.detach() for p in self.params])

    def _parameters_finite(self) -> bool:
        """Whether every parameter is finite after the step (the same on every rank: same parameters,
        same update); records the largest |parameter| for the next step's bound."""
        self._param_amax = backend.abs_max(self.params)  # one read pass (aminmax), one host read
        return bool(np.isfinite(self._param_amax))

    def _restore_parameters(self) -> None:
        torch._foreach_copy_([p.detach() for p in self.params], self._saved_params)
        self._param_amax = float("inf")
