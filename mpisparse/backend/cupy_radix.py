"""Exact top-k in about two reads of the input: ``topk_abs(method="radix2")`` (CUDA C in ``cuda/radix.cu``).

A radix select over the magnitude keys (the bits of ``|v|``) whose every
decision stays on the device:

* digits of at most 11 bits from the top (float32: 11, 11, 9; float64:
  five of 11, then 8), one launch of the same kernel per digit and one for
  the output, all with one grid;
* pass 0 histograms digit 0; pass ``q`` filters by the bucket chosen for
  digit ``q-1`` -- keys above it are winners (appended to the output), keys
  in it are candidates, histogrammed on digit ``q`` and written (index and
  key) to a candidate buffer when the bucket fits it -- so the filtering of
  one radix pass is fused with the histogram of the next;
* the last block of a pass to finish (an atomic count of finished blocks)
  scans the merged histogram and picks the bucket holding the need-th
  largest key; when that bucket holds exactly the remaining need, or its
  digit was the last, the next pass writes the output (ties: the first of
  them to arrive, up to the need) and the launches after it return at once
  (early stop);
* later passes read the candidate buffer instead of ``x`` (two reads of
  ``x`` in all) unless a bucket outgrew it (mostly-equal inputs), then ``x``
  once more: still exact.

No host synchronisation inside the call, and nothing read back: the output
always holds exactly ``k`` distinct indices.  The buffers (histogram and
state, two candidate buffers of :func:`candidate_capacity` entries, the
output) form a workspace per (device, size, k, dtypes) reused across calls,
and the memset plus ``P + 1`` launches replay as one CUDA graph from the
second call on the same input (:mod:`.cupy_graph`).
"""

from __future__ import annotations

import numpy as np

from . import cupy_graph as _graph
from .cupy_launch import BLOCK, _cupy, _grid, _in, _kernel, _key_dtype, _tn

#: Bits per digit at most (``R2_BITS`` in ``cuda/radix.cu``) and the histogram's bins.
DIGIT_BITS = 11
BINS = 1 << DIGIT_BITS
#: Elements per thread per iteration of the passes (``R2_ILP`` in ``cuda/radix.cu``; a pass over an aligned
#: ``x`` loads ``R2_VILP`` = 2 16-byte vectors instead): sizes the grid.
ILP = 4
#: Device state slots after the histogram (``RS_*`` in ``cuda/radix_select.cuh``: 10 used).
STATE_SLOTS = 16
#: A candidate buffer holds ``n // CANDIDATE_FRACTION`` entries (at least :data:`MIN_CANDIDATES`).
CANDIDATE_FRACTION = 8
MIN_CANDIDATES = 4096


def digits(dtype) -> tuple[tuple[int, int], ...]:
    """``(shift, width)`` of each digit of ``dtype``'s magnitude keys, from the top (31 or 63 bits)."""
    hi = 31 if np.dtype(dtype).itemsize == 4 else 63
    out = []
    while hi > 0:
        w = min(DIGIT_BITS, hi)
        out.append((hi - w, w))
        hi -= w
    return tuple(out)


def candidate_capacity(n: int) -> int:
    """Entries of each candidate buffer for an input of ``n``: a bucket that outgrows it makes a pass read ``x``."""
    return min(n, max(MIN_CANDIDATES, n // CANDIDATE_FRACTION))


def _workspace(w, k: int, idt):
    cp = _cupy()
    n = w.shape[0]
    kdt = _key_dtype(w.dtype)

    def build(ws):
        ws.buf = cp.zeros(BINS + STATE_SLOTS, dtype=np.uint64)  # histogram, then the state; zeroed per call
        ws.hist, ws.state = ws.buf[:BINS], ws.buf[BINS:]
        ws.cap = candidate_capacity(n)
        ws.cand_idx = (cp.empty(ws.cap, dtype=idt), cp.empty(ws.cap, dtype=idt))
        ws.cand_key = (cp.empty(ws.cap, dtype=kdt), cp.empty(ws.cap, dtype=kdt))
        ws.out = cp.empty(k, dtype=idt)

    return _graph.workspace(("topk_radix2", _graph.device_of(w), n, k, w.dtype.char, np.dtype(idt).char),
                            build)


def topk(w, k: int, idt, reuse: bool = False):
    """The exact top ``k`` (``0 < k < n``) of the contiguous float32/float64 ``w``: ``k`` indices of ``idt``.

    ``reuse=True`` returns the workspace's output (no allocation; overwritten
    by the next call of the same ``n`` and ``k``), else a copy.
    """
    n = w.shape[0]
    ws = _workspace(w, k, idt)
    kern = _kernel("radix.cu", f"radix2_pass_{_tn(w.dtype)}_{_in(idt)}")
    grid = _grid(n, ILP)
    plan = digits(w.dtype)
    passes = []  # (pass, previous digit's shift and width, this digit's shift and width)
    for q in range(len(plan) + 1):
        sp, wp = plan[q - 1] if q else (-1, 0)
        sc, wc = plan[q] if q < len(plan) else (-1, 0)
        passes.append((np.int32(q), np.int32(sp), np.int32(wp), np.int32(sc), np.int32(wc)))
    n64, k64, cap = np.int64(n), np.uint64(k), np.uint64(ws.cap)

    def launch():
        ws.buf.fill(0)
        for q, sp, wp, sc, wc in passes:
            src, dst = (int(q) - 1) % 2, int(q) % 2
            kern(grid, (BLOCK,), (w, n64, k64, q, sp, wp, sc, wc, ws.cand_idx[src], ws.cand_key[src],
                                    ws.cand_idx[dst], ws.cand_key[dst], cap, ws.hist, ws.state, ws.out))

    _graph.run(ws, _graph.address(w), launch)
    return ws.out if reuse else ws.out.copy()
