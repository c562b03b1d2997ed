"""The segmented top-k as one compiled loop (numba): every segment's sample, pass and resolution.

:func:`segment_topk` is the compiled counterpart of the NumPy segmented
kernel (:func:`mpisparse.backend.numpy_segment_topk.segment_topk_abs`) and
returns the same kind of result: exactly ``k_i`` indices per segment,
grouped by segment in the given order, the ``k_i`` largest magnitudes of
each (on ties any of the tied entries; NaN ranks as the largest magnitude).

It works on magnitude *keys*, the float's bits with the sign bit cleared
(``uint32`` for float32, ``uint64`` for float64): keys order as the
magnitudes do, NaN above infinity.  Per segment, in one loop over the
segments (no NumPy call per segment):

1. the threshold: ``m_i`` stratified samples of the segment's keys (one
   uniform position in each of ``m_i`` equal strata, read as runs of
   :data:`_RUN` adjacent keys, one cache line each; numba's generator,
   seeded by the caller; the positions are drawn first, then read in a
   loop of loads only, so that the cache misses overlap), and the
   ``r_i``-th largest of them is the threshold (:func:`_rth_largest`;
   ``m_i``, ``r_i`` as :func:`segment_plan`'s (:func:`_plan`): the expected sampled top-k
   plus a margin of about 2 standard deviations: a retry costs one more
   read of one segment, a candidate a scan of its block);
2. one pass over the segment in blocks of 64: a block's hits
   (``key >= threshold``) become a 64-bit mask in one vectorised loop, and
   each set bit is collected, position and key, by its de Bruijn index (a
   hit costs a few instructions, not a scan of its block);
3. fewer than ``k_i`` candidates (the margin makes that rare): the rank is
   raised from the same sorted sample and the pass repeated; after
   ``max_retries`` passes the threshold is 0 (every entry a candidate);
4. the ``k_i``-th largest candidate key (:func:`_rth_largest`: one scan
   keeping the largest keys when ``k_i <= _TOP``, otherwise a histogram
   of the candidates' keys and an in-place select among the keys of the
   one bucket that holds it), then the entries above it and the first of
   the entries equal to it up to ``k_i``.

The candidate buffers grow to the largest count seen and are kept.  The
result never depends on the sample, only the time does.  The compensation pass of DEFT
(:mod:`.compiled_compensate`) reuses this module's compiled pieces and its
kept buffers (:data:`_state`).  This module imports nothing of the package
beyond :mod:`.compiled` (the switch).
"""

from __future__ import annotations

import numpy as np

from .compiled import DEBRUIJN as _DEBRUIJN
from .compiled import DEBRUIJN_MUL as _DEBRUIJN_MUL
from .compiled import enabled

__all__ = ["segment_topk"]

#: elements per block of the candidate pass (its hits are counted before any is collected)
_BLOCK = 64
#: adjacent keys per sample run (16 float32 = one 64-byte cache line): the sample's cost is its cache misses
_RUN = 16
#: an order statistic of rank up to this (from the top) is found by one scan keeping the largest keys seen
_TOP = 16
#: buckets of the histogram that narrows a larger order statistic to one bucket's keys
_BUCKETS = 1024

