"""CPU (NumPy) segmented top-k: :func:`segment_topk_abs` and its sample sizing :func:`segment_plan`.

:func:`segment_plan` is shared with the compiled (:mod:`.compiled_segments`)
and CuPy (:mod:`.cupy_segments`) segmented kernels.  What a segment is, and
the argument checks: :mod:`.numpy_segments`.  The selection tunables this
uses (``CHUNK``, ``DENSE_FRACTION``, ``MAX_RETRIES``, the sample margin)
are :mod:`.numpy_select`'s, read from there at call time.
"""

from __future__ import annotations

import numpy as np

from . import index_dtype  # the one place the index width is decided
from . import numpy_select as _sel  # the selection tunables, read at call time
from .numpy_segments import _segment_ks, _segments
from .numpy_select import _as_1d_float, _get_rng, topk_abs

# How it works
# ------------
# ``segment_topk_abs`` (exact: exactly ``k_i`` indices per segment, the
# ``k_i`` largest magnitudes; on ties any choice, deterministic):
#
# 1. Magnitude keys: the bits of ``|v|`` as unsigned integers order like
#    ``|v|`` (NaN above inf).
# 2. Per-segment thresholds from one random sample: segment ``i`` draws
#    ``m_i`` positions, one uniform in each of ``m_i`` equal strata (about
#    32 expected top-k hits, at most ``size/8``), all segments at once; the sampled keys
#    get the segment's position in the high 32 bits and one ``np.sort`` of
#    the combined keys orders every segment's sample.  The threshold is the
#    ``r_i``-th largest sampled key (``r_i``: expected hits + 4 sigma + 4, as
#    in :func:`topk_abs`), a little below the true ``k_i``-th largest.
#    Segments with ``r_i >= m_i`` (small or dense) take threshold 0: every
#    entry is a candidate.
# 3. One chunked pass over memory, run by run of adjacent segments (segments
#    are walked in increasing start; many scattered runs are walked as one
#    gathered concatenation instead, so the calls stay O(size / CHUNK)),
#    collects the candidates ``key >= t[segment]``: a chunk inside one
#    segment compares with a scalar, a chunk spanning several with their
#    smallest threshold and one vectorised filter at the end (or per element,
#    via ``np.repeat``, where that minimum lets many entries through).
#    Segments taken whole are gathered directly, not compared.
# 4. Segments with fewer than ``k_i`` candidates (rare: the margin) get a
#    lowered rank and a second pass over those segments only (vectorised
#    over them); after :data:`MAX_RETRIES` passes their threshold is 0.
# 5. Exact resolution: one ``np.sort`` of the candidates' combined keys
#    (segment, key) gives each segment's ``k_i``-th largest key ``q_i``;
#    every candidate with key ``> q_i`` is kept, plus the first
#    ``k_i - #(> q_i)`` candidates with key ``== q_i`` (lowest indices).
#
# Indices come back grouped by segment, in the order the segments were given.
# Segments of at least SEG_SMALL elements with k >= SEG_TOPK_K go to
# :func:`topk_abs` one by one (at most k.sum() / SEG_TOPK_K of them); the
# other large ones and the small ones take this path, in two calls.
# float64 input takes the same path with 64-bit
# keys; its combined sort is an ``np.lexsort`` (segment, key) instead.


def _keys(xs: np.ndarray, kbuf: np.ndarray | None = None) -> np.ndarray:
    """Magnitude keys of ``xs`` (uint32 for float32, uint64 for float64)."""
    if xs.dtype.itemsize == 4:
        return np.bitwise_and(xs.view(np.uint32), np.uint32(0x7FFFFFFF), out=kbuf)
    return np.bitwise_and(xs.view(np.uint64), np.uint64(0x7FFFFFFFFFFFFFFF), out=kbuf)


