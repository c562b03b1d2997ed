"""The NumPy kernel API: the module :func:`mpisparse.backend.kernels` returns for host arrays.

The backend dispatches on the array module to one module per array library
that holds the whole kernel API under the same names (this one for NumPy,
:mod:`.cupy_kernels` for CuPy; the tests swap such a module whole).  This
module is that API and nothing else; the kernels live by family:

* :mod:`.numpy_select`: ``threshold_select``, ``topk_abs``,
  ``estimate_threshold``, ``randomk``, ``rowwise_topk_mask`` (and the
  tunables and helpers they share);
* :mod:`.numpy_segments`: the segments' argument checks and ``segment_norms``;
* :mod:`.numpy_segment_topk`: ``segment_topk_abs`` and its sample sizing.

The arguments and results common to all kernels: :mod:`.numpy_select`.
"""

from __future__ import annotations

from . import index_dtype  # the one place the index width is decided
from .numpy_segment_topk import segment_topk_abs
from .numpy_segments import segment_norms
from .numpy_select import CHUNK, estimate_threshold, randomk, rowwise_topk_mask, threshold_select, topk_abs

__all__ = [
    "topk_abs",
    "threshold_select",
    "estimate_threshold",
    "randomk",
    "rowwise_topk_mask",
    "segment_norms",
    "segment_topk_abs",
    "index_dtype",
    "CHUNK",
]
