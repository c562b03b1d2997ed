"""GPU (CuPy) segmented kernels: segment_norms and segment_topk_abs, each one CUDA graph per layout.

Segmented kernels (``cuda/segmented.cu``): the host cuts every segment into
tiles of at most :data:`SEG_TILE` elements and one block handles one tile, so
each pass is one launch whatever the number of segments; the last block of a
segment to finish (an atomic count of its tiles) completes that segment on
the device, so no decision waits for the host.

``segment_norms``: one launch -- every tile's float64 sum of squares, and
each segment's last block adding its tile sums in tile order -- then one
device-to-host read of one number per segment (the norms are the host's
input to DEFT's Alg. 3).  ``segment_topk_abs``: a segmented radix select over
the magnitude keys (the ``radix2`` top-k of :mod:`.cupy_radix`, with a
histogram, prefix and need per segment): a memset and one launch per digit
plus one for the output (float32: four, float64: seven), nothing read back;
the output holds exactly ``sum(ks)`` indices, known on the host from ``ks``.

Both keep a workspace per layout (:mod:`.cupy_graph`) -- the tile plan on the
device, counters, state, histograms, candidate regions and output -- and from
the second call on the same input address replay their launches as one CUDA
graph: every segment of the call (all of a rank's layers) in one graph
launch.  The top-k's ``ks`` change from step to step (DEFT's Alg. 3): they
live in a device slot of the workspace, rewritten (one host-to-device copy)
only when they change, so a new ``ks`` replays the same graph.
"""

from __future__ import annotations

import functools

import numpy as np

from . import cupy_graph as _graph
from . import index_dtype  # the one place the index width is decided
from .cupy_launch import BLOCK, _as_1d_float, _check_scratch, _cupy, _in, _kernel, _key_dtype, _tn, _work
from .cupy_radix import BINS, digits
from .numpy_segments import _segment_ks, _segments

#: Elements per tile (one block) of the segmented launches.
SEG_TILE = 1 << 13
#: Device state slots per segment of the segmented top-k (``RS_SLOTS`` in ``cuda/radix_select.cuh``: 10 used).
STATE_SLOTS = 16
#: A segment's candidate region holds ``size // CANDIDATE_FRACTION`` entries (at least
#: :data:`MIN_CANDIDATES`, at most the segment); a bucket that outgrows it makes the next pass read ``x``.
CANDIDATE_FRACTION = 8
MIN_CANDIDATES = 4096


def _tiles(st: np.ndarray, sz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, hi, seg)`` of the tiles of every segment (host, int64), segment by segment."""
    nt = -(-sz // SEG_TILE)
    seg = np.repeat(np.arange(st.size, dtype=np.int64), nt)
    first = np.cumsum(nt) - nt
    lo = st[seg] + (np.arange(seg.size, dtype=np.int64) - first[seg]) * SEG_TILE
    hi = np.minimum(lo + SEG_TILE, (st + sz)[seg])
    return lo, hi, seg


#: host tile plans of recent layouts (a layout's norms and its top-k workspaces share one)
_TILE_PLANS: dict[tuple, tuple] = {}
_TILE_PLANS_KEPT = 16


def _tile_plan(st: np.ndarray, sz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_tiles` of a layout, kept for the last :data:`_TILE_PLANS_KEPT` layouts."""
    key = (SEG_TILE, st.tobytes(), sz.tobytes())
    plan = _TILE_PLANS.pop(key, None)
    if plan is None:
        plan = _tiles(st, sz)
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


