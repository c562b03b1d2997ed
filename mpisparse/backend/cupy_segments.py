"""GPU (CuPy) segmented kernels: segment_norms and segment_topk_abs.

Segmented kernels (``cuda/segmented.cu``): the host cuts every segment into
tiles of at most :data:`SEG_TILE` elements and one block handles one tile, so
each pass is one launch whatever the number of segments.
``segment_norms``: one launch (per-tile float64 sums of squares), a second
summing each segment's tiles on the device in tile order (one thread per
segment), one device-to-host read of one number per segment; its buffers and
tile plan form a workspace per layout and its two launches replay as a CUDA
graph (:mod:`.cupy_graph`).  ``segment_topk_abs``: the NumPy kernel's sampling
(:func:`mpisparse.backend.numpy_segment_topk.segment_plan`) with the selection
on the device -- one sampling launch (hashed positions, each segment's keys
in its own region), one block per segment for its threshold (the sample's
``r_i``-th key, ``seg_kth``), one candidate launch over the tiles into
per-segment regions (warp-aggregated appends, per-segment counts), one
block per segment for its candidates' exact ``k_i``-th key (``seg_kth``)
and one writing its ``k_i`` (``seg_take``), then one device-to-host read of
the counts; a segment with too few or too many candidates is redone alone
by :func:`topk_abs`.  Five launches, independent of the number of segments.
"""

from __future__ import annotations

import numpy as np

from . import cupy_graph as _graph
from . import index_dtype  # the one place the index width is decided
from .cupy_launch import (BLOCK, KTH_THREADS, _NULL, _as_1d_float, _check_scratch, _cupy, _grid, _in, _kernel,
                          _key_dtype, _tn, _work)
from .cupy_select import topk_abs
from .numpy_segment_topk import segment_plan
from .numpy_segments import _segment_ks, _segments
from .numpy_select import _get_rng

#: Elements per tile (one block) of the segmented launches.
SEG_TILE = 1 << 13


