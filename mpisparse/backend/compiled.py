"""The loops compiled by numba (optional: ``pip install mpisparse[fast]``) and the switch that enables them.

Loops over a float vector, each collecting the indices whose magnitude
reaches a threshold into a bounded buffer (the count is returned even when
it exceeds the buffer): :func:`_fused_pass` first adds the gradient into
the residual (``e += g``), :func:`_select_pass` only reads,
:func:`_momentum_pass` is DGC's ``u = m u + g; v += u``, and
:func:`_segments_fused_pass` / :func:`_segments_select_pass` use one
threshold per segment (DCT's layers). Each walks the vector in blocks of
:data:`_BLOCK` (:data:`_READ_BLOCK` for the read-only ones). The read-only
loop counts a block's hits before collecting them (the count vectorises; a
max reduction would not without fast-math), so it runs at about the speed
of a read of the vector, and collects a block with hits without branches
when the buffer has room for all of it (:func:`_collect`). The adding loop
(:func:`_add_collect`) and the momentum loop set a bit per hit in their
vectorised loop and collect the set bits one by one, so their
cost does not grow with the blocks that have a hit (threshold's and DCT's
drifted densities); the adding loop can also keep each hit's value and
zero it in the residual (:func:`_hit`). :func:`_sample_sum_abs` reads a threshold sample
as runs of one cache line. :mod:`mpisparse.backend.fused` builds the fused
compensation + selection on them, :func:`mpisparse.backend.numpy_select.topk_abs`
its candidate pass (:func:`select_ge`).

Index loops: :func:`scatter_sum` (the host exchange's clear, add and
scale; ascending blocks merged in one write per index) and
:func:`merge_sets` (gTop-k's union of two index-sorted sets).  This module
imports nothing of the package, so every layer can use it.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["KERNELS", "available", "enabled", "merge_sets", "scatter_sum", "select_ge", "stratum_positions",
           "warm_up"]

#: elements per block of the adding loops (a bit per element of a 64-bit mask) and the momentum loop
_BLOCK = 32
#: the same for the read-only loops (fewer, longer blocks: their count is all they do)
_READ_BLOCK = 64

#: ``scatter_sum``: an output with more than ``n / _CLEAR_BY_FILL`` entries to clear is zeroed whole (one memset
#: costs about as much as n / 64 scattered stores here)
_CLEAR_BY_FILL = 64
#: ``scatter_sum``: ascending blocks of at most this many ranks are merged (one write per index)
_MERGE_BLOCKS = 8

#: de Bruijn sequence for the position of a 64-bit word's lowest set bit: ``DEBRUIJN[(low * DEBRUIJN_MUL) >> 58]``
#: (the compiled loops that collect a block's hits by its bit mask)
DEBRUIJN_MUL = np.uint64(0x03F79D71B4CB0A89)
DEBRUIJN = np.zeros(64, dtype=np.int64)
for _i in range(64):
    DEBRUIJN[int((((1 << _i) * 0x03F79D71B4CB0A89) & 0xFFFFFFFFFFFFFFFF) >> 58)] = _i
del _i

#: adjacent entries a sample run reads (16 float32: one 64-byte cache line; a sample's cost is its cache misses)
SAMPLE_RUN = 16

#: splitmix64's constants: the hash of :func:`stratum_positions` (DGC's sample), the same here and compiled
_SPLITMIX_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_SPLITMIX_M1 = np.uint64(0xBF58476D1CE4E5B9)
_SPLITMIX_M2 = np.uint64(0x94D049BB133111EB)


def stratum_positions(key: int, n: int, m: int) -> np.ndarray:
    """``m`` ascending positions in ``[0, n)`` (``1 <= m <= n``), one in each stratum
    ``[floor(j n / m), floor((j + 1) n / m))``: its start plus ``floor(h_j w_j / 2^32)``, ``w_j`` its width and
    ``h_j`` the top 32 bits of splitmix64's output for the counter ``key + j * gamma`` (mod 2^64).  A pure
    function of ``key``: no random draw per position (the compiled momentum pass computes the same ones)."""
    j = np.arange(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = np.uint64(key) + j * _SPLITMIX_GAMMA
        x = (x ^ (x >> np.uint64(30))) * _SPLITMIX_M1
        x = (x ^ (x >> np.uint64(27))) * _SPLITMIX_M2
    x ^= x >> np.uint64(31)
    b = np.arange(m + 1, dtype=np.int64) * n // m
    return b[:-1] + (((x >> np.uint64(32)) * (b[1:] - b[:-1]).astype(np.uint64)) >> np.uint64(32)).astype(np.int64)


try:  # optional: the compiled loop
    import numba

    @numba.njit(nogil=True, inline="always")
    def _collect(x, b, end, t, cand, c, base):  # pragma: no cover - compiled
        """Append ``base + j`` for ``j`` in ``[b, end)`` with ``|x[j]| >= t`` to ``cand[c:]``; returns the new
        count (it goes on counting past the buffer). With room for the whole block, without branches:
        every index is written and the count advances only on a hit."""
        cap = cand.shape[0]
        if c + (end - b) <= cap:
            for j in range(b, end):
                cand[c] = base + j
                c += abs(x[j]) >= t
        else:
            for j in range(b, end):
                if abs(x[j]) >= t:
                    if c < cap:
                        cand[c] = base + j
                    c += 1
        return c

    @numba.njit(nogil=True, inline="always")
    def _collect_values(x, b, end, t, cand, cval, c):  # pragma: no cover - compiled
        """:func:`_collect` (``base`` 0) that also stores ``|x[j]|`` beside each index in ``cval``."""
        cap = cand.shape[0]
        if c + (end - b) <= cap:
            for j in range(b, end):
                a = abs(x[j])
                cand[c] = j
                cval[c] = a
                c += a >= t
        else:
            for j in range(b, end):
                a = abs(x[j])
                if a >= t:
                    if c < cap:
                        cand[c] = j
                        cval[c] = a
                    c += 1
        return c

    @numba.njit(nogil=True, inline="always")
    def _hit(e, i, cand, cval, c, base, clear):  # pragma: no cover - compiled
        """Collect hit ``i`` of ``e`` (a slice starting at ``base``) at slot ``c`` if the buffer has room: its
        index, with a non-empty ``cval`` its value, and with ``clear`` then zero it in ``e``.  (The block loop
        of :func:`_add_collect` writes the same inline: through this function a hit cost 3x, measured.)"""
        if c < cand.shape[0]:
            cand[c] = base + i
            if c < cval.shape[0]:
                cval[c] = e[i]
                if clear:
                    e[i] = 0

    @numba.njit(nogil=True, inline="always")
    def _add_collect(e, g, t, cand, c, base, cval, clear):  # pragma: no cover - compiled
        """``e += g`` over all of ``e`` (a slice starting at ``base``), collecting the indices with ``|e| >= t``
        (the count goes on past the buffer); with a non-empty ``cval`` (as long as ``cand``) each hit's new
        ``e`` beside it (signed), and with ``clear`` that entry of ``e`` zeroed after it.  Per block of
        :data:`_BLOCK`, one vectorised loop adds, stores and sets a bit per hit; then one step per set bit
        (its position by a de Bruijn multiply), so a hit costs a few instructions and a block without one
        nothing more (at 1.7 % hits, 22.5 -> 11.6 ms for 25.6 M elements against a scan of each block with
        a hit; measured)."""
        n = e.shape[0]
        cap = cand.shape[0]
        keep = cval.shape[0]
        full = n - n % _BLOCK
        one = np.uint64(1)
        for b in range(0, full, _BLOCK):
            eb = e[b:b + _BLOCK]  # a slice of constant length: the loop below vectorises
            gb = g[b:b + _BLOCK]
            bits = np.uint64(0)
            for j in range(_BLOCK):
                w = eb[j] + gb[j]
                eb[j] = w
                bits |= np.uint64(abs(w) >= t) << np.uint64(j)
            while bits:
                low = bits & (~bits + one)
                j = DEBRUIJN[(low * DEBRUIJN_MUL) >> np.uint64(58)]
                bits ^= low
                if c < cap:
                    cand[c] = base + b + j
                    if c < keep:
                        cval[c] = eb[j]
                        if clear:
                            eb[j] = 0
                c += 1
        for j in range(full, n):
            w = e[j] + g[j]
            e[j] = w
            if abs(w) >= t:
                _hit(e, j, cand, cval, c, base, clear)
                c += 1
        return c

    @numba.njit(nogil=True, inline="always")
    def _read_collect(x, t, cand, c, base):  # pragma: no cover - compiled
        """:func:`_add_collect` without the add: only reads ``x``."""
        n = x.shape[0]
        full = n - n % _READ_BLOCK
        for b in range(0, full, _READ_BLOCK):
            hits = 0
            for j in range(b, b + _READ_BLOCK):  # a count of the hits vectorises (a max reduction does not)
                hits += abs(x[j]) >= t
            if hits:
                c = _collect(x, b, b + _READ_BLOCK, t, cand, c, base)
        return _collect(x, full, n, t, cand, c, base)

    @numba.njit(cache=True, nogil=True)
    def _fused_pass(e, g, t, cand, cval, clear):  # pragma: no cover - compiled
        return _add_collect(e, g, t, cand, 0, 0, cval, clear)

    @numba.njit(cache=True, nogil=True)
    def _select_pass(x, t, cand):  # pragma: no cover - compiled
        return _read_collect(x, t, cand, 0, 0)

    @numba.njit(nogil=True, inline="always")
    def _stratum_position(key, j, n, m):  # pragma: no cover - compiled
        """:func:`stratum_positions`'s ``j``-th position (the same integer arithmetic, one at a time)."""
        x = key + np.uint64(j) * _SPLITMIX_GAMMA
        x = (x ^ (x >> np.uint64(30))) * _SPLITMIX_M1
        x = (x ^ (x >> np.uint64(27))) * _SPLITMIX_M2
        x = x ^ (x >> np.uint64(31))
        lo = (j * n) // m
        hi = ((j + 1) * n) // m
        return lo + np.int64(((x >> np.uint64(32)) * np.uint64(hi - lo)) >> np.uint64(32))

    @numba.njit(cache=True, nogil=True)
    def _sample_sum_abs(e, g, key, out):  # pragma: no cover - compiled
        """A sample of the compensated magnitudes before ``e += g`` runs: ``out`` (``SAMPLE_RUN * r`` long) gets
        ``|e[p + q] + g[p + q]|`` for ``q < SAMPLE_RUN`` at each ``p`` of ``stratum_positions(key, n -
        SAMPLE_RUN + 1, r)``: one cache line a run, one run a stratum; no index arrays or temporaries."""
        n = e.shape[0]
        runs = out.shape[0] // SAMPLE_RUN
        for j in range(runs):
            p = _stratum_position(key, j, n - SAMPLE_RUN + 1, runs)
            for q in range(SAMPLE_RUN):
                out[j * SAMPLE_RUN + q] = abs(e[p + q] + g[p + q])

    @numba.njit(cache=True, nogil=True)
    def _momentum_pass(u, v, g, m, t, cand, cval, key, samp):  # pragma: no cover - compiled
        """DGC's momentum correction in one pass: ``u = m u + g``, ``v += u`` (float32 ``m``: the product is
        rounded before the sum, as NumPy's ``u *= m; u += g``), collecting the indices with ``|v| >= t``
        (their ``|v|`` beside them in ``cval``, as long as ``cand``);
        also ``samp[j] = |v[p_j]|`` (new ``v``) at ``p_j``, ``stratum_positions(key, n, samp.size)``, read
        while its block is in cache (no random reads)."""
        n = v.shape[0]
        ms = samp.shape[0]
        c = 0
        s = 0  # next sample
        p = _stratum_position(key, 0, n, ms) if ms > 0 else n
        cap = cand.shape[0]
        one = np.uint64(1)
        full = n - n % _BLOCK
        for b in range(0, full, _BLOCK):
            ub = u[b:b + _BLOCK]  # slices of constant length: the loop below vectorises
            vb = v[b:b + _BLOCK]
            gb = g[b:b + _BLOCK]
            bits = np.uint64(0)
            for j in range(_BLOCK):
                a = ub[j] * m
                a = a + gb[j]
                ub[j] = a
                w = vb[j] + a
                vb[j] = w
                bits |= np.uint64(abs(w) >= t) << np.uint64(j)
            while bits:  # the hits in ascending order, one step each (as _add_collect)
                low = bits & (~bits + one)
                j = DEBRUIJN[(low * DEBRUIJN_MUL) >> np.uint64(58)]
                bits ^= low
                if c < cap:
                    cand[c] = b + j
                    cval[c] = abs(vb[j])
                c += 1
            while p < b + _BLOCK:
                samp[s] = abs(v[p])
                s += 1
                p = _stratum_position(key, s, n, ms) if s < ms else n
        for j in range(full, n):
            a = u[j] * m
            a = a + g[j]
            u[j] = a
            v[j] = v[j] + a
        while s < ms:
            samp[s] = abs(v[p])
            s += 1
            p = _stratum_position(key, s, n, ms) if s < ms else n
        return _collect_values(v, full, n, t, cand, cval, c)

    @numba.njit(cache=True, nogil=True)
    def _segments_fused_pass(e, g, starts, ends, thr, cand, cval, clear):  # pragma: no cover - compiled
        """``e += g`` over the segments ``[starts[s], ends[s])`` (ascending, disjoint, covering ``e``),
        collecting in each the indices with ``|e| >= thr[s]``: ascending, segment after segment."""
        c = 0
        for s in range(starts.shape[0]):
            lo = starts[s]
            hi = ends[s]
            # on slices the loop indices start at 0: no negative-index wraparound, so the count vectorises
            c = _add_collect(e[lo:hi], g[lo:hi], thr[s], cand, c, lo, cval, clear)
        return c

    @numba.njit(cache=True, nogil=True)
    def _segments_select_pass(x, starts, ends, thr, cand):  # pragma: no cover - compiled
        """:func:`_segments_fused_pass` without the add: only reads ``x``."""
        c = 0
        for s in range(starts.shape[0]):
            lo = starts[s]
            hi = ends[s]
            c = _read_collect(x[lo:hi], thr[s], cand, c, lo)
        return c

    @numba.njit(cache=True, nogil=True, boundscheck=True)  # indices from other ranks: an IndexError, as NumPy
    def _scatter_sum_pass(out, clear, indices, values, bounds, scale, tmp):  # pragma: no cover - compiled
        """The host ``scatter_sum`` in index loops without temporaries: ``out[clear] = 0``; block ``r``
        (``indices[bounds[r]:bounds[r + 1]]``, distinct) adds its values; then, when ``tmp`` is not empty,
        every touched entry becomes ``sum * scale``, read into ``tmp`` first (an index repeated across
        blocks is then scaled once, as NumPy's ``out[indices] *= scale``)."""
        for j in range(clear.shape[0]):
            out[clear[j]] = 0
        for r in range(bounds.shape[0] - 1):
            for j in range(bounds[r], bounds[r + 1]):
                i = indices[j]
                out[i] = out[i] + values[j]
        if tmp.shape[0]:
            for j in range(indices.shape[0]):
                tmp[j] = out[indices[j]] * scale
            for j in range(indices.shape[0]):
                out[indices[j]] = tmp[j]

    @numba.njit(cache=True, nogil=True, boundscheck=True)
    def _clear_pass(out, clear):  # pragma: no cover - compiled
        """``out[clear] = 0`` (:func:`_scatter_sum_pass`'s first loop)."""
        for j in range(clear.shape[0]):
            out[clear[j]] = 0

    @numba.njit(cache=True, nogil=True)
    def _blocks_ascending(indices, bounds, n):  # pragma: no cover - compiled
        """Whether every block ``indices[bounds[r]:bounds[r + 1]]`` is strictly ascending within ``[0, n)``."""
        for r in range(bounds.shape[0] - 1):
            lo = bounds[r]
            hi = bounds[r + 1]
            if hi > lo and (indices[lo] < 0 or indices[hi - 1] >= n):
                return False
            for j in range(lo + 1, hi):
                if indices[j] <= indices[j - 1]:
                    return False
        return True

    @numba.njit(nogil=True, inline="always")
    def _put(io, vo, c, i, v, out, scale, final, scaled):  # pragma: no cover - compiled
        """One merged entry: into the running sums ``io[c], vo[c]``, or (``final``) into ``out[i]``, scaled."""
        if not final:
            io[c] = i
            vo[c] = v
        elif scaled:
            out[i] = v * scale
        else:
            out[i] = v

    @numba.njit(nogil=True, inline="always")
    def _merge_two(ia, va, na, ib, vb, lo, hi, io, vo, out, scale, final, scaled,
                   from_zero=True):  # pragma: no cover - compiled
        """Merge the ascending running sums ``ia[:na], va[:na]`` with block ``ib[lo:hi], vb[lo:hi]`` (an index in
        both: its sum plus the block's value; in the block alone: 0 plus it, or with ``from_zero`` False the
        value itself) through :func:`_put`; returns the count."""
        zero = vb.dtype.type(0)
        i = 0
        j = lo
        c = 0
        while i < na and j < hi:
            a = ia[i]
            b = ib[j]
            if a < b:
                _put(io, vo, c, a, va[i], out, scale, final, scaled)
                i += 1
            elif b < a:
                _put(io, vo, c, b, zero + vb[j] if from_zero else vb[j], out, scale, final, scaled)
                j += 1
            else:
                _put(io, vo, c, a, va[i] + vb[j], out, scale, final, scaled)
                i += 1
                j += 1
            c += 1
        while i < na:
            _put(io, vo, c, ia[i], va[i], out, scale, final, scaled)
            i += 1
            c += 1
        while j < hi:
            _put(io, vo, c, ib[j], zero + vb[j] if from_zero else vb[j], out, scale, final, scaled)
            j += 1
            c += 1
        return c

    @numba.njit(cache=True, nogil=True)
    def _merge_sets_pass(ia, va, ib, vb, io, vo):  # pragma: no cover - compiled
        """The union of two ascending sparse sets into ``io, vo`` (an index in both: ``va + vb``); its count."""
        return _merge_two(ia, va, ia.shape[0], ib, vb, 0, ib.shape[0], io, vo, vo, vo.dtype.type(1), False, False,
                          False)

    @numba.njit(cache=True, nogil=True)
    def _scatter_merge_pass(out, indices, values, bounds, scale, scaled, ti, tv):  # pragma: no cover - compiled
        """:func:`_scatter_sum_pass`'s adds and scaling over ascending blocks (:func:`_blocks_ascending`), ``out``
        zero at every index: the blocks merged one after another into running sums (``ti``, ``tv``: two
        halves, each as long as all blocks but the last), each index's values added from 0 in block order; the last
        block's merge writes ``out`` (scaled): the same float operations in the same order, one write per
        distinct index of ``out``, no read of it and no second pass for the scale."""
        h = ti.shape[0] // 2  # at least the entries of every block but the last
        ci = ti[:h]
        cv = tv[:h]
        ni = ti[h:]
        nv = tv[h:]
        c = 0
        last = bounds.shape[0] - 2
        for r in range(last):
            c = _merge_two(ci, cv, c, indices, values, bounds[r], bounds[r + 1], ni, nv, out, scale, False, scaled)
            ci, ni = ni, ci
            cv, nv = nv, cv
        if last >= 0:
            _merge_two(ci, cv, c, indices, values, bounds[last], bounds[last + 1], ni, nv, out, scale, True, scaled)

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_NUMBA = False


