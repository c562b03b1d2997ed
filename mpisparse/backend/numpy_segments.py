"""CPU (NumPy) segmented kernels, the common part: the segments' argument checks and :func:`segment_norms`.

A *segment* is ``x[start:start + size]``; a call takes any list of
segments (empty ones allowed, overlapping ones not), e.g. the layers one
rank owns.  The number of NumPy calls does not grow with the number of
segments: per-segment quantities are arrays, and the passes over the data
walk the segments' concatenation (*virtual* positions) in chunks of
:data:`mpisparse.backend.numpy_select.CHUNK` elements, whatever segments a chunk spans.
The segmented top-k (:func:`mpisparse.backend.numpy_segment_topk.segment_topk_abs`)
is in :mod:`.numpy_segment_topk`.
"""

from __future__ import annotations

import math

import numpy as np

from .numpy_select import _as_1d_float

# How it works
# ------------
# ``segment_norms``: the data is viewed as rows of :data:`NORM_ROW`
# elements; one ``vecdot`` gives every row's sum of squares (one read of
# ``x``, no temporary), a float64 cumulative sum of the row sums gives the
# prefix sum of squares at every row boundary, and the rows that hold a
# segment boundary add the in-row part: sums of squares of their
# :data:`NORM_SUB`-element pieces, cumulated, plus the last partial piece
# (at most two rows per segment).  A segment's sum of squares is the difference of the prefix sums
# at its two ends; an empty segment gives exactly 0 (so does an all-zero one).
# A non-finite float32 row sum (overflow) makes the segments it touches be
# recomputed from float64 squares.

#: Row length of the row-sum pass of :func:`segment_norms`, and the piece
#: length inside the rows that hold a segment boundary.
NORM_ROW = 4096
NORM_SUB = 64


def _segments(starts, sizes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, sizes)`` as int64 arrays, checked against ``x``'s length ``n``."""
    st = np.asarray(starts, dtype=np.int64).reshape(-1)
    sz = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if st.shape != sz.shape:
        raise ValueError(f"starts and sizes must have the same length, got {st.size} and {sz.size}")
    if sz.size and sz.min() < 0:
        i = int(np.argmin(sz))
        raise ValueError(f"sizes[{i}] must be >= 0, got {int(sz[i])}")
    if st.size and st.min() < 0:
        i = int(np.argmin(st))
        raise ValueError(f"starts[{i}] must be >= 0, got {int(st[i])}")
    end = st + sz
    if end.size and end.max() > n:
        i = int(np.argmax(end))
        raise ValueError(f"segment {i} ends at {int(end[i])}, past the vector's length {n}")
    return st, sz