def _tiles(st: np.ndarray, sz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, hi, seg)`` of the tiles of every segment (host, int64), segment by segment."""
    nt = -(-sz // SEG_TILE)
    seg = np.repeat(np.arange(st.size, dtype=np.int64), nt)
    first = np.cumsum(nt) - nt
    lo = st[seg] + (np.arange(seg.size, dtype=np.int64) - first[seg]) * SEG_TILE
    hi = np.minimum(lo + SEG_TILE, (st + sz)[seg])
    return lo, hi, seg


#: device copies of recent tile plans: a training step asks for the same layers every step
_TILE_PLANS: dict[tuple, tuple] = {}
_TILE_PLANS_KEPT = 16


def _tile_plan(cp, st: np.ndarray, sz: np.ndarray, ids: np.ndarray):
    """``(lo, hi, tseg)`` of the tiles of segments ``ids`` on the host, and their device copies.

    ``tseg`` holds each tile's position in the call (an element of ``ids``).
    The device copies are kept for the last :data:`_TILE_PLANS_KEPT` layouts
    (one host-to-device copy per layout, not per call).
    """
    key = (id(cp), cp.cuda.runtime.getDevice(), st.tobytes(), sz.tobytes(), ids.tobytes())
    plan = _TILE_PLANS.pop(key, None)
    if plan is None:
        lo, hi, tseg = _tiles(st[ids], sz[ids])
        tseg = ids[tseg]
        plan = (lo, hi, tseg, *_upload(cp, lo, hi, tseg))
        if len(_TILE_PLANS) >= _TILE_PLANS_KEPT:
            _TILE_PLANS.pop(next(iter(_TILE_PLANS)))
    _TILE_PLANS[key] = plan  # most recent last
    return plan


def _upload(cp, *arrays):
    """One host-to-device copy of several int64 arrays; returns device views of each."""
    sizes = [a.size for a in arrays]
    d = cp.asarray(np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays]) if arrays else
                   np.zeros(0, np.int64))
    out, o = [], 0
    for c in sizes:
        out.append(d[o:o + c])
        o += c
    return out


def _norms_ws(w, st: np.ndarray, sz: np.ndarray):
    """The norms' workspace of one layout: tile bounds and each segment's first tile (device), tile and segment sums."""
    cp = _cupy()

    def build(ws):
        lo, hi, _ = _tiles(st, sz)
        toff = np.zeros(st.size + 1, dtype=np.int64)
        np.cumsum(-(-sz // SEG_TILE), out=toff[1:])
        ws.tiles = lo.size
        ws.lo, ws.hi, ws.toff = _upload(cp, lo, hi, toff)
        ws.partial = cp.empty(lo.size, dtype=np.float64)
        ws.sums = cp.empty(st.size, dtype=np.float64)

    return _graph.workspace(("seg_norms", _graph.device_of(w), w.dtype.char, st.tobytes(), sz.tobytes()), build)


def segment_norms(x, starts, sizes) -> np.ndarray:
    """L2 norm of every segment, float64 on the host (:func:`mpisparse.backend.segment_norms`).

    Two launches: ``seg_sumsq`` (a float64 sum of squares per tile, a
    fixed-order tree) and ``seg_tile_sums`` (each segment's tile sums added
    in tile order on the device), then one read of one number per segment:
    deterministic, and the same bits as adding the tile sums on the host.
    Empty segments give 0.  The layout's workspace is reused and the two
    launches replay as one CUDA graph from the second call on the same input.
    """
    x = _as_1d_float(x)
    st, sz = _segments(starts, sizes, x.shape[0])
    if not (sz > 0).any():
        return np.zeros(st.size, dtype=np.float64)
    w = _work(x)
    ws = _norms_ws(w, st, sz)
    sumsq = _kernel("segmented.cu", f"seg_sumsq_{_tn(w.dtype)}")
    tile_sums = _kernel("segmented.cu", "seg_tile_sums")
    grid, nseg = _grid(st.size), np.int64(st.size)

    def launch():
        sumsq((ws.tiles,), (BLOCK,), (w, ws.lo, ws.hi, ws.partial))
        tile_sums(grid, (BLOCK,), (ws.partial, ws.toff, nseg, ws.sums))

    _graph.run(ws, _graph.address(w), launch)
    return np.sqrt(ws.sums.get())  # the one device-to-host read: one number per segment


def _seg_layout(st: np.ndarray, sz: np.ndarray, k: np.ndarray):
    """Host plan of one segmented top-k: per segment sample size and rank, sample/candidate/output offsets.

    ``(m, r, soff, cap, coff, ooff)``: ``m_i``/``r_i`` as
    :func:`mpisparse.backend.numpy_segment_topk.segment_plan` (``r_i >= 1`` where
    ``m_i > 0``; ``m_i = 0``: every entry is a candidate), ``soff`` the
    sample regions, ``cap_i`` the candidate region's size (twice the expected
    candidates past the sampled threshold, or the whole segment), ``coff``
    its offset, ``ooff`` the segment's offset in the output.
    """
    m, r = segment_plan(sz, k)
    r = np.where(m > 0, np.maximum(r, 1), 0)
    soff = np.zeros(st.size + 1, dtype=np.int64)
    np.cumsum(m, out=soff[1:])
    frac = np.where(m > 0, (r + 1) / np.maximum(m, 1), 1.0)
    cap = np.where(m > 0, np.minimum(sz, np.ceil(2.0 * frac * sz).astype(np.int64) + 256), sz).astype(np.int64)
    coff = np.zeros(st.size + 1, dtype=np.int64)
    np.cumsum(cap, out=coff[1:])
    ooff = (np.cumsum(k) - k).astype(np.int64)
    return m, r, soff, cap, coff, ooff


def segment_topk_abs(x, starts, sizes, ks, *, rng=None, scratch=None):
    """Exactly ``ks[i]`` indices of largest magnitude per segment (:func:`mpisparse.backend.segment_topk_abs`).

    The NumPy kernel's contract on the device: flat indices grouped by
    segment in the given order (any order within a segment); ties any
    choice; NaN ranks largest.  Five launches, each one block per segment
    or per tile whatever the number of segments (module docstring), and one
    device-to-host read of the segments' candidate counts; a segment whose
    sampled threshold let too few or too many candidates through (rare) is
    redone on its own by :func:`topk_abs`.  ``scratch`` is accepted for API
    parity.
    """
    cp = _cupy()
    x = _as_1d_float(x)
    n = x.shape[0]
    st, sz = _segments(starts, sizes, n)
    k = _segment_ks(ks, sz)
    idt = index_dtype(n)
    K = int(k.sum())
    if K == 0:
        return cp.empty(0, dtype=idt)
    _check_scratch(x, scratch)
    w = _work(x)
    on = np.flatnonzero(k > 0)
    st, sz, k = st[on], sz[on], k[on]
    S = on.size
    tn, inn, kdt = _tn(w.dtype), _in(idt), _key_dtype(w.dtype)
    m, r, soff, cap, coff, ooff = _seg_layout(st, sz, k)
    st_d, sz_d, soff_d, m_d, r_d, cap_d, coff_d, k_d, ooff_d = _upload(cp, st, sz, soff, m, r, cap, coff, k, ooff)
    lo, _, _, lo_d, hi_d, tseg_d = _tile_plan(cp, st, sz, np.arange(S, dtype=np.int64))
    thr = cp.zeros(S, dtype=kdt)  # 0: every entry a candidate (segments without a sample)
    found = cp.empty(2 * S, dtype=np.uint64)
    M = int(soff[-1])
    if M:
        samp = cp.empty(M, dtype=kdt)
        seed = np.uint64(int(_get_rng(rng).integers(0, 2**63)))
        _kernel("segmented.cu", f"seg_sample_mag_{tn}")(
            _grid(M), (BLOCK,), (w, st_d, sz_d, soff_d, np.int32(S), np.int64(M), seed, samp))
        _kernel("segmented.cu", f"seg_kth_{tn}")(  # each segment's threshold: its sample's r-th largest key
            (S,), (KTH_THREADS,), (samp, soff_d, m_d, _NULL, cap_d, r_d, thr, found))
    C = int(coff[-1])
    cand_idx, cand_key = cp.empty(C, dtype=idt), cp.empty(C, dtype=kdt)
    counts = cp.zeros(S, dtype=np.uint64)
    _kernel("segmented.cu", f"seg_select_region_{tn}_{inn}")(
        (lo.size,), (BLOCK,), (w, lo_d, hi_d, tseg_d, thr, coff_d, cap_d, cand_idx, cand_key, counts))
    kth = cp.empty(S, dtype=kdt)
    _kernel("segmented.cu", f"seg_kth_{tn}")(  # each segment's k-th largest candidate
        (S,), (KTH_THREADS,), (cand_key, coff_d, m_d, counts, cap_d, k_d, kth, found))
    out = cp.empty(K, dtype=idt)
    _kernel("segmented.cu", f"seg_take_{tn}_{inn}")(
        (S,), (BLOCK,), (cand_key, cand_idx, coff_d, counts, cap_d, kth, found, k_d, ooff_d, out))
    c = counts.get().astype(np.int64)  # the one device-to-host read
    for s in np.flatnonzero((c < k) | (c > cap)):  # threshold too high or too low: this segment alone
        a, o = int(st[s]), int(ooff[s])
        out[o:o + int(k[s])] = topk_abs(w[a:a + int(sz[s])], int(k[s]), rng=rng).astype(idt) + idt(a)
    return out