def available() -> bool:
    """Whether the compiled loop can run here (numba installed)."""
    return _HAVE_NUMBA


def enabled() -> bool:
    """Whether :func:`compensate_topk` uses the compiled loop (numba installed and ``MPISPARSE_FUSED`` not 0)."""
    return _HAVE_NUMBA and os.environ.get("MPISPARSE_FUSED", "1").strip() != "0"


class _Buffers:
    """Candidate buffers (indices; DGC's pass also their magnitudes), reused across calls (keyed by dtype)."""

    def __init__(self) -> None:
        self.cand: dict[tuple, np.ndarray] = {}

    def get(self, cap: int, idt) -> np.ndarray:
        key = (np.dtype(idt).str,)
        buf = self.cand.get(key)
        if buf is None or buf.size < cap:
            buf = self.cand[key] = np.empty(max(cap, 1024), dtype=idt)
        return buf[:cap]

    def capacity(self, idt) -> int:
        buf = self.cand.get((np.dtype(idt).str,))
        return 0 if buf is None else buf.size


_buffers = _Buffers()


def scatter_sum(out: np.ndarray, indices, values, counts, scale: float, clear) -> bool:
    """The host ``scatter_sum`` (:func:`mpisparse.backend.scatter_sum`) by the compiled index loops: True
    when it ran, False (nothing done) when not enabled or the arrays do not fit the loop (float32 ``out``
    and ``values``, 1-D integer ``indices`` and ``clear``, a sparse scale).  ``clear`` None: all of ``out``
    is zeroed first (one memset), then the same loops."""
    if (not enabled() or not isinstance(out, np.ndarray) or out.dtype != np.float32
            or not isinstance(values, np.ndarray) or values.dtype != np.float32 or out.ndim != 1
            or not isinstance(indices, np.ndarray) or indices.dtype.kind not in "iu"
            or not (clear is None or isinstance(clear, np.ndarray) and clear.dtype.kind in "iu")
            or len(indices) == 0):
        return False
    scaled = scale != 1.0
    if scaled and not 2 * len(indices) < out.size:
        return False  # NumPy scales the whole vector then
    bounds = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=bounds[1:])
    if bounds[-1] != len(indices) or len(values) != len(indices):
        return False
    if clear is None or len(clear) > out.size // _CLEAR_BY_FILL:
        out.fill(0)  # a memset streams: cheaper than this many scattered stores
        clear = indices[:0]
    if len(counts) <= _MERGE_BLOCKS and _blocks_ascending(indices, bounds, out.size):
        _clear_pass(out, clear)
        h = int(bounds[-2])  # the running sums never hold more than the blocks before the last
        _scatter_merge_pass(out, indices, values, bounds, np.float32(scale), scaled,
                            np.empty(2 * h, dtype=indices.dtype), np.empty(2 * h, dtype=np.float32))
        return True
    tmp = np.empty(len(indices) if scaled else 0, dtype=np.float32)
    _scatter_sum_pass(out, clear, indices, values, bounds, np.float32(scale), tmp)
    return True


