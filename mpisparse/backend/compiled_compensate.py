"""DEFT's compensation pass compiled (numba): ``e += g``, every segment's norm and candidates, in one pass.

:func:`compensate_norms` compensates the residual and returns the L2 norm of
every segment (DEFT's layer norms); :func:`compensate_norms_candidates` also
collects, in the same pass, the top-k candidates of the rank's own segments
(thresholds from a sample of ``|e + g|`` taken before the pass);
:func:`take_candidates` picks each segment's top k among them; :func:`warm_up`
loads these loops and the segmented top-k's (:mod:`.compiled_segments`)
before the first step.  The sample plan, the sample positions, the order
statistic and the take are the segmented top-k's compiled pieces
(:mod:`.compiled_segments`), as are the kept candidate buffers.  This module
imports nothing of the package beyond :mod:`.compiled` (the switch) and
:mod:`.compiled_segments`.
"""

from __future__ import annotations

import numpy as np

from .compiled import DEBRUIJN as _DEBRUIJN
from .compiled import DEBRUIJN_MUL as _DEBRUIJN_MUL
from .compiled import enabled
from .compiled_segments import _BLOCK, _HAVE_NUMBA, _MASK32, _MASK64, _TOP, _ZERO32, _ZERO64, _state

__all__ = ["Candidates", "compensate_norms", "compensate_norms_candidates", "take_candidates", "warm_up"]

