"""``dense``: the uncompressed baseline, one Allreduce of the whole vector."""

from __future__ import annotations

import numpy as np

from .base import Scheme, register


@register("dense")
class Dense(Scheme):
    """Sum of every rank's gradient with Allreduce, divided by the world size.

    Density is 1 whatever ``--density`` says; there is nothing to remember.
    """

    uses_memory = False

    @classmethod
    def bucket_reason(cls, options):
        return None  # an elementwise sum

    def _step(self, grad):
        out = self.output()
        with self.phase("exchange_values"):
            self.comm.allreduce(grad, out)
        with self.phase("update"):
            if self.comm.size > 1:
                out *= np.float32(1.0 / self.comm.size)
        return out

    def selected_global(self) -> int:
        return self.n