try:  # optional: the compiled loop
    import numba

    @numba.njit(cache=True, nogil=True)
    def _collect(xu, a, n, t, mask, cand, ckey):  # pragma: no cover - compiled
        """Positions and keys of ``key >= t`` in ``xu[a:a + n]`` into the buffers; returns the count (may
        exceed the buffers: then only the count is exact).

        Per block of 64 a bit mask of the hits (one vectorised loop over a block slice of constant length),
        then one step per set bit (its position by a de Bruijn multiply): a hit costs a few instructions,
        not a scan of its block.  The first step is taken for every block, hit or not, without a branch
        (0.25 -> 0.22 ms per W = 16 rank of resnet50 at 4 k candidates, measured)."""
        cap = cand.shape[0]
        c = 0
        one = np.uint64(1)
        zero64 = np.uint64(0)
        nb = n // _BLOCK
        for bi in range(nb):
            b = a + bi * _BLOCK
            blk = xu[b:b + _BLOCK]
            bits = np.uint64(0)
            for j in range(_BLOCK):
                bits |= np.uint64((blk[j] & mask) >= t) << np.uint64(j)
            if c < cap:  # the lowest hit, written whether or not there is one (a block has 0 or 1 hit mostly:
                # a branch on it mispredicts; with this the loop below runs for blocks of 2 or more hits only)
                low = bits & (~bits + one)
                j = _DEBRUIJN[(low * _DEBRUIJN_MUL) >> np.uint64(58)]
                cand[c] = b + j
                ckey[c] = blk[j] & mask
                c += bits != zero64
                bits ^= low
            while bits:
                low = bits & (~bits + one)
                j = _DEBRUIJN[(low * _DEBRUIJN_MUL) >> np.uint64(58)]
                bits ^= low
                if c < cap:
                    cand[c] = b + j
                    ckey[c] = blk[j] & mask
                c += 1
        for j in range(a + nb * _BLOCK, a + n):
            kk = xu[j] & mask
            if kk >= t:
                if c < cap:
                    cand[c] = j
                    ckey[c] = kk
                c += 1
        return c

    @numba.njit(cache=True, nogil=True)
    def _select_kth(b, n, kth):  # pragma: no cover - compiled
        """The ``kth`` smallest of ``b[:n]`` (0-based), partitioning ``b[:n]`` in place (Hoare, median of
        three pivot): no copy and no allocation, unlike ``np.partition`` (2.2 vs 1.5 us on 900 keys)."""
        lo = 0
        hi = n - 1
        while hi > lo:
            mid = (lo + hi) >> 1
            x = b[lo]
            y = b[mid]
            z = b[hi]
            if x > y:
                x, y = y, x
            if y > z:
                y = z
            if x > y:
                y = x
            i = lo
            j = hi
            while i <= j:
                while b[i] < y:
                    i += 1
                while b[j] > y:
                    j -= 1
                if i <= j:
                    t = b[i]
                    b[i] = b[j]
                    b[j] = t
                    i += 1
                    j -= 1
            if kth <= j:
                hi = j
            elif kth >= i:
                lo = i
            else:
                break
        return b[kth]

    @numba.njit(cache=True, nogil=True)
    def _rth_largest(a, n, r, top, tmp):  # pragma: no cover - compiled
        """The ``r``-th largest of ``a[:n]`` (``1 <= r <= n``), ``a`` unchanged: for ``r`` up to
        ``top.shape[0]`` one scan keeping the ``r`` largest in ``top`` (sorted, a few compares per key:
        0.35 us on 900 keys), otherwise a histogram of the keys narrows it to one bucket's keys, copied into
        ``tmp`` and partitioned by :func:`_select_kth`."""
        if r <= top.shape[0]:
            for j in range(r):
                top[j] = 0  # keys are unsigned: 0 is below or equal to every key
            for j in range(n):
                v = a[j]
                if v > top[0]:  # top[0] is the r-th largest so far
                    q = 1
                    while q < r and top[q] < v:
                        top[q - 1] = top[q]
                        q += 1
                    top[q - 1] = v
            return top[0]
        # a histogram of the keys above the smallest (at most _BUCKETS buckets), then an in-place select
        # among the keys of the one bucket that holds the answer: three linear passes, no data-dependent
        # branches in the first two (a select over all of them mispredicts a branch per key or so)
        lo = a[0]
        hi = a[0]
        for j in range(1, n):
            v = a[j]
            lo = min(lo, v)
            hi = max(hi, v)
        span = hi - lo
        shift = 0
        while (span >> shift) >= _BUCKETS:
            shift += 1
        nb = (span >> shift) + 1
        hist = np.zeros(nb, dtype=np.int64)
        for j in range(n):
            hist[(a[j] - lo) >> shift] += 1
        b = nb - 1
        above = 0
        while above + hist[b] < r:  # the r-th largest lies in bucket b, rank r - above there from the top
            above += hist[b]
            b -= 1
        m = 0
        for j in range(n):
            if (a[j] - lo) >> shift == b:
                tmp[m] = a[j]
                m += 1
        return _select_kth(tmp, m, m - (r - above))

    @numba.njit(cache=True, nogil=True)
    def _positions(a, ni, mi, pbuf):  # pragma: no cover - compiled
        """Draw the sample of a segment ``[a, a + ni)`` of about ``mi`` entries into ``pbuf`` (numba's
        generator, seeded by the caller); returns ``(runs, run)``: ``runs`` start positions, each of ``run``
        adjacent entries.  Runs of :data:`_RUN` (a cache line each), one at a uniform position in each of
        ``mi // _RUN`` equal strata, where the segment holds four times the sample; else ``mi`` single
        entries, one a stratum.  The positions are drawn before any is read, so that the reads' cache
        misses overlap."""
        runs = mi // _RUN
        if runs >= 1 and ni >= 4 * runs * _RUN:
            step = (ni - _RUN) / runs
            for j in range(runs):
                pbuf[j] = a + int((j + np.random.random()) * step)
            return runs, _RUN
        step = ni / max(mi, 1)
        for j in range(mi):
            p = int((j + np.random.random()) * step)
            if p > ni - 1:
                p = ni - 1
            pbuf[j] = a + p
        return mi, 1

    @numba.njit(cache=True, nogil=True)
    def _take(cand, ckey, c, ki, out, o, top, tmp):  # pragma: no cover - compiled
        """Write the positions of the ``ki`` largest of the ``c >= ki`` candidate keys ``ckey[:c]`` into
        ``out[o:o + ki]``: every candidate above the ``ki``-th largest key, then the first of those equal to
        it (in candidate order) up to ``ki``."""
        if c == ki:
            for j in range(c):
                out[o + j] = cand[j]
            return
        q = _rth_largest(ckey, c, ki, top, tmp)  # the ki-th largest candidate key
        above = 0
        for j in range(c):
            above += ckey[j] > q
        ties = ki - above
        w = o
        for j in range(c):
            kk = ckey[j]
            if kk > q:
                out[w] = cand[j]
                w += 1
            elif kk == q and ties > 0:
                out[w] = cand[j]
                w += 1
                ties -= 1

    @numba.njit(cache=True, nogil=True)
    def _plan(st, sz, k, sizing, m, r, ooff):  # pragma: no cover - compiled
        """Per segment the sample size ``m[i]`` and starting rank ``r[i]``: the arithmetic of
        :func:`mpisparse.backend.numpy_segment_topk.segment_plan`, one segment at a time (the NumPy version's
        twenty calls cost 18 us a call, measured at 18 segments), and ``ooff``, the output offsets; returns
        the largest ``m``.  ``sizing`` = ``(hits, sqrt_cap, sample_min, sample_max, sigmas, extra,
        dense_fraction)``, ``sqrt_cap`` 0 for none."""
        hits, sqrt_cap, smin, smax, sigmas, extra, dense = sizing
        mmax = 0
        ooff[0] = 0
        for i in range(st.shape[0]):
            ooff[i + 1] = ooff[i] + k[i]
            s = float(sz[i])
            kk = float(max(k[i], 1))
            mm = np.ceil(hits * s / kk)
            if sqrt_cap:
                mm = min(mm, np.ceil(sqrt_cap * np.sqrt(s)))
            mm = min(max(mm, smin), smax)
            mm = max(1.0, min(mm, np.floor(s / 8)))
            lam = mm * kk / max(s, 1.0)
            rr = np.ceil(lam + sigmas * np.sqrt(lam) + extra)
            if rr >= mm or k[i] > dense * s or k[i] >= sz[i]:
                m[i] = 0
                r[i] = 0
            else:
                m[i] = int(mm)
                r[i] = int(rr)
                mmax = max(mmax, m[i])
        return mmax

    @numba.njit(cache=True, nogil=True)
    def _segments_pass(xu, mask, zero, st, sz, k, sizing, seed, out, cand, ckey, tmp,
                       max_retries):  # pragma: no cover - compiled
        """Steps 1-4 of the module docstring for every segment (sample sizes from :func:`_plan`); returns
        ``(cand, ckey, tmp)`` (grown or not).

        ``zero`` is the key type's 0, passed in: a threshold of another integer type than the keys (``mask & 0``
        is int64 in numba) makes the pass compare in 64 bits, 2.7x slower (measured).  The sample's run
        positions are drawn first and read after, in a loop of loads only, so that the reads' cache misses
        overlap (they are random in a vector read from memory)."""
        S = st.shape[0]
        m = np.empty(S, dtype=np.int64)
        r = np.empty(S, dtype=np.int64)
        ooff = np.empty(S + 1, dtype=np.int64)
        mmax = max(_plan(st, sz, k, sizing, m, r, ooff), 1)
        if tmp.shape[0] < mmax:  # the scratch also holds a sample
            tmp = np.empty(mmax, dtype=tmp.dtype)
        np.random.seed(seed)  # numba's own generator: the sample positions follow from the caller's seed
        sbuf = np.empty(mmax, dtype=xu.dtype)
        pbuf = np.empty(mmax, dtype=np.int64)
        top = np.empty(_TOP, dtype=xu.dtype)
        for i in range(S):
            ki = k[i]
            a = st[i]
            ni = sz[i]
            mi = m[i]
            o = ooff[i]
            if ki == 0:
                continue
            if ki == ni:
                for j in range(ni):
                    out[o + j] = a + j
                continue
            runs, run = _positions(a, ni, mi, pbuf)
            mi = runs * run
            samp = sbuf[:mi]
            for j in range(runs):
                p = pbuf[j]
                for q in range(run):
                    samp[j * run + q] = xu[p + q] & mask
            ri = r[i]
            if ri > mi:
                ri = mi
            sorted_ = False
            if 0 < ri < mi:  # the first try needs one order statistic (linear); a retry sorts
                t = _rth_largest(samp, mi, ri, top, tmp)
            else:
                t = zero
            tries = 1
            while True:
                c = _collect(xu, a, ni, t, mask, cand, ckey)
                if c > cand.shape[0]:  # the buffers were too small: grow them, collect again
                    cap = c + c // 4 + 1024
                    cand = np.empty(cap, dtype=cand.dtype)
                    ckey = np.empty(cap, dtype=ckey.dtype)
                    tmp = np.empty(max(cap, tmp.shape[0]), dtype=tmp.dtype)
                    c = _collect(xu, a, ni, t, mask, cand, ckey)
                if c >= ki or t == zero:
                    break
                if tries >= max_retries:
                    t = zero
                else:
                    if not sorted_:
                        samp.sort()
                        sorted_ = True
                    ri = int(np.ceil(ri * 2.0 * ki / max(c, 1))) + 16
                    t = samp[mi - ri] if ri < mi else zero
                tries += 1
            _take(cand, ckey, c, ki, out, o, top, tmp)
        return cand, ckey, tmp

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_NUMBA = False