if _HAVE_NUMBA:  # optional: the compiled loops
    import numba

    from .compiled_segments import _plan, _positions, _rth_largest, _segments_pass, _take

    @numba.njit(nogil=True, fastmath={"reassoc"}, inline="always")
    def _block_add_sumsq(eb, gb):  # pragma: no cover - compiled
        """``eb += gb`` over one block slice of :data:`_BLOCK`; returns the float64 sum of squares of the new
        values (the one loop both passes below run, so their sums agree bit for bit)."""
        s = 0.0
        for j in range(_BLOCK):
            v = eb[j] + gb[j]
            eb[j] = v
            s += np.float64(v) * np.float64(v)
        return s

    @numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
    def _add_sumsq(e, g, a, n):  # pragma: no cover - compiled
        """``e[a:a + n] += g[a:a + n]``; returns the float64 sum of squares of the new values.  In block
        slices of constant length: a plain loop over the range runs 3.5x slower (measured, not vectorised)."""
        acc = 0.0
        nb = n // _BLOCK
        for bi in range(nb):
            b = a + bi * _BLOCK
            acc += _block_add_sumsq(e[b:b + _BLOCK], g[b:b + _BLOCK])
        for j in range(a + nb * _BLOCK, a + n):
            v = e[j] + g[j]
            e[j] = v
            acc += np.float64(v) * np.float64(v)
        return acc

    @numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
    def _add_sumsq_collect(e, g, xu, a, n, t, mask, cand, ckey, c):  # pragma: no cover - compiled
        """:func:`_add_sumsq` over ``e[a:a + n]`` (the same block loop, so the same sum), collecting on the way the
        positions and keys (``xu``: ``e``'s bits) of the new entries whose magnitude reaches ``t`` into
        ``cand``/``ckey`` from slot ``c`` (NaN entries are collected: their keys rank above every other);
        returns ``(sum, c)``, ``c`` counting on past the buffers.  Per block, after the loop that adds, stores
        and sums, a second loop over the block (in the cache) sets a bit per hit, then one step per set bit
        (:func:`_collect`'s de Bruijn step)."""
        cap = cand.shape[0]
        one = np.uint64(1)
        acc = 0.0
        nb = n // _BLOCK
        for bi in range(nb):
            b = a + bi * _BLOCK
            eb = e[b:b + _BLOCK]
            acc += _block_add_sumsq(eb, g[b:b + _BLOCK])
            bits = np.uint64(0)
            for j in range(_BLOCK):
                bits |= np.uint64(not abs(eb[j]) < t) << np.uint64(j)
            while bits:
                low = bits & (~bits + one)
                j = _DEBRUIJN[(low * _DEBRUIJN_MUL) >> np.uint64(58)]
                bits ^= low
                if c < cap:
                    cand[c] = b + j
                    ckey[c] = xu[b + j] & mask
                c += 1
        for j in range(a + nb * _BLOCK, a + n):
            v = e[j] + g[j]
            e[j] = v
            acc += np.float64(v) * np.float64(v)
            if not abs(v) < t:
                if c < cap:
                    cand[c] = j
                    ckey[c] = xu[j] & mask
                c += 1
        return acc, c

    @numba.njit(cache=True, nogil=True)
    def _compensate_collect(e, g, xu, st, sz, thr, sel, mask, sums, cand, ckey, counts):  # pragma: no cover
        """``e += g`` over the whole vector, the float64 sum of squares of the new ``e`` over every segment
        (ascending, not overlapping), and, in each segment ``i`` with ``sel[i]``, the positions and keys of
        the entries whose magnitude reaches ``thr[i]`` (a float) into ``cand``/``ckey`` grouped by segment,
        ``counts[i]`` of them (:func:`_add_sumsq_collect`); one pass.  Returns how many were collected, or
        -1 when the buffers were too small (``counts`` not valid; ``e`` and ``sums`` are)."""
        cap = cand.shape[0]
        c = 0
        pos = 0
        for i in range(st.shape[0]):
            a = st[i]
            if a > pos:  # a gap between segments: compensated, not summed
                _add_sumsq(e, g, pos, a - pos)
            c0 = c
            if sel[i] and c <= cap:
                sums[i], c = _add_sumsq_collect(e, g, xu, a, sz[i], thr[i], mask, cand, ckey, c)
            else:
                sums[i] = _add_sumsq(e, g, a, sz[i])
            counts[i] = c - c0
            pos = a + sz[i]
        if e.shape[0] > pos:
            _add_sumsq(e, g, pos, e.shape[0] - pos)
        return -1 if c > cap else c

    @numba.njit(cache=True, nogil=True)
    def _sample_thresholds(e, g, st, sz, k, sizing, seed, fbuf, ubuf, thr, top, tmp):  # pragma: no cover
        """``thr[i]``, the threshold key of segment ``i`` for its top ``k[i]`` before ``e += g``: the ``r_i``-th
        largest key of ``m_i`` sampled ``|e + g|`` (:func:`_plan`, :func:`_positions`), 0 (every entry a
        candidate) where the plan samples none.  ``fbuf`` and ``ubuf``: one buffer of the sample size, as
        floats and as keys; ``tmp`` as long."""
        S = st.shape[0]
        m = np.empty(S, dtype=np.int64)
        r = np.empty(S, dtype=np.int64)
        ooff = np.empty(S + 1, dtype=np.int64)
        mmax = _plan(st, sz, k, sizing, m, r, ooff)
        np.random.seed(seed)
        pbuf = np.empty(max(mmax, 1), dtype=np.int64)
        for i in range(S):
            thr[i] = 0
            if k[i] == 0 or m[i] == 0:
                continue
            runs, run = _positions(st[i], sz[i], m[i], pbuf)
            mi = runs * run
            for j in range(runs):
                p = pbuf[j]
                for q in range(run):
                    fbuf[j * run + q] = np.abs(e[p + q] + g[p + q])
            ri = min(r[i], mi)
            if 0 < ri < mi:
                thr[i] = _rth_largest(ubuf, mi, ri, top, tmp)

    @numba.njit(cache=True, nogil=True)
    def _take_segments(cand, ckey, counts, part, k, out, short, top, tmp):  # pragma: no cover - compiled
        """The top ``k[i]`` of each segment ``i = part[j]`` from its candidates (``counts[i]`` of them, the
        segments' groups in ascending segment order) into ``out``, grouped in the order of ``part``; a
        segment with fewer candidates than ``k[i]`` gets ``short[j]`` and no slots.  Returns the count
        written."""
        S = counts.shape[0]
        coff = np.empty(S + 1, dtype=np.int64)
        coff[0] = 0
        for i in range(S):
            coff[i + 1] = coff[i] + counts[i]
        w = 0
        for j in range(part.shape[0]):
            i = part[j]
            ki = k[i]
            c = counts[i]
            short[j] = c < ki
            if ki == 0 or c < ki:
                continue
            o = coff[i]
            _take(cand[o:o + c], ckey[o:o + c], c, ki, out, w, top, tmp)
            w += ki
        return w


def _pass_ready(e, g, st, sz):
    """``(st, sz)`` as int64 when the compiled pass may run on ``e`` and ``g`` (enabled, contiguous
    float32/float64 vectors of one dtype, segments ascending and disjoint inside the vector), else None."""
    if not (_HAVE_NUMBA and enabled()) or e.ndim != 1 or e.shape != g.shape or e.dtype != g.dtype:
        return None
    if e.dtype not in (np.float32, np.float64) or not (e.flags.c_contiguous and g.flags.c_contiguous):
        return None
    st = np.asarray(st, dtype=np.int64)
    sz = np.asarray(sz, dtype=np.int64)
    end = st + sz
    if st.size and (st.min() < 0 or end.max() > e.shape[0] or bool(np.any(st[1:] < end[:-1]))):
        return None
    return st, sz


