"""The CuPy kernel API: the NumPy kernels' API and results on device arrays.

:func:`mpisparse.backend.kernels` picks this module for CuPy arrays (and for
torch CUDA tensors, which :func:`mpisparse.backend.as_array` views as CuPy
arrays through DLPack without a copy).  Every function has the name, the
arguments and the result of its counterpart in
:mod:`mpisparse.backend.numpy_kernels`, with two documented differences:
index arrays come back in no particular order (the NumPy kernels' are
ascending for ``threshold_select`` and ``randomk``), and the top-k kernels
rank NaN as the largest magnitude on every path (magnitude keys: :mod:`.cupy_select`).  CuPy is
imported on first use only, so these modules import on a machine without it;
calling a kernel there raises :class:`RuntimeError` ("no GPU/CuPy available").

Like :mod:`.numpy_kernels`, this module is the dispatch's API (one module per
array library holding every kernel under the same names) and nothing else;
the kernels live by family:

* :mod:`.cupy_launch`: CuPy on first use, the CUDA C sources, their
  compiled kernels, launch geometry, the shared argument checks
  (``available``, ``kernel_source``, ``KERNEL_SOURCES``);
* :mod:`.cupy_select`: ``threshold_select`` (and
  ``threshold_select_values``), ``topk_abs`` (``auto_method``,
  ``AUTO_TABLE``), ``estimate_threshold``, ``randomk``,
  ``rowwise_topk_mask``;
* :mod:`.cupy_segments`: ``segment_norms``, ``segment_topk_abs``;
* :mod:`.cupy_scatter`: the sparse exchanges' ``scatter_sum``,
  ``scatter_add``, ``gather_clear``.
"""

from __future__ import annotations

from . import index_dtype  # the one place the index width is decided
from .cupy_launch import KERNEL_SOURCES, available
from .cupy_scatter import gather_clear, scatter_add, scatter_sum
from .cupy_segments import segment_norms, segment_topk_abs
from .cupy_select import (AUTO_TABLE, auto_method, estimate_threshold, randomk, rowwise_topk_mask,
                          threshold_select, threshold_select_values, topk_abs)

__all__ = [
    "topk_abs",
    "threshold_select",
    "threshold_select_values",
    "estimate_threshold",
    "randomk",
    "rowwise_topk_mask",
    "segment_norms",
    "segment_topk_abs",
    "auto_method",
    "AUTO_TABLE",
    "index_dtype",
    "scatter_sum",
    "scatter_add",
    "gather_clear",
    "available",
    "KERNEL_SOURCES",
]