def _segment_ks(ks, sizes: np.ndarray) -> np.ndarray:
    k = np.asarray(ks, dtype=np.int64).reshape(-1)
    if k.shape != sizes.shape:
        raise ValueError(f"ks must have one entry per segment ({sizes.size}), got {k.size}")
    bad = np.flatnonzero((k < 0) | (k > sizes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"ks[{i}] must be in [0, {int(sizes[i])}], got {int(k[i])}")
    return k


def segment_norms(x, starts, sizes) -> np.ndarray:
    """L2 norm of every segment ``x[starts[i]:starts[i] + sizes[i]]``, float64 (empty -> 0).

    O(1) NumPy calls whatever the number of segments (see the section
    comment above): one ``vecdot`` pass of row sums of squares, float64
    prefix sums, in-row prefix sums at the segment boundaries.
    """
    x = _as_1d_float(x)
    n = x.shape[0]
    st, sz = _segments(starts, sizes, n)
    out = np.zeros(st.size, dtype=np.float64)
    if n == 0 or st.size == 0:
        return out
    L = NORM_ROW
    rows = n // L
    tail = n - rows * L
    with np.errstate(over="ignore", invalid="ignore"):
        rs = np.empty(rows + (1 if tail else 0), dtype=np.float64)
        if rows:
            X = x[: rows * L].reshape(rows, L)
            rs[:rows] = _rowdot(X)  # one read of x, accumulated in x's dtype per row
        if tail:
            t = x[rows * L:].astype(np.float64)
            rs[rows] = np.dot(t, t)
        bad_rows = ~np.isfinite(rs)
        if bad_rows.any():  # float32 overflow in a row: recompute those rows in float64
            br = np.flatnonzero(bad_rows)
            full = br[br < rows]
            if full.size:
                R = x[: rows * L].reshape(rows, L)[full].astype(np.float64)
                rs[full] = _rowdot(R)
        # prefix sum of squares at row boundaries: P_row[j] = sum of rows < j
        prow = np.zeros(rs.size + 1, dtype=np.float64)
        np.cumsum(rs, out=prow[1:])
        # prefix sums at every segment boundary p: P(p) = prow[p // L] + in-row sum of [row start, p)
        pts = np.concatenate([st, st + sz])
        r = pts // L
        c = pts - r * L
        inner = c > 0
        P = prow[r]
        if inner.any():
            P[inner] += _in_row_prefix(x, r[inner], c[inner], rows)
        sq = P[st.size:] - P[: st.size]
    np.maximum(sq, 0.0, out=sq)  # rounding of the difference never goes below 0
    out[sz > 0] = np.sqrt(sq[sz > 0])
    bad = ~np.isfinite(out)
    if bad.any():  # inf/NaN reached a segment: its own float64 sum decides (inf, or NaN for NaN data)
        for i in np.flatnonzero(bad):  # only segments holding non-finite data; not a per-layer loop
            v = x[st[i]: st[i] + sz[i]].astype(np.float64)
            out[i] = math.sqrt(float(np.dot(v, v)))
    return out


def _in_row_prefix(x: np.ndarray, r: np.ndarray, c: np.ndarray, rows: int) -> np.ndarray:
    """Sum of squares of ``x[r * L : r * L + c]`` (``0 < c < L``) for every point, in float64.

    Two levels, so the boundary rows cost little more than one read: sums of
    squares of the :data:`NORM_SUB`-element pieces of every boundary row (one
    ``vecdot``), their float64 cumulative sums, then the last partial piece
    element by element.  Points in the partial last row (``r == rows``) use
    that row's own float64 cumulative sum.
    """
    L, B = NORM_ROW, NORM_SUB
    n = x.shape[0]
    out = np.zeros(r.size, dtype=np.float64)
    full = r < rows
    if full.any():
        rf, cf = r[full], c[full]
        ur, inv = np.unique(rf, return_inverse=True)
        X3 = x[: rows * L].reshape(rows, L // B, B)[ur]  # the boundary rows, in pieces of B
        sub = _rowdot(X3).astype(np.float64)
        bad = ~np.isfinite(sub)
        if bad.any():  # float32 overflow: those rows in float64
            rb = np.flatnonzero(bad.any(axis=1))
            sub[rb] = _rowdot(X3[rb].astype(np.float64))
        csub = np.zeros((ur.size, L // B + 1), dtype=np.float64)
        np.cumsum(sub, axis=1, out=csub[:, 1:])
        q = cf // B
        rem = cf - q * B
        j = np.arange(B)
        g = np.minimum((rf * L + q * B)[:, None] + j[None, :], n - 1)
        e = x[g].astype(np.float64)
        e *= e
        e[j[None, :] >= rem[:, None]] = 0.0
        out[full] = csub[inv, q] + e.sum(axis=1)
    if not full.all():  # the partial last row
        t = x[rows * L:].astype(np.float64)
        t *= t
        ct = np.cumsum(t)
        out[~full] = ct[c[~full] - 1]
    return out


def _rowdot(X: np.ndarray) -> np.ndarray:
    """Sum of squares of every row of the 2-D ``X`` (BLAS dot per row where NumPy has ``vecdot``)."""
    vecdot = getattr(np, "vecdot", None)  # NumPy >= 2.0
    return vecdot(X, X) if vecdot is not None else np.einsum("ij,ij->i", X, X)