# ------------------------------------------------------------------------------------------------ norms
def _norms_ws(w, st: np.ndarray, sz: np.ndarray):
    """The norms' workspace of one layout: the tile plan (device), tile sums, counters and segment sums."""
    cp = _cupy()

    def build(ws):
        lo, hi, seg = _tile_plan(st, sz)
        toff = np.zeros(st.size + 1, dtype=np.int64)
        np.cumsum(-(-sz // SEG_TILE), out=toff[1:])
        ws.tiles = lo.size
        ws.lo, ws.hi, ws.tseg, ws.toff = _upload(cp, lo, hi, seg, toff)
        ws.partial = cp.empty(lo.size, dtype=np.float64)
        ws.done = cp.zeros(st.size, dtype=np.uint64)  # reset by each segment's last block
        ws.sums = cp.zeros(st.size, dtype=np.float64)  # an empty segment (no tile) keeps its 0

    return _graph.workspace(("seg_norms", _graph.device_of(w), w.dtype.char, st.tobytes(), sz.tobytes()), build)


def segment_norms(x, starts, sizes) -> np.ndarray:
    """L2 norm of every segment, float64 on the host (:func:`mpisparse.backend.segment_norms`).

    One launch (``seg_norms``): each block sums its tile's squares in
    float64 (a fixed-order tree), and the last block of a segment to finish
    adds the segment's tile sums in tile order -- x is read once, and the
    result is deterministic.  Then one read of one number per segment.
    Empty segments give 0.  The layout's workspace is reused and the launch
    replays as a CUDA graph from the second call on the same input.
    """
    x = _as_1d_float(x)
    st, sz = _segments(starts, sizes, x.shape[0])
    if not (sz > 0).any():
        return np.zeros(st.size, dtype=np.float64)
    w = _work(x)
    ws = _norms_ws(w, st, sz)
    kern = _kernel("segmented.cu", f"seg_norms_{_tn(w.dtype)}")

    def launch():
        kern((ws.tiles,), (BLOCK,), (w, ws.lo, ws.hi, ws.tseg, ws.toff, ws.partial, ws.done, ws.sums))

    _graph.run(ws, _graph.address(w), launch)
    return np.sqrt(ws.sums.get())  # the one device-to-host read: one number per segment


# ------------------------------------------------------------------------------------------------ top-k
def candidate_capacity(sz: np.ndarray) -> np.ndarray:
    """Entries of each segment's candidate region (in each of the two candidate buffers)."""
    return np.minimum(sz, np.maximum(MIN_CANDIDATES, sz // CANDIDATE_FRACTION)).astype(np.int64)


def _topk_ws(w, st: np.ndarray, sz: np.ndarray, idt):
    """The segmented top-k's workspace of one layout: tile and segment tables, the ks slot, state, histograms,
    candidate regions; its output is sized by :func:`_set_ks`."""
    cp = _cupy()
    kdt = _key_dtype(w.dtype)

    def build(ws):
        lo, hi, seg = _tile_plan(st, sz)
        S = st.size
        cap = candidate_capacity(sz)
        ws.tiles = lo.size
        ws.lo, ws.hi, ws.tseg, ws.seg_lo, ws.seg_tiles, ws.coff, ws.cap = _upload(
            cp, lo, hi, seg, st, -(-sz // SEG_TILE), np.cumsum(cap) - cap, cap)
        ws.kv = cp.zeros(2 * S, dtype=np.int64)  # the ks, then the output offsets: set when the ks change
        ws.k, ws.ooff = ws.kv[:S], ws.kv[S:]
        ws.ks = None  # the ks in ws.kv (bytes)
        ws.buf = cp.zeros(S * (BINS + STATE_SLOTS), dtype=np.uint64)  # histograms, then the state; zeroed per call
        ws.hist, ws.state = ws.buf[:S * BINS], ws.buf[S * BINS:]
        C = max(int(cap.sum()), 1)
        ws.cand_idx = (cp.empty(C, dtype=idt), cp.empty(C, dtype=idt))
        ws.cand_key = (cp.empty(C, dtype=kdt), cp.empty(C, dtype=kdt))
        ws.out = cp.empty(0, dtype=idt)

    return _graph.workspace(("seg_topk", _graph.device_of(w), w.dtype.char, np.dtype(idt).char, st.tobytes(),
                             sz.tobytes()), build)


def _set_ks(ws, k: np.ndarray) -> None:
    """The call's ks into the workspace's slot (one host-to-device copy, only when they changed) and an output
    of at least ``sum(ks)`` entries (a larger one drops the captured graphs, which hold the old one)."""
    key = k.tobytes()
    if ws.ks == key:
        return
    K = int(k.sum())
    if K > ws.out.size:
        cp = _cupy()
        ws.out = cp.empty(max(K, 2 * ws.out.size), dtype=ws.out.dtype)
        ws.drop_graphs()
    # on the current stream: ordered after the last call's graph, which still reads the old ks
    ws.kv.set(np.concatenate([k, np.cumsum(k) - k]), stream=_cupy().cuda.get_current_stream())
    ws.ks = key


@functools.lru_cache(maxsize=None)
def _passes(dtype_char: str) -> tuple:
    """``(pass, previous digit's shift and width, this digit's shift and width)`` of every launch, as the
    kernel's scalars (shift -1: none)."""
    plan = digits(np.dtype(dtype_char))
    out = []
    for q in range(len(plan) + 1):
        sp, wp = plan[q - 1] if q else (-1, 0)
        sc, wc = plan[q] if q < len(plan) else (-1, 0)
        out.append((np.int32(q), np.int32(sp), np.int32(wp), np.int32(sc), np.int32(wc)))
    return tuple(out)


def segment_topk_abs(x, starts, sizes, ks, *, rng=None, scratch=None, reuse: bool = False):
    """Exactly ``ks[i]`` indices of largest magnitude per segment (:func:`mpisparse.backend.segment_topk_abs`).

    The NumPy kernel's contract on the device: flat indices grouped by
    segment in the given order (any order within a segment), ``sum(ks)`` of
    them; ties any choice; NaN ranks largest.  A segmented radix select
    (module docstring): a memset and ``P + 1`` launches over the tiles of
    every segment (``P`` digits: 3 for float32, 6 for float64; a segment
    with ``k = 0`` returns at once), no host synchronisation and nothing
    read back; the layout's workspace is reused and from the second call on
    the same input the launches replay as one CUDA graph, whatever the
    ``ks``.  ``reuse=True`` returns a view of the workspace's output
    (overwritten by the next call of the same layout), else a copy.
    ``rng`` is not needed (the selection is deterministic); ``scratch`` is
    accepted for API parity.
    """
    cp = _cupy()
    x = _as_1d_float(x)
    n = x.shape[0]
    st, sz = _segments(starts, sizes, n)
    k = _segment_ks(ks, sz)
    idt = index_dtype(n)
    if not k.any():
        return cp.empty(0, dtype=idt)
    _check_scratch(x, scratch)
    w = _work(x)
    ws = _topk_ws(w, st, sz, idt)
    _set_ks(ws, k)
    kern = _kernel("segmented.cu", f"segk_pass_{_tn(w.dtype)}_{_in(idt)}")
    grid, tile = (ws.tiles,), np.int64(SEG_TILE)
    passes = _passes(w.dtype.char)

    def launch():
        ws.buf.fill(0)
        for q, sp, wp, sc, wc in passes:
            src, dst = (int(q) - 1) % 2, int(q) % 2
            kern(grid, (BLOCK,), (w, ws.lo, ws.hi, ws.tseg, ws.seg_lo, ws.seg_tiles, ws.k, ws.ooff, ws.coff, ws.cap,
                                  tile, q, sp, wp, sc, wc, ws.cand_idx[src], ws.cand_key[src], ws.cand_idx[dst],
                                  ws.cand_key[dst], ws.hist, ws.state, ws.out))

    _graph.run(ws, _graph.address(w), launch)
    out = ws.out[:int(k.sum())]
    return out if reuse else out.copy()