class _State:
    """The buffers kept between calls: :func:`segment_topk`'s candidates (positions, keys, a scratch copy of
    keys; keyed by key width) and
    :func:`mpisparse.backend.compiled_compensate.compensate_norms_candidates`'."""

    def __init__(self) -> None:
        self.buf: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        #: :func:`compensate_norms_candidates`' candidate buffers (positions, keys), by their item sizes
        self.fused: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        #: its sample buffer, by float width
        self.sample: dict[int, np.ndarray] = {}


_state = _State()


def segment_topk(x: np.ndarray, st: np.ndarray, sz: np.ndarray, k: np.ndarray, sizing: tuple, seed: int,
                 out: np.ndarray, max_retries: int) -> bool:
    """Fill ``out`` (grouped by segment, ``k`` per segment) with the segmented top-k of ``x``; False when the
    compiled loop cannot run here (not enabled, or ``x`` not a contiguous float32/float64 vector), then
    ``out`` is untouched.

    ``st``, ``sz``, ``k``: int64 per segment (starts, sizes, k), checked by the caller; ``sizing``: the
    seven numbers of the sample sizing (:func:`_plan`: ``segment_plan``'s arguments); ``seed`` seeds
    numba's generator for the sample positions (the caller draws it from its ``rng``).
    """
    if not (_HAVE_NUMBA and enabled()) or x.ndim != 1 or not x.flags.c_contiguous:
        return False
    if x.dtype == np.float32:
        xu, mask, zero = x.view(np.uint32), _MASK32, _ZERO32
    elif x.dtype == np.float64:
        xu, mask, zero = x.view(np.uint64), _MASK64, _ZERO64
    else:
        return False
    width = x.dtype.itemsize
    bufs = _state.buf.get(width)
    if bufs is None:
        cap = max(1024, 4 * int(k.max(initial=0)) + 1024)
        bufs = (np.empty(cap, np.int64), np.empty(cap, xu.dtype), np.empty(cap, xu.dtype))
    _state.buf[width] = _segments_pass(xu, mask, zero, st, sz, k, sizing, seed, out, *bufs, max_retries)
    return True


_MASK32, _ZERO32 = np.uint32(0x7FFFFFFF), np.uint32(0)
_MASK64, _ZERO64 = np.uint64(0x7FFFFFFFFFFFFFFF), np.uint64(0)
