"""``threshold``: hard threshold, send every entry with ``|e + g| >= tau``.

``--threshold T`` fixes tau.  Without it tau is calibrated once, at the
first step, as the ``k``-th largest ``|e + g|`` of this rank (``k = d n``;
``k = n`` gives tau = 0, so density 1 sends everything), then held fixed:
the achieved density drifts with the gradients and is reported as measured.
Counts vary per rank and per step, so the exchange is Allgatherv.
"""

from __future__ import annotations

import numpy as np

from .. import backend
from .base import WIRE_DTYPE, Offer, SchemeOption, SparseGatherScheme, register


@register("threshold")
class Threshold(SparseGatherScheme):
    compiled_kernels = ("fused", "select", "scatter_sum")

    options = (
        SchemeOption("threshold", float, None,
                     "threshold: fixed magnitude threshold tau (default: calibrated at step 1 from --density)",
                     low=0.0),
        WIRE_DTYPE,
    )

    @classmethod
    def bucket_reason(cls, options):
        if options.get("threshold") is None:
            return "without --threshold its tau is calibrated over the whole vector"
        return None

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.tau = self.opts["threshold"]
        self._scratch = None

    def compensate_select(self, grad):
        """Once tau is known: compensation and the threshold test in one fused pass where possible; the
        offer is sent whole, so the pass also collects its values and zeroes the residual there."""
        from ..backend import fused

        residual = None if self.tau is None else self.fused_residual(grad)
        if residual is None:
            return super().compensate_select(grad)
        with self.phase("compensate"):
            if self._scratch is None:
                self._scratch = np.empty_like(grad)
            idx, vals = fused.compensate_threshold(residual, grad, self.tau, scratch=self._scratch, values=True,
                                                   clear=self.memory.in_place)
        return Offer(residual, idx, vals, sent=vals is not None)

    def select(self, acc) -> np.ndarray:
        if self._scratch is None:
            self._scratch = backend.array_module(acc).empty_like(acc)
        if self.tau is None:
            self.tau = self.calibrate(acc)
        return backend.threshold_select(acc, self.tau, scratch=self._scratch)

    def calibrate(self, acc) -> float:
        if self.k >= self.n:
            return 0.0
        idx = backend.topk_abs(acc, self.k, scratch=self._scratch)
        return float(backend.array_module(acc).abs(acc[idx]).min())  # one explicit scalar read, once

    def _extra_state(self):
        return {"tau": self.tau}

    def _load_extra_state(self, extra):
        self.tau = extra.get("tau", self.tau)