def _keys(x: np.ndarray):
    """``(keys, mask, zero)``: ``x``'s bits as unsigned keys, the mask that clears the sign, the key 0."""
    if x.dtype == np.float32:
        return x.view(np.uint32), _MASK32, _ZERO32
    return x.view(np.uint64), _MASK64, _ZERO64


def _index_type(n: int):
    """:func:`mpisparse.backend.index_dtype` (the package's one rule; imported at call time, as the package
    imports this module)."""
    from . import index_dtype

    return index_dtype(n)


def compensate_norms(e: np.ndarray, g: np.ndarray, st: np.ndarray, sz: np.ndarray) -> np.ndarray | None:
    """``e += g`` in place and the L2 norm of every segment of the new ``e`` (float64), in one compiled
    pass; None when it cannot run here (not enabled, not contiguous float32/float64 vectors of one dtype,
    or segments not ascending and disjoint), then nothing was done.

    The sums of squares accumulate in float64 (reassociated, so vectorised): they agree with
    :func:`mpisparse.backend.numpy_segments.segment_norms` (float32 row sums combined in float64) to
    float32 rounding, not bit for bit, and with :func:`compensate_norms_candidates`' bit for bit.  inf
    or NaN in a segment give an inf or NaN norm, as there.
    """
    spans = _pass_ready(e, g, st, sz)
    if spans is None:
        return None
    st, sz = spans
    xu, mask, _ = _keys(e)
    sums = np.empty(st.size, dtype=np.float64)
    none = np.zeros(st.size, dtype=np.bool_)
    _compensate_collect(e, g, xu, st, sz, np.zeros(st.size, e.dtype), none, mask, sums,
                        np.empty(0, _index_type(e.shape[0])), np.empty(0, xu.dtype), np.empty(st.size, np.int64))
    return np.sqrt(sums)


class Candidates:
    """The candidates :func:`compensate_norms_candidates` collected: ``cand`` (positions) and ``ckey``
    (their magnitude keys), grouped by segment in ascending segment order, ``counts`` per segment; the
    rank's segments ``part``.  Views of kept buffers, valid until the next call."""

    __slots__ = ("cand", "ckey", "counts", "part")

    def __init__(self, cand: np.ndarray, ckey: np.ndarray, counts: np.ndarray, part: np.ndarray) -> None:
        self.cand, self.ckey, self.counts, self.part = cand, ckey, counts, part


def compensate_norms_candidates(e: np.ndarray, g: np.ndarray, st: np.ndarray, sz: np.ndarray, part, k_est,
                                sizing: tuple, seed: int):
    """:func:`compensate_norms` that also collects, in the same pass, the candidates of the top ``k_est[i]``
    of every segment ``i`` of ``part`` (DEFT's layers of this rank, whose k is only known once every
    layer's norm is: ``k_est`` is a guess, e.g. the last step's k).

    Before the pass a threshold per segment of ``part`` from a sample of ``|e + g|`` (the sizing of
    :func:`segment_topk`'s, for ``k_est``); the pass collects every entry at or above it.  Returns
    ``(norms, candidates)``: a :class:`Candidates`, or None when the thresholds would collect too much
    (segments sampled at 0, every entry a candidate, of more than ``4 * sum(k_est) + 65536`` entries in
    all: the pass then collects nothing) or the buffers ran out (they grow for the next call); ``e`` is
    compensated and ``norms`` valid either way.  None when the compiled pass cannot run here (as
    :func:`compensate_norms`; nothing done).  Whether a segment's k is covered is
    :func:`take_candidates`' to say: the result never depends on the guess."""
    spans = _pass_ready(e, g, st, sz)
    if spans is None:
        return None
    st, sz = spans
    xu, mask, zero = _keys(e)
    S = st.size
    p = np.asarray(part, dtype=np.int64).reshape(-1)
    k = np.zeros(S, dtype=np.int64)
    k[p] = np.minimum(np.maximum(np.asarray(k_est, dtype=np.int64)[p], 0), sz[p])
    sample_max = max(int(sizing[3]), 1)
    fbuf = _state.sample.get(e.dtype.itemsize)
    if fbuf is None or fbuf.shape[0] < sample_max:
        fbuf = _state.sample[e.dtype.itemsize] = np.empty(sample_max, e.dtype)
    thr = np.zeros(S, dtype=xu.dtype)
    top = np.empty(_TOP, xu.dtype)
    _sample_thresholds(e, g, st, sz, k, sizing, seed, fbuf, fbuf.view(xu.dtype), thr, top,
                       np.empty(sample_max, xu.dtype))
    sel = k > 0
    whole = int(sz[sel & (thr == zero)].sum())  # segments sampled at 0 (small or dense): every entry collected
    counts = np.zeros(S, dtype=np.int64)
    idt = _index_type(e.shape[0])
    if whole > 4 * int(k.sum()) + 65536:
        sums = np.empty(S, dtype=np.float64)
        _compensate_collect(e, g, xu, st, sz, thr.view(e.dtype), np.zeros(S, np.bool_), mask, sums, np.empty(0, idt),
                            np.empty(0, xu.dtype), counts)
        return np.sqrt(sums), None
    need = whole + 4 * int(k[sel & (thr != zero)].sum()) + 1024
    where = (np.dtype(idt).itemsize, xu.dtype.itemsize)
    bufs = _state.fused.get(where)
    if bufs is None or bufs[0].shape[0] < need:
        bufs = _state.fused[where] = (np.empty(need, idt), np.empty(need, xu.dtype))
    cand, ckey = bufs
    sums = np.empty(S, dtype=np.float64)
    c = _compensate_collect(e, g, xu, st, sz, thr.view(e.dtype), sel, mask, sums, cand, ckey, counts)
    if c < 0:  # more hits than room: larger buffers next time
        _state.fused[where] = (np.empty(2 * cand.shape[0], idt), np.empty(2 * cand.shape[0], xu.dtype))
        return np.sqrt(sums), None
    return np.sqrt(sums), Candidates(cand[:c], ckey[:c], counts, p)