def merge_sets(idx_a, vals_a, idx_b, vals_b):
    """The union of two sparse sets, each strictly ascending in its indices: ``(indices, values)`` ascending,
    the values of an index in both summed (``a + b``), by one compiled merge; None when not enabled or the
    arrays do not fit it (host arrays, one integer dtype, one float32 dtype, both ascending)."""
    arrays = (idx_a, vals_a, idx_b, vals_b)
    if not enabled() or not all(isinstance(a, np.ndarray) and a.ndim == 1 for a in arrays):
        return None
    if (idx_a.dtype != idx_b.dtype or idx_a.dtype.kind not in "iu" or vals_a.dtype != np.float32
            or vals_b.dtype != np.float32 or len(idx_a) != len(vals_a) or len(idx_b) != len(vals_b)):
        return None
    top = np.iinfo(idx_a.dtype).max
    if not all(_blocks_ascending(i, np.array([0, len(i)], np.int64), top) for i in (idx_a, idx_b)):
        return None
    m = len(idx_a) + len(idx_b)
    io, vo = np.empty(m, dtype=idx_a.dtype), np.empty(m, dtype=np.float32)
    c = int(_merge_sets_pass(idx_a, vals_a, idx_b, vals_b, io, vo))
    return io[:c], vo[:c]


