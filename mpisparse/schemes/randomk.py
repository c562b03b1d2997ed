"""``randomk``: the same ``k`` random indices on every rank, values Allreduced.

Every rank seeds its generator with ``(seed, iteration)``, so all ranks draw
the same index set without exchanging it; only the ``k`` values travel
(Allreduce).  Density is exactly ``k / n``.
"""

from __future__ import annotations

import numpy as np

from .. import backend
from .base import WIRE_DTYPE, Scheme, register


@register("randomk")
class RandomK(Scheme):

    options = (WIRE_DTYPE,)
    _out_indices = None  # the entries the output holds (zeroed at the next step)

    def indices(self, iteration: int, like=None):
        """The step's index set, on ``like``'s array module (drawn on the host: every rank the same)."""
        rng = np.random.default_rng([self.seed, iteration])
        return backend.randomk(self.n, self.k, rng, like=like)

    def _step(self, grad):
        with self.phase("compensate"):
            acc = self.memory.compensate(grad)
        with self.phase("select"):
            idx = self.indices(self.iteration, like=acc)
            vals = acc[idx]
        with self.phase("exchange_values"):
            lost = self.sum_values(vals)
        with self.phase("update"):
            self.memory.update(acc, idx)
            self.keep_lost(idx, lost)
            out = self.write_output(idx, vals, 1.0 / self.comm.size, self._out_indices)
        self._out_indices = idx
        return out

    def selected_global(self) -> int:
        return self.k
