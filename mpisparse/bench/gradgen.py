"""Synthetic gradients shaped like a real model's layers.

Values are heavy-tailed (Student-t, 3 degrees of freedom) with a per-layer
scale drawn log-normally, so layer norms differ as in real networks (the
property DEFT exploits).  Each rank's gradient is the sum of a component
shared by all ranks and one of its own, so ranks' top-k sets overlap
partially, as real gradients of the same model on different data do.

Both components are windows of one seeded pool of values (the same on every
rank), one window per layer, each starting at its own offset of the step: the
shared component's offsets depend on the step only, the private one's on the
step and the rank.  A window longer than what is left of the pool wraps to
its start.  The pool holds as many values as the largest layer (at least
:data:`POOL_MIN`, at most the whole vector), not one value per element:
no window wraps inside a layer, so no layer repeats a pair of values, and
the generator holds far less than a gradient buffer (9 MiB for resnet50's
25.6 M elements, against 98 MiB when the pool was as long as the vector).
A step costs two copies of the buffer and one scaling pass.
"""

from __future__ import annotations

import numpy as np

from ..backend.fusion import FusionLayout

#: least values in the pool (4 MiB of float32) when the vector is longer: variety for models of small layers
POOL_MIN = 1 << 20
#: values drawn at a time when the pool is made (the draw is float64: a small temporary, reused by malloc)
_DRAW_CHUNK = 1 << 15


class SyntheticGradients:
    def __init__(self, layout: FusionLayout, rank: int, seed: int = 0, df: float = 3.0,
                 pool_size: int | None = None):
        self.layout = layout
        self.rank = int(rank)
        self.seed = int(seed)
        m = default_pool_size(layout) if pool_size is None else int(pool_size)
        if not 1 <= m <= max(layout.n, 1):
            raise ValueError(f"pool_size {pool_size} must be in [1, {layout.n}] (the vector's length)")
        rng = np.random.default_rng([self.seed, 0])
        self.pool = np.empty(m, dtype=np.float32)
        for a in range(0, m, _DRAW_CHUNK):
            b = min(m, a + _DRAW_CHUNK)
            self.pool[a:b] = rng.standard_t(df, size=b - a)
        self.layer_scale = np.exp(rng.normal(0.0, 1.0, size=len(layout))).astype(np.float32) * 1e-3

    def offsets(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """Step ``iteration``'s window starts per layer: (shared by all ranks, this rank's own)."""
        m, layers = self.pool.shape[0], len(self.layout)
        shared = np.random.default_rng([self.seed, 1, iteration]).integers(m, size=layers)
        private = np.random.default_rng([self.seed, 2, self.rank, iteration]).integers(m, size=layers)
        return shared, private

    def fill(self, out: np.ndarray, iteration: int) -> np.ndarray:
        """Write step ``iteration``'s gradient of this rank into ``out`` (no temporaries)."""
        shared, private = self.offsets(iteration)
        for i, scale in enumerate(self.layer_scale):
            view = self.layout.view(out, i)
            _window(view, self.pool, int(shared[i]), add=False)
            _window(view, self.pool, int(private[i]), add=True)
            view *= scale
        return out


def default_pool_size(layout: FusionLayout) -> int:
    """The pool's length: the largest layer's size, at least :data:`POOL_MIN`, at most the vector's length."""
    return max(1, min(layout.n, max(POOL_MIN, max(s.size for s in layout.layers))))


def _window(dst: np.ndarray, pool: np.ndarray, start: int, *, add: bool) -> None:
    """Copy (``add`` False) or add ``pool[start:start + len(dst)]`` into ``dst``, wrapping around the pool."""
    pos, size, m = 0, dst.shape[0], pool.shape[0]
    while pos < size:
        take = min(size - pos, m - start)
        if add:
            dst[pos:pos + take] += pool[start:start + take]
        else:
            dst[pos:pos + take] = pool[start:start + take]
        pos, start = pos + take, 0