def take_candidates(cands: Candidates, ks) -> tuple[np.ndarray, np.ndarray]:
    """The top ``ks[i]`` of every segment ``i`` of ``cands.part`` from its candidates: ``(indices, short)``,
    the indices grouped by segment in the order of ``part`` (any order within one), and ``short[j]``
    True where segment ``part[j]`` had fewer candidates than its k (its threshold was above its k-th
    largest magnitude): those segments have no indices here and are to be selected again."""
    k = np.asarray(ks, dtype=np.int64).reshape(-1)
    p = cands.part
    out = np.empty(int(k[p].sum()), dtype=cands.cand.dtype)
    short = np.zeros(p.size, dtype=np.bool_)
    tmp = np.empty(int(cands.counts.max(initial=0)) + 1, cands.ckey.dtype)
    w = _take_segments(cands.cand, cands.ckey, cands.counts, p, k, out, short, np.empty(_TOP, cands.ckey.dtype),
                       tmp)
    return out[:w], short


def warm_up(sizing: tuple, idt=np.int32) -> bool:
    """Load the float32 loops of :func:`compensate_norms`, :func:`compensate_norms_candidates`,
    :func:`take_candidates` and :func:`segment_topk` by one call each on 64-element arrays with the types
    a step passes them (``sizing``: the caller's seven sample-sizing numbers; ``idt``: the output index
    type; the norms' spans are strided int64 views, as a layer table's columns are): numba loads them
    now, before a rank's full-size buffers exist, not inside the first step.  The kept candidate buffers
    are not touched, so no result changes.  False when the compiled loops are not enabled."""
    if not (_HAVE_NUMBA and enabled()):
        return False
    x, g = np.zeros(64, np.float32), np.ones(64, np.float32)
    spans = np.array([[0, 32], [32, 32]], dtype=np.int64)  # columns: strided, as DEFT's layer spans
    compensate_norms(x, g, spans[:, 0], spans[:, 1])
    st, sz, k = np.array([0, 32], np.int64), np.array([32, 32], np.int64), np.array([2, 2], np.int64)
    sz_f = tuple(float(v) for v in sizing)
    thr = np.zeros(2, np.uint32)
    _sample_thresholds(x, g, spans[:, 0], spans[:, 1], k, sz_f, 0, np.empty(64, np.float32),
                       np.empty(64, np.uint32), thr, np.empty(_TOP, np.uint32), np.empty(64, np.uint32))
    cand, ckey, counts = np.empty(64, idt), np.empty(64, np.uint32), np.zeros(2, np.int64)
    _compensate_collect(x, g, x.view(np.uint32), spans[:, 0], spans[:, 1], thr.view(np.float32), np.ones(2, np.bool_), _MASK32,
                        np.empty(2, np.float64), cand, ckey, counts)
    _take_segments(cand, ckey, counts, np.array([0, 1], np.int64), k, np.empty(4, idt), np.zeros(2, np.bool_),
                   np.empty(_TOP, np.uint32), np.empty(64, np.uint32))
    bufs = (np.empty(1024, np.int64), np.empty(1024, np.uint32), np.empty(1024, np.uint32))
    _segments_pass(g.view(np.uint32), _MASK32, _ZERO32, st, sz, k, sz_f, 0, np.empty(4, idt), *bufs, 3)
    return True