def select_ge(x: np.ndarray, t, cap: int, idt):
    """Ascending indices with ``|x| >= t`` (``t`` of x's dtype) found by the compiled read-only pass, or None
    (not enabled, or more than ``cap`` of them). The result is a view of a reused buffer: copy it to keep it."""
    if not enabled() or x.ndim != 1 or x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous:
        return None
    cand = _buffers.get(cap, idt)
    c = int(_select_pass(x, t, cand))
    return cand[:c] if c <= cap else None


#: the loops :func:`warm_up` can load, by the names the schemes declare (``CollectiveScheme.compiled_kernels``)
KERNELS = ("fused", "select", "momentum", "segments_fused", "segments_select", "scatter_sum", "merge")


def warm_up(kernels, idt=np.int32) -> tuple[str, ...]:
    """Load ``kernels`` (names of :data:`KERNELS`) by one call each on 64-element arrays, with the types a
    step passes them (float32 vectors, ``idt`` indices): numba then loads them from its cache (or compiles
    them) now, before a rank's full-size buffers exist, instead of inside the first step.  Touches none of
    the module's reused buffers, so no result changes.  Returns the names called (none when not
    :func:`enabled`); an unknown name is a ValueError."""
    kernels = tuple(kernels)
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        raise ValueError(f"compiled kernel {bad[0]!r} is not one of {', '.join(KERNELS)}")
    if not enabled():
        return ()
    n, t, f32 = 64, np.float32(1.0), np.float32
    x, g, cand = np.zeros(n, f32), np.ones(n, f32), np.empty(n, idt)
    starts, ends, thr = np.array([0], np.int64), np.array([n], np.int64), np.ones(1, f32)
    calls = {
        "fused": lambda: (_fused_pass(x, g, t, cand, np.empty(n, f32), False),
                          _sample_sum_abs(x, g, np.uint64(1), np.empty(SAMPLE_RUN, f32))),
        "select": lambda: _select_pass(x, t, cand),
        "momentum": lambda: _momentum_pass(x, np.zeros(n, f32), g, f32(0.5), t, cand, np.empty(n, f32),
                                           np.uint64(1), np.empty(4, f32)),
        "segments_fused": lambda: _segments_fused_pass(x, g, starts, ends, thr, cand, np.empty(n, f32), False),
        "segments_select": lambda: _segments_select_pass(x, starts, ends, thr, cand),
        "merge": lambda: merge_sets(np.arange(n, dtype=idt), x, np.arange(n, dtype=idt), g),
        "scatter_sum": lambda: (_scatter_sum_pass(x, np.zeros(1, idt), np.zeros(1, idt), np.ones(1, f32),
                                                  np.array([0, 1], np.int64), t, np.empty(0, f32)),
                                _clear_pass(x, np.zeros(1, idt)),
                                _blocks_ascending(np.zeros(1, idt), np.array([0, 1], np.int64), n),
                                _scatter_merge_pass(x, np.zeros(1, idt), np.ones(1, f32), np.array([0, 1], np.int64),
                                                    t, True, np.empty(2, idt), np.empty(2, f32))),
    }
    for name in kernels:
        calls[name]()
    return kernels