class _Virtual:
    """The concatenation of some segments of ``x``, walked in chunks (the candidate pass)."""

    def __init__(self, st: np.ndarray, sz: np.ndarray):
        self.st, self.sz = st, sz
        self.vend = np.cumsum(sz)
        self.vstart = self.vend - sz
        self.total = int(self.vend[-1]) if sz.size else 0
        self.delta = st - self.vstart  # real = virtual + delta[segment]

    def select(self, x: np.ndarray, tkey: np.ndarray, kbuf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Virtual positions (ascending) and keys of the entries with ``key >= tkey[segment]``."""
        pos_parts, key_parts = [], []
        vend, vstart, delta = self.vend, self.vstart, self.delta
        bbuf = np.empty(kbuf.shape[0], dtype=np.bool_)
        ss, fnz, ge = np.searchsorted, np.flatnonzero, np.greater_equal
        for v0 in range(0, self.total, _sel.CHUNK):
            v1 = min(self.total, v0 + _sel.CHUNK)
            s0 = int(ss(vend, v0, "right"))
            s1 = int(ss(vstart, v1, "left"))  # segments s0..s1-1 overlap [v0, v1)
            m = v1 - v0
            kb, bb = kbuf[:m], bbuf[:m]
            one = s1 - s0 == 1
            if one or bool(np.all(delta[s0:s1] == delta[s0])):  # adjacent in x: a slice
                a = int(v0 + delta[s0])
                _keys(x[a:a + m], kb)
            else:  # segments not adjacent in x: gather this chunk
                lens = np.minimum(vend[s0:s1], v1) - np.maximum(vstart[s0:s1], v0)
                gi = np.arange(v0, v1, dtype=np.int64)
                gi += np.repeat(delta[s0:s1], lens)
                _keys(x[gi], kb)
            if one:
                hit = fnz(ge(kb, tkey[s0], out=bb))
            else:
                lens = np.minimum(vend[s0:s1], v1) - np.maximum(vstart[s0:s1], v0)
                hit = fnz(ge(kb, np.repeat(tkey[s0:s1], lens), out=bb))
            if hit.size:
                key_parts.append(kb[hit])
                hit += v0
                pos_parts.append(hit)
        if not pos_parts:
            return np.empty(0, np.int64), np.empty(0, kbuf.dtype)
        return np.concatenate(pos_parts), np.concatenate(key_parts)

    def counts(self, vpos: np.ndarray) -> np.ndarray:
        """Hits per segment of ascending virtual positions."""
        lo = np.searchsorted(vpos, self.vstart, "left")
        hi = np.searchsorted(vpos, self.vend, "left")
        return hi - lo


def segment_plan(sizes: np.ndarray, ks: np.ndarray, sqrt_cap: float | None = None, *,
                 hits: float | None = None, sample_max: int | None = None, sigmas: float | None = None,
                 extra: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per segment ``(m_i, r_i)``: sample size and starting rank (the :func:`sample_plan` sizing, vectorised).

    ``m_i = 0`` marks a segment whose every entry is a candidate (no sample:
    ``k_i == 0`` handled by the caller, ``k_i`` dense, or ``r_i >= m_i``).
    Shared by the NumPy, compiled and CuPy segmented kernels; ``hits``,
    ``sample_max``, ``sigmas`` and ``extra`` override the module's sizing
    (the compiled kernel has its own sizing, ``_SEGC_*``).
    """
    hits = _SEG_SAMPLE_HITS if hits is None else hits
    sample_max = _SEG_SAMPLE_MAX if sample_max is None else sample_max
    sigmas = _sel._MARGIN_SIGMAS if sigmas is None else sigmas
    extra = _sel._MARGIN_EXTRA if extra is None else extra
    s = sizes.astype(np.float64)
    k = np.maximum(ks, 1).astype(np.float64)
    m = np.ceil(hits * s / k)
    # at most ~ sqrt(size) samples: beyond that the samples cost more than
    # the extra candidates a coarser threshold lets through (both ~ sqrt(size))
    if sqrt_cap:
        m = np.minimum(m, np.ceil(sqrt_cap * np.sqrt(s)))
    m = np.clip(m, _SEG_SAMPLE_MIN, sample_max)
    m = np.maximum(1.0, np.minimum(m, np.floor(s / 8)))
    lam = m * k / np.maximum(s, 1.0)
    r = np.ceil(lam + sigmas * np.sqrt(lam) + extra)
    whole = (r >= m) | (ks > _sel.DENSE_FRACTION * sizes) | (ks >= sizes)
    m = np.where(whole, 0, m).astype(np.int64)
    return m, np.where(whole, 0, r).astype(np.int64)


# sample sizing of the segmented top-k: fewer samples per segment than the
# whole-vector kernel (many segments share one sort); the margin is the same.
_SEG_SAMPLE_HITS = 32
_SEG_SAMPLE_MIN = 256
_SEG_SAMPLE_MAX = 8192
_SEG_SAMPLE_SQRT = 4.0
# the compiled kernel's sizing (:mod:`.compiled_segments`): its samples are read in cache-line runs, a
# candidate costs a few instructions (a set bit of its block's hit mask) and a retry re-reads one
# segment, so it samples less per segment and keeps a smaller margin (sizings compared on resnet50 and
# lstm-wt2 shapes, W = 1 and 16, densities 0.001 and 0.01: this one was best or within noise of it)
_SEGC_HITS = 16
_SEGC_MAX = 8192
_SEGC_SQRT = 2.0
_SEGC_SIGMAS = 1.5
_SEGC_EXTRA = 1


def _segc_sizing() -> tuple:
    """The compiled kernel's sizing as :func:`segment_plan`'s arguments, in the order of
    :func:`mpisparse.backend.compiled_segments._plan` (which does the same arithmetic in the kernel)."""
    return (float(_SEGC_HITS), float(_SEGC_SQRT or 0.0), float(_SEG_SAMPLE_MIN), float(_SEGC_MAX),
            float(_SEGC_SIGMAS), float(_SEGC_EXTRA), float(_sel.DENSE_FRACTION))


def _seg_thresholds(samp_sorted: np.ndarray, soff: np.ndarray, m: np.ndarray, r: np.ndarray,
                    kdt, wide: bool) -> np.ndarray:
    """The ``r_i``-th largest sampled key of every sampled segment (0 where ``m_i == 0``)."""
    t = np.zeros(m.size, dtype=kdt)
    on = (m > 0) & (r < m)
    if on.any():
        pick = samp_sorted[soff[on] + m[on] - r[on]]
        t[on] = pick if wide else (pick & np.uint64(0xFFFFFFFF)).astype(kdt)
    return t


def segment_topk_abs(x, starts, sizes, ks, *, rng=None, scratch=None) -> np.ndarray:
    """Exact top-``ks[i]`` by magnitude in every segment ``x[starts[i]:starts[i] + sizes[i]]``.

    Returns the flat indices into ``x`` (:func:`index_dtype`), exactly
    ``ks[i]`` per segment (``0 <= ks[i] <= sizes[i]``), grouped by segment
    in the given order, in no particular order within a segment.  On ties
    any of the tied entries; NaN ranks as the largest magnitude.  The number
    of NumPy calls does not grow with the number of segments: the segments
    are selected together (the algorithm in the section comment above) in
    O(total size / CHUNK) NumPy calls, except those with ``k_i >=
    SEG_TOPK_K`` (at most ``sum(k) / SEG_TOPK_K`` of them), which go to
    :func:`topk_abs` one by one.  ``rng`` only affects speed;
    ``scratch`` is accepted for the API's sake and not needed (the pass
    uses chunk-sized buffers).
    """
    x = _as_1d_float(x)
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    elif x.dtype.itemsize > 8:
        x = x.astype(np.float64)
    n = x.shape[0]
    st, sz = _segments(starts, sizes, n)
    k = _segment_ks(ks, sz)
    idt = index_dtype(n)
    ooff = np.zeros(k.size + 1, dtype=np.int64)
    np.cumsum(k, out=ooff[1:])
    out = np.empty(int(ooff[-1]), dtype=idt)
    if out.size == 0:
        return out
    rng = _get_rng(rng)
    from . import compiled_segments  # the compiled loop (numba), imported on first use: not at a rank's start

    if compiled_segments.enabled() and x.flags.c_contiguous:  # the compiled loop: every segment in one call
        if compiled_segments.segment_topk(x, st, sz, k, _segc_sizing(), int(rng.integers(1 << 32)), out,
                                          _sel.MAX_RETRIES):
            return out
    on = k > 0
    # small and large segments apart (see SEG_SMALL): two calls, their outputs put in their slots
    # segments with a large k: topk_abs each (at most k.sum() / SEG_TOPK_K of them), whose
    # single sample and float argpartition of the candidates beat the shared sort there
    solo = np.flatnonzero(on & (k >= SEG_TOPK_K) & (sz >= SEG_SMALL))
    if solo.size:
        on = on.copy()
        on[solo] = False
        for i in solo.tolist():
            a, e = int(st[i]), int(st[i] + sz[i])
            o = out[ooff[i]:ooff[i + 1]]
            o[...] = topk_abs(x[a:e], int(k[i]), rng=rng)
            o += idt(a)
        if not on.any():
            return out
    groups = [g for g in (np.flatnonzero(on & (sz < SEG_SMALL)), np.flatnonzero(on & (sz >= SEG_SMALL))) if g.size]
    if solo.size:
        len_one = False
    else:
        len_one = len(groups) == 1
    if len_one:
        g = groups[0]
        if g.size == k.size:
            return _segment_topk_grouped(x, st, sz, k, rng).astype(idt, copy=False)
        return _segment_topk_grouped(x, st[g], sz[g], k[g], rng).astype(idt, copy=False)
    for g in groups:
        got = _segment_topk_grouped(x, st[g], sz[g], k[g], rng)
        kg = k[g]
        slot = np.arange(got.size, dtype=np.int64)
        slot += np.repeat(ooff[g] - (np.cumsum(kg) - kg), kg)
        out[slot] = got
    return out


#: Segments below this size are selected apart from the main pass (see
#: :func:`_segment_topk_grouped`).
SEG_SMALL = 8192

#: Segments with at least this k are selected one by one by :func:`topk_abs`
#: (see :func:`segment_topk_abs`).
SEG_TOPK_K = 1 << 13

#: Segments with at least this many candidates find their k-th largest by a
#: partition of their own (float32 input); the others share one sort.
SEG_PART_MIN = 1 << 15


def _seg_pass(x: np.ndarray, st: np.ndarray, sz: np.ndarray, tkey: np.ndarray,
              kbuf: np.ndarray, bbuf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions (ascending) and keys of the entries with ``key >= tkey[segment]``.

    The segments must be non-empty and ascending in ``x``.  Walks the runs of
    adjacent segments in chunks of real memory (no gather; runs shorter than
    ``C / 8``, when there are more than 4, are walked as one gathered
    concatenation instead, so the calls stay O(size / C)).  A chunk inside
    one segment compares with that segment's scalar threshold; a chunk
    spanning several compares each segment's part with its own scalar (up to
    8 of them; more: per element via ``np.repeat``).  A threshold equal to
    the key type's maximum marks a segment the caller handles apart: it is
    skipped.
    """
    end = st + sz
    S = st.size
    brk = np.flatnonzero(st[1:] != end[:-1]) + 1
    C = kbuf.shape[0]
    rs_a = np.concatenate([[0], brk])
    re_a = np.concatenate([brk, [S]])
    pos_parts, key_parts = [], []
    rlen = end[re_a - 1] - st[rs_a]
    short = rlen * 8 < C
    if short.sum() > 4:  # many short runs: walk their concatenation (gathers), so that the
        # calls stay O(size / C): the long runs are at most 8 size / C, walked below
        sseg = np.repeat(short, re_a - rs_a)
        V = _Virtual(st[sseg], sz[sseg])
        vpos, key = V.select(x, tkey[sseg], kbuf)
        if vpos.size:
            pos_parts.append(vpos + V.delta[np.repeat(np.arange(V.st.size, dtype=np.int64), V.counts(vpos))])
            key_parts.append(key)
        rs_a, re_a = rs_a[~short], re_a[~short]
    gathered = pos_parts[0] if pos_parts else None
    gkey = key_parts[0] if pos_parts else None
    pos_parts, key_parts = [], []
    rs = rs_a.tolist()
    re_ = re_a.tolist()
    ss, fnz, ge = np.searchsorted, np.flatnonzero, np.greater_equal
    tnone = np.iinfo(tkey.dtype).max  # "no hits here" (the caller's mark for segments it handles apart)
    for a_seg, b_seg in zip(rs, re_):
        a, b = int(st[a_seg]), int(end[b_seg - 1])
        if b_seg - a_seg == 1:  # one segment: scalar threshold throughout
            t = tkey[a_seg]
            for c0 in range(a, b, C):
                m = min(b, c0 + C) - c0
                kb = _keys(x[c0:c0 + m], kbuf[:m])
                hit = ge(kb, t, out=bbuf[:m]).nonzero()[0]
                if hit.size:
                    key_parts.append(kb[hit])
                    hit += c0
                    pos_parts.append(hit)
            continue
        e_run, s_run = end[a_seg:b_seg], st[a_seg:b_seg]
        c0s = np.arange(a, b, C, dtype=np.int64)
        c1s = np.minimum(c0s + C, b)
        s0s = ss(e_run, c0s, "right").tolist()  # segments s0..s1-1 of the run overlap [c0, c1)
        s1s = ss(s_run, c1s, "left").tolist()
        for c0, c1, s0, s1 in zip(c0s.tolist(), c1s.tolist(), s0s, s1s):
            m = c1 - c0
            kb = _keys(x[c0:c1], kbuf[:m])
            if s1 - s0 == 1:
                hit = ge(kb, tkey[a_seg + s0], out=bbuf[:m]).nonzero()[0]
                if hit.size:
                    key_parts.append(kb[hit])
                    hit += c0
                    pos_parts.append(hit)
                continue
            tt = tkey[a_seg + s0:a_seg + s1]
            live = np.flatnonzero(tt != tnone)
            lo = np.maximum(s_run[s0:s1], c0) - c0
            hi = np.minimum(e_run[s0:s1], c1) - c0
            if live.size > 8:  # many segments in the chunk: entry by entry
                hit = fnz(ge(kb, np.repeat(tt, hi - lo), out=bbuf[:m]))
                if hit.size:
                    key_parts.append(kb[hit])
                    hit += c0
                    pos_parts.append(hit)
                continue
            for j in live.tolist():  # each segment's part of the chunk with its own scalar
                lj, hj = int(lo[j]), int(hi[j])
                kj = kb[lj:hj]
                hit = fnz(ge(kj, tt[j], out=bbuf[lj:hj]))
                if hit.size:
                    key_parts.append(kj[hit])
                    hit += c0 + lj
                    pos_parts.append(hit)
    if not pos_parts:
        if gathered is not None:
            return gathered, gkey
        return np.empty(0, np.int64), np.empty(0, kbuf.dtype)
    pos, key = np.concatenate(pos_parts), np.concatenate(key_parts)
    if gathered is not None:  # merge the gathered short runs' ascending positions (no sort)
        at = np.searchsorted(pos, gathered)
        pos, key = np.insert(pos, at, gathered), np.insert(key, at, gkey)
    return pos, key


def _segment_topk_grouped(x: np.ndarray, st: np.ndarray, sz: np.ndarray, k: np.ndarray, rng) -> np.ndarray:
    """The segmented algorithm of the section comment on segments with ``k > 0``: flat int64 indices, grouped."""
    order = None
    if st.size > 1 and bool(np.any(st[1:] < st[:-1])):  # walk memory forward; regroup at the end
        order = np.argsort(st, kind="stable")
        st, sz, k = st[order], sz[order], k[order]
    S = st.size
    wide = x.dtype.itemsize == 8
    kdt = np.uint64 if wide else np.uint32

    # 2. per-segment thresholds from one sample
    m, r = segment_plan(sz, k, _SEG_SAMPLE_SQRT)
    soff = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(m, out=soff[1:])
    M = int(soff[-1])
    if M:
        sid = np.repeat(np.arange(S, dtype=np.int64), m)
        # stratified: one position uniform in each of the m_i equal strata of
        # segment i (ascending, so the gather walks x forward)
        u = rng.random(M)
        u += np.arange(M, dtype=np.int64) - soff[sid]
        u *= (sz / np.maximum(m, 1))[sid]
        pos = st[sid] + np.minimum(u.astype(np.int64), sz[sid] - 1)
        sk = _keys(x[pos])
        if wide:
            samp = sk[np.lexsort((sk, sid))]
        else:
            samp = np.sort((sid.astype(np.uint64) << np.uint64(32)) | sk.astype(np.uint64))
    else:
        samp = np.empty(0, dtype=np.uint64)
    tkey = _seg_thresholds(samp, soff[:-1], m, r, kdt, wide)

    # 3. one chunked candidate pass over the segments' memory.  The small
    # segments (fewer than SEG_SMALL elements, or taken whole: m_i == 0) are
    # left out of it and walked as one gathered concatenation instead, so
    # that their coarse thresholds (few samples) do not lower the scalar
    # threshold of the chunks they share with large segments.
    C = min(int(sz.sum()) if S else 1, _sel.CHUNK)
    kbuf = np.empty(max(C, 1), dtype=kdt)
    bbuf = np.empty(max(C, 1), dtype=np.bool_)
    end = st + sz
    small = (m == 0) | (sz < SEG_SMALL)
    if small.all():
        V = _Virtual(st, sz)
        vpos, ckey = V.select(x, tkey, kbuf)
        real = vpos + V.delta[np.repeat(np.arange(S), V.counts(vpos))]
    elif small.any():
        tpass = tkey.copy()
        tpass[small] = np.iinfo(kdt).max  # above every key (the sign bit is masked off): no hits there
        real, ckey = _seg_pass(x, st, sz, tpass, kbuf, bbuf)
        V = _Virtual(st[small], sz[small])
        vpos, vkey = V.select(x, tkey[small], kbuf)
        if vpos.size:  # merge two ascending position lists (no sort)
            vreal = vpos + V.delta[np.repeat(np.arange(V.st.size), V.counts(vpos))]
            at = np.searchsorted(real, vreal)
            real, ckey = np.insert(real, at, vreal), np.insert(ckey, at, vkey)
    else:
        real, ckey = _seg_pass(x, st, sz, tkey, kbuf, bbuf)
    cnt = np.searchsorted(real, end, "left") - np.searchsorted(real, st, "left")

    # 4. too few candidates: lower those segments' thresholds, pass over them only
    short = np.flatnonzero(cnt < k)
    tries = 1
    while short.size:
        if tries >= _sel.MAX_RETRIES:
            tnew = np.zeros(short.size, dtype=kdt)
        else:
            rr = np.ceil(r[short] * 2.0 * k[short] / np.maximum(cnt[short], 1)).astype(np.int64) + 16
            r[short] = rr
            tnew = _seg_thresholds(samp, soff[:-1][short], m[short], rr, kdt, wide)
        tries += 1
        p2, k2 = _seg_pass(x, st[short], sz[short], tnew, kbuf, bbuf)
        drop = np.zeros(S, dtype=bool)
        drop[short] = True
        keep = ~drop[np.searchsorted(end, real, "right")]
        real = np.concatenate([real[keep], p2])
        ckey = np.concatenate([ckey[keep], k2])
        o = np.argsort(real)  # regroup by position, hence by segment (rare path)
        real, ckey = real[o], ckey[o]
        cnt = np.searchsorted(real, end, "left") - np.searchsorted(real, st, "left")
        short = short[cnt[short] < k[short]]
    cseg = np.repeat(np.arange(S, dtype=np.int64), cnt)

    # 5. exact resolution: each segment's k-th largest candidate key
    coff = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(cnt, out=coff[1:])
    if wide:
        q = ckey[np.lexsort((ckey, cseg))[coff[1:] - k]]
    else:
        # segments with many candidates: a partition of their own keys each (linear; at most
        # (candidates) / SEG_PART_MIN of them); the rest: one sort of the combined keys (segment, key)
        big = np.flatnonzero(cnt >= SEG_PART_MIN)
        q = np.zeros(S, dtype=kdt)
        for i in big.tolist():
            seg_keys = ckey[coff[i]:coff[i + 1]]
            j = seg_keys.size - int(k[i])
            q[i] = np.partition(seg_keys, j)[j]
        if big.size < S:
            rest = cnt < SEG_PART_MIN
            on = rest[cseg]
            ck = cseg[on].astype(np.uint64)
            ck <<= np.uint64(32)
            ck |= ckey[on]
            ck.sort()
            roff = np.zeros(S + 1, dtype=np.int64)
            np.cumsum(np.where(rest, cnt, 0), out=roff[1:])
            ri = np.flatnonzero(rest)
            q[ri] = (ck[roff[1:][ri] - k[ri]] & np.uint64(0xFFFFFFFF)).astype(kdt)
    qc = q[cseg]
    take = ckey >= qc
    if np.count_nonzero(take) != k.sum():  # ties at some q_i: only the first (k_i - #(> q_i)) of them
        eqi = np.flatnonzero(ckey == qc)  # the tied entries (few), grouped by segment, ascending
        es = cseg[eqi]
        ge_cnt = np.add.reduceat(take, coff[:-1], dtype=np.int64)  # every segment has >= k_i >= 1 candidates
        need = k - (ge_cnt - np.bincount(es, minlength=S))  # k_i minus the entries strictly above q_i
        rank = np.arange(eqi.size) - np.searchsorted(es, es, "left")  # position among its segment's ties
        take[eqi[rank >= need[es]]] = False
    sel = real[take]
    if order is None:
        return sel
    # sorted group j is given segment order[j]: put the groups back in the given order
    koff = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(k, out=koff[1:])
    inv = np.empty(S, dtype=np.int64)
    inv[order] = np.arange(S)
    kg = k[inv]  # k of the given segments, in the given order
    slot = np.arange(sel.size, dtype=np.int64)
    slot += np.repeat(koff[inv] - (np.cumsum(kg) - kg), kg)
    return sel[slot]
