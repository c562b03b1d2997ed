"""``topk``: local Top-k of the error-compensated vector, gathered and summed.

Each rank selects the ``k = d n`` entries of largest ``|e + g|`` (over the
whole vector, or per layer with ``--layerwise``: ``k_l = ceil(d n_l)``),
sends its indices and values with Allgatherv and sums all ranks' sets.
Ranks select different sets, so up to ``W k`` distinct entries are updated
per step: the gradient build-up of DEFT (Yoon & Oh, Fig. 1).  It is measured
(``density_actual``), never hidden.
"""

from __future__ import annotations

import math

import numpy as np

from .. import backend
from ..backend import reference
from .base import SELECT_KERNEL, WIRE_DTYPE, Offer, SchemeOption, SparseGatherScheme, register


@register("topk")
class TopK(SparseGatherScheme):
    compiled_kernels = ("fused", "scatter_sum")

    options = (
        SchemeOption("layerwise", bool, False,
                     "topk: select ceil(density * size) entries in each layer instead of over the whole vector"),
        SELECT_KERNEL,
        WIRE_DTYPE,
    )

    @classmethod
    def bucket_reason(cls, options):
        return None if options.get("layerwise") else "without --layerwise its top-k spans the whole vector"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._scratch = None
        if self.opts["layerwise"]:
            self._layer_k = np.array([min(s.size, math.ceil(self.density * s.size)) for s in self.layout.layers],
                                     dtype=np.int64)
            self._layer_starts = np.array([s.offset for s in self.layout.layers], dtype=np.int64)
            self._layer_sizes = np.array([s.size for s in self.layout.layers], dtype=np.int64)

    def compensate_select(self, grad):
        if not self.opts["layerwise"]:  # whole-vector top-k: fused with the compensation where it can be
            return Offer(*self.compensate_topk(grad, self.k))
        return super().compensate_select(grad)

    def select(self, acc) -> np.ndarray:
        xp = backend.array_module(acc)
        if self._scratch is None:
            self._scratch = xp.empty_like(acc)
        if not self.opts["layerwise"]:
            return reference.topk_abs(acc, self.k, self.select_kernel, scratch=self._scratch)
        # every layer in one segmented call (no per-layer loop; a per-layer loop with another --select-kernel)
        return reference.segment_topk_abs(acc, self._layer_starts, self._layer_sizes, self._layer_k,
                                          self.select_kernel, scratch=self._scratch)
