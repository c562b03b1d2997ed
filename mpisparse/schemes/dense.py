"""``dense``: the uncompressed baseline, one Allreduce of the whole vector.

``--wire-dtype float16|bfloat16`` is the optimized dense baseline's wire: 16-bit values, half the bytes,
summed in float32 by a reduce-scatter (:func:`mpisparse.mpi.wire.allreduce_sum`; float16 carries
``g / W`` so that the sum cannot overflow).
"""

from __future__ import annotations

import numpy as np

from ..mpi import wire
from .base import WIRE_DTYPE, Scheme, register


@register("dense")
class Dense(Scheme):
    """Sum of every rank's gradient with Allreduce, divided by the world size.

    Density is 1 whatever ``--density`` says; there is nothing to remember.
    """

    uses_memory = False
    options = (WIRE_DTYPE,)

    @classmethod
    def bucket_reason(cls, options):
        return None  # an elementwise sum

    def _step(self, grad):
        out = self.output()
        with self.phase("exchange_values"):
            wire.allreduce_sum(self.comm, grad, self.wire, out)
        with self.phase("update"):
            if self.comm.size > 1:
                out *= np.float32(1.0 / self.comm.size)
        return out

    def selected_global(self) -> int:
        return self.n
