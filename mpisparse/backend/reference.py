"""The seed papers' selection primitives, for reproducing their timings (``--select-kernel``).

The schemes select with this toolkit's own kernels (``native``: a
linear-time sampled-threshold top-k, fused with the compensation where it
can be).  The papers timed other primitives, and some of their claims are
about those primitives' cost:

``torch``
    ``torch.topk(|x|, k)``, what the DEFT reference implementation calls
    (once on the whole vector for Top-k and CLT-k, once per layer of a
    rank's share for DEFT's Alg. 5).  Its cost grows faster than linearly
    in ``n`` for a fixed density, which is what makes DEFT's eq. 9 speedup
    above linear.
``sort``
    a copy of ``|x|`` sorted: DCT's "copy-and-sort routine which computes
    the top-K threshold" (Fig. 8a), ``O(n log n)``.

Same contracts as :func:`mpisparse.backend.topk_abs` and
:func:`mpisparse.backend.segment_topk_abs` (exactly ``k`` indices of the
largest magnitudes, any order, :func:`mpisparse.backend.index_dtype`), so a
scheme gives the same result with any kernel (up to ties).  ``native``
calls the backend.
"""

from __future__ import annotations

import importlib.util
from typing import Sequence

from . import array_module, index_dtype, to_torch
from . import segment_topk_abs as _native_segment_topk_abs
from . import topk_abs as _native_topk_abs

__all__ = ["KERNELS", "check_kernel", "kth_largest_abs", "segment_topk_abs", "topk_abs"]

#: the selection primitives, the toolkit's own first
KERNELS: tuple[str, ...] = ("native", "torch", "sort")


def check_kernel(kernel: str) -> str:
    """``kernel`` if it is one of :data:`KERNELS` (and torch is importable for ``torch``), else a ValueError."""
    if kernel not in KERNELS:
        raise ValueError(f"--select-kernel is {kernel!r}; allowed values are {', '.join(KERNELS)}")
    if kernel == "torch" and importlib.util.find_spec("torch") is None:
        raise ValueError("--select-kernel torch needs PyTorch: pip install '.[train]'")
    return kernel


def _from_torch(t, like):
    """A torch tensor as an array of ``like``'s array module (no copy)."""
    xp = array_module(like)
    if xp.__name__ == "numpy":
        return t.numpy()
    return xp.from_dlpack(t)


def topk_abs(x, k: int, kernel: str = "native", *, scratch=None):
    """Indices of the ``k`` entries of largest magnitude (exactly ``k``), selected with ``kernel``."""
    n = int(x.shape[0])
    k = int(k)
    if not 0 <= k <= n:
        raise ValueError(f"k is {k}; it must lie in [0, {n}] for a vector of {n} elements.")
    if kernel == "native":
        return _native_topk_abs(x, k, scratch=scratch)
    idt = index_dtype(n)
    xp = array_module(x)
    if k == 0:
        return xp.empty(0, dtype=idt)
    if kernel == "torch":
        import torch

        idx = torch.topk(to_torch(x).abs(), k, sorted=False).indices
        return _from_torch(idx, x).astype(idt, copy=False)
    if kernel == "sort":  # copy, sort, keep the last k
        return xp.argsort(xp.abs(x), kind="stable")[n - k:].astype(idt, copy=False)
    raise ValueError(f"--select-kernel is {kernel!r}; allowed values are {', '.join(KERNELS)}")


def kth_largest_abs(x, k: int, kernel: str = "native", *, scratch=None) -> float:
    """The ``k``-th largest ``|x|`` (``k`` in ``[1, n]``), found with ``kernel`` (an explicit scalar read).

    ``sort`` is DCT's copy-and-sort: the whole ``|x|`` sorted, the value at
    rank ``k`` read; the others take the smallest magnitude of the top-k.
    """
    n = int(x.shape[0])
    k = int(k)
    if not 1 <= k <= n:
        raise ValueError(f"k is {k}; it must lie in [1, {n}] for a vector of {n} elements.")
    xp = array_module(x)
    if kernel == "sort":
        return float(xp.sort(xp.abs(x))[n - k])
    idx = topk_abs(x, k, kernel, scratch=scratch)
    return float(xp.abs(x[idx]).min())


def segment_topk_abs(x, starts: Sequence[int], sizes: Sequence[int], ks: Sequence[int], kernel: str = "native",
                     *, scratch=None):
    """Top-``ks[i]`` by magnitude in every segment ``x[starts[i]:starts[i] + sizes[i]]``, flat indices into
    ``x`` grouped by segment in the given order.

    ``native`` is the backend's segmented kernel (a fixed number of calls);
    the others run one selection per segment, the DEFT reference's loop
    over a rank's layers.
    """
    if kernel == "native":
        return _native_segment_topk_abs(x, starts, sizes, ks, scratch=scratch)
    xp = array_module(x)
    idt = index_dtype(int(x.shape[0]))
    parts = []
    for a, s, k in zip(starts, sizes, ks):
        a, s, k = int(a), int(s), int(k)
        if not 0 <= k <= s:
            raise ValueError(f"a segment of {s} elements asks for k = {k}; it must lie in [0, {s}].")
        if k:
            parts.append(topk_abs(x[a:a + s], k, kernel).astype(idt, copy=False) + idt(a))
    return xp.concatenate(parts) if parts else xp.empty(0, dtype=idt)
