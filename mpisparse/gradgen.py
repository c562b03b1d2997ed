"""Synthetic gradients shaped like a real model's layers.

Values are heavy-tailed (Student-t, 3 degrees of freedom) with a per-layer
scale drawn log-normally, so layer norms differ as in real networks (the
property DEFT exploits).  Each rank's gradient is the sum of a component
shared by all ranks and one of its own, so ranks' top-k sets overlap
partially, as real gradients of the same model on different data do.

Both components are rotations of one seeded pool of ``n`` values (same on
every rank), with per-step offsets: the shared offset depends on the step
only, the private one on the step and the rank.  A step costs two copies of
the buffer and the generator holds one extra buffer (the pool).
"""

from __future__ import annotations

import numpy as np

from .fusion import FusionLayout


class SyntheticGradients:
    def __init__(self, layout: FusionLayout, rank: int, seed: int = 0, df: float = 3.0):
        self.layout = layout
        self.rank = int(rank)
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 0])
        self.pool = rng.standard_t(df, size=layout.n).astype(np.float32)
        self.layer_scale = np.exp(rng.normal(0.0, 1.0, size=len(layout))).astype(np.float32) * 1e-3

    def fill(self, out: np.ndarray, iteration: int) -> np.ndarray:
        """Write step ``iteration``'s gradient of this rank into ``out``."""
        n = self.layout.n
        shared = int(np.random.default_rng([self.seed, 1, iteration]).integers(n))
        private = int(np.random.default_rng([self.seed, 2, self.rank, iteration]).integers(n))
        pool = self.pool
        out[: n - shared] = pool[shared:]
        out[n - shared:] = pool[:shared]
        out[: n - private] += pool[private:]
        out[n - private:] += pool[:private]
        for i, scale in enumerate(self.layer_scale):
            self.layout.view(out, i)[...] *= scale
        return out
