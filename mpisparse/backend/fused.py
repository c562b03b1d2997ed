"""Fused error feedback and top-k selection: one pass over memory instead of two.

A sparse step with error feedback reads the gradient and the residual,
writes the compensated residual (``e += g``), then reads it again to
select its ``k`` largest magnitudes.  :func:`compensate_topk` does both in
one pass: a threshold is first estimated from a sample of ``e + g`` (sized
as the sampled top-k of :func:`mpisparse.backend.numpy_select.topk_abs`,
read by a compiled loop as runs of adjacent entries, one cache line each, at
stratified positions), then
one loop adds, stores and collects every index whose compensated magnitude
reaches the threshold; the exact top ``k`` are picked among those
candidates (a few more than ``k``).  When the threshold was too high (fewer
than ``k`` candidates) or too low (more than the candidate buffer holds),
the exact top-k of the already compensated residual is taken the plain way
-- the result never depends on the estimate.

The loop is compiled with numba when it is installed (``pip install
mpisparse[fast]``); without it, or with ``MPISPARSE_FUSED=0``, the same
function runs the plain NumPy steps (``e += g`` then ``topk_abs``).  Both
return the same set of indices (the ``k`` largest ``|e + g|``; on exact
ties any ``k`` of the tied entries, as ``topk_abs``) and leave the same
residual, bit for bit (``tests/test_fused.py``).

The same holds for the scheme-specific passes: :func:`compensate_threshold`
(a fixed threshold), :func:`compensate_momentum` with :func:`narrow` (DGC's
momentum correction and its candidates, ``tests/test_fused_dgc.py``) and
:func:`compensate_segments_threshold` / :func:`segments_threshold` (a
threshold per layer, DCT, ``tests/test_fused_dct.py``).
"""

from __future__ import annotations

import numpy as np

from . import numpy_select as nk
from .compiled import SAMPLE_RUN, _HAVE_NUMBA, _Buffers, _buffers, available, enabled, select_ge, stratum_positions
from .numpy_select import index_dtype

if _HAVE_NUMBA:
    from .compiled import _fused_pass, _momentum_pass, _sample_sum_abs, _segments_fused_pass, _segments_select_pass

#: the threshold samples of :func:`compensate_candidates` (apart from the candidate buffers)
_samples = _Buffers()
#: the values collected beside the candidates (``values=True``), as long as the candidate buffer
_values = _Buffers()
#: an empty value buffer: the compiled passes then collect indices alone
_NO_VALUES = np.empty(0, dtype=np.float32)

__all__ = ["available", "compensate_candidates", "compensate_momentum", "compensate_segments_threshold",
           "compensate_threshold", "compensate_topk", "enabled", "narrow", "segments_threshold", "select_ge",
           "topk_from_candidates"]


def _check(e, g) -> None:
    if e.shape != g.shape or e.ndim != 1:
        raise ValueError(f"residual shape {e.shape} and gradient shape {g.shape} must be one 1-D shape")
    if e.dtype != g.dtype or e.dtype.kind != "f":
        raise TypeError(f"residual dtype {e.dtype} and gradient dtype {g.dtype} must be one float dtype")


def compensate_candidates(e: np.ndarray, g: np.ndarray, k: int, *, rng=None, fused: bool | None = None):
    """``e += g`` in place; returns the candidates of the top ``k`` found on the way, or None.

    With the compiled loop: a threshold from a sample of ``e + g`` (runs of
    ``SAMPLE_RUN`` adjacent entries at stratified positions), then one
    pass that adds, stores and collects the indices whose ``|e|`` reaches it
    (a view of a reused buffer, valid until the next call).  None when the
    plain path ran (no numba, ``fused`` False, a small or dense ``k``, no
    usable threshold) or when the estimate missed (too many candidates for
    the buffer): ``e`` is compensated either way.  ``fused``: force the
    compiled loop on (True; an error without numba) or off (False); None
    follows :func:`enabled`.
    """
    _check(e, g)
    n = e.shape[0]
    k = nk._check_k(k, n)
    use = enabled() if fused is None else fused
    if use and not _HAVE_NUMBA:
        raise RuntimeError("fused=True needs numba (pip install mpisparse[fast])")
    if not use or n <= nk.SMALL_N or k == 0 or k > nk.DENSE_FRACTION * n:
        e += g
        return None
    rng = nk._get_rng(rng)
    m, r = nk.sample_plan(n, k)
    m -= m % SAMPLE_RUN  # whole runs (m >= 8192)
    if r >= m:
        e += g
        return None
    samp = _samples.get(m, e.dtype)  # one cache line a run, one run a stratum: a few thousand misses
    _sample_sum_abs(e, g, np.uint64(rng.integers(0, 1 << 63)), samp)
    t = nk.kth_largest(samp, r)
    if not t > 0:  # mostly zeros, or NaN: no usable threshold
        e += g
        return None
    cap = 4 * k + 1024
    cand = _buffers.get(cap, index_dtype(n))
    c = int(_fused_pass(e, g, nk._ceil_to_dtype(t, e.dtype), cand, _NO_VALUES, False))
    return cand[:c] if c <= cap else None


def topk_from_candidates(e: np.ndarray, cand, k: int, *, rng=None, scratch=None,
                         ascending: bool = False) -> np.ndarray:
    """The indices of the ``k`` largest ``|e|``: picked among ``cand`` (ascending) when it holds at least
    ``k``, else (``cand`` None or short: the threshold was too high) by ``topk_abs`` over all of ``e``.
    ``ascending``: sorted (from the candidates by a mask, no sort)."""
    if cand is not None and cand.shape[0] >= k:
        c = cand.shape[0]
        if c == k:
            return cand.copy()
        vals = np.abs(e[cand])
        pick = np.argpartition(vals, c - k)[c - k:]
        if not ascending:
            return cand[pick]
        keep = np.zeros(c, dtype=bool)
        keep[pick] = True
        return cand[keep]
    idx = nk.topk_abs(e, k, scratch=scratch, rng=rng)
    return np.sort(idx) if ascending else idx


def compensate_threshold(e: np.ndarray, g: np.ndarray, t: float, *, scratch=None,
                         fused: bool | None = None, values: bool = False, clear: bool = False):
    """``e += g`` in place, then the ascending indices with ``|e| >= t`` (:func:`threshold_select`'s result).

    With the compiled loop, one pass; the candidate buffer grows to the
    largest count seen (a count beyond it is found again by
    ``threshold_select`` over the compensated ``e``, once).  ``values``:
    ``(indices, e[indices])`` instead, the values collected in the same pass
    (None where the plain steps ran: then read them from ``e``).  ``clear``
    (with ``values``): the pass also zeroes ``e`` at the indices (the offer
    sent whole, error feedback's update) -- done exactly when the values
    are not None.
    """
    _check(e, g)
    use = enabled() if fused is None else fused
    if use and not _HAVE_NUMBA:
        raise RuntimeError("fused=True needs numba (pip install mpisparse[fast])")
    n = e.shape[0]
    if not use or n <= nk.SMALL_N:
        e += g
        return _with(nk.threshold_select(e, t, scratch=scratch), None, values)
    idt = index_dtype(n)
    tt = nk._ceil_to_dtype(t, e.dtype)
    if tt != tt:  # NaN: nothing is selected
        e += g
        return _with(np.empty(0, dtype=idt), np.empty(0, dtype=e.dtype), values)
    return _collected(lambda cand, cval, clr: _fused_pass(e, g, tt, cand, cval, clr), e, values, clear,
                      lambda: nk.threshold_select(e, t, scratch=scratch))


def _with(idx, vals, values: bool):
    """``idx``, or ``(idx, vals)`` when the caller asked for the values."""
    return (idx, vals) if values else idx


def compensate_topk(e: np.ndarray, g: np.ndarray, k: int, *, rng=None, scratch=None,
                    fused: bool | None = None) -> np.ndarray:
    """``e += g`` in place, then the indices of the ``k`` largest ``|e|`` (exactly ``k``, any order):
    :func:`compensate_candidates` then :func:`topk_from_candidates`."""
    cand = compensate_candidates(e, g, k, rng=rng, fused=fused)
    return topk_from_candidates(e, cand, k, rng=rng, scratch=scratch)


def _use(fused) -> bool:
    use = enabled() if fused is None else fused
    if use and not _HAVE_NUMBA:
        raise RuntimeError("fused=True needs numba (pip install mpisparse[fast])")
    return use


def compensate_momentum(u: np.ndarray, v: np.ndarray, g: np.ndarray, momentum: float, t, cap: int, *,
                        key: int = 0, samples: np.ndarray | None = None, with_values: bool = False,
                        fused: bool | None = None):
    """DGC's momentum correction in place, ``u = m u + g`` then ``v += u`` (``m`` rounded to the dtype,
    the product rounded before the sum, as NumPy's ``u *= m; u += g; v += u``); returns the ascending
    indices with ``|v| >= t`` found on the way (a copy), or None.  ``with_values``: ``(indices, |v| at
    them)`` instead (for :func:`narrow`, which then reads no ``v``).

    ``samples`` (optional, ``v``'s dtype, 1 to ``n`` long): filled with ``|v|`` (the new ``v``) at
    ``stratum_positions(key, n, samples.size)``, on every path; the compiled pass reads them as it goes.
    None when the plain NumPy steps ran (no numba, ``fused`` False, a small vector) or when more than
    ``cap`` entries reached ``t``: ``u`` and ``v`` are updated either way, bit for bit the same.
    """
    _check(v, g)
    _check(u, g)
    n = v.shape[0]
    m = v.dtype.type(momentum)
    if samples is not None and (samples.dtype != v.dtype or samples.ndim != 1 or not 1 <= samples.shape[0] <= n):
        raise ValueError(f"samples has {samples.shape} elements of {samples.dtype}; need 1 to {n} of {v.dtype}")
    if not _use(fused) or n <= nk.SMALL_N:
        u *= m
        u += g
        v += u
        if samples is not None:
            np.abs(v[stratum_positions(key, n, samples.shape[0])], out=samples)
        return None
    cap = max(int(cap), 1)
    cand = _buffers.get(cap, index_dtype(n))
    cval = _buffers.get(cap, v.dtype)
    samp = samples if samples is not None else np.empty(0, dtype=v.dtype)
    c = int(_momentum_pass(u, v, g, m, nk._ceil_to_dtype(t, v.dtype), cand, cval, np.uint64(int(key) % (1 << 64)),
                           samp))
    if c > cap:
        return None
    return (cand[:c].copy(), cval[:c].copy()) if with_values else cand[:c].copy()


def _segment_bounds(starts, sizes, n: int):
    """``(starts, ends)`` as int64 arrays when the segments are ascending, contiguous and cover ``[0, n)``;
    else None (then the plain per-segment steps run)."""
    st = np.asarray(starts, dtype=np.int64)
    en = st + np.asarray(sizes, dtype=np.int64)
    if st.size == 0 or st[0] != 0 or en[-1] != n or np.any(st[1:] != en[:-1]) or np.any(en < st):
        return None
    return st, en


def _plain_segments(x, st, sz, thr, scratch):
    idt = index_dtype(x.shape[0])
    parts = []
    for o, s, t in zip(st, sz, thr):
        o, s = int(o), int(s)
        if s == 0:
            continue
        hit = nk.threshold_select(x[o:o + s], t, scratch=None if scratch is None else scratch[:s])
        if hit.size:
            parts.append(hit.astype(idt, copy=False) + idt(o))
    return np.concatenate(parts) if parts else np.empty(0, dtype=idt)


def segments_threshold(x: np.ndarray, starts, sizes, thresholds, *, scratch=None,
                       fused: bool | None = None) -> np.ndarray:
    """The ascending indices ``i`` of ``x`` with ``|x[i]| >= thresholds[s]`` for the segment ``s``
    (``[starts[s], starts[s] + sizes[s])``) holding ``i``: ``threshold_select`` segment by segment, the
    parts concatenated (segments ascending). With the compiled loop, one read of ``x``. ``scratch``
    (optional): a float buffer the segments reuse one after another, at least as long as the longest
    segment's chunk buffer (the longest segment is always enough)."""
    n = x.shape[0]
    bounds = _segment_bounds(starts, sizes, n) if _use(fused) and n > nk.SMALL_N else None
    if bounds is None:
        return _plain_segments(x, starts, sizes, thresholds, scratch)
    return _collected(lambda cand, _, __: _segments_select_pass(x, *bounds, _thresholds(thresholds, x.dtype), cand),
                      x, False, False, lambda: _plain_segments(x, starts, sizes, thresholds, scratch))


def _thresholds(thresholds, dtype) -> np.ndarray:
    return np.array([nk._ceil_to_dtype(t, dtype) for t in thresholds], dtype=dtype)


def _collected(run, e: np.ndarray, values: bool, clear: bool, again):
    """Run a compiled candidate loop ``run(cand, cval, clear)`` over ``e`` into the growing buffers; returns the
    indices (``values``: with their values, None when ``again()`` gave the indices).  A count beyond the
    buffers grows them for next time, puts back what ``clear`` zeroed (the values held) and takes
    ``again()``, the read-only steps over the compensated ``e``."""
    if clear and not values:
        raise ValueError("clear=True needs values=True (the values are what the cleared entries held)")
    idt = index_dtype(e.shape[0])
    cap = max(_buffers.capacity(idt), 1024)
    cand = _buffers.get(cap, idt)
    cval = _values.get(cap, e.dtype) if values else _NO_VALUES
    c = int(run(cand, cval, clear))
    if c <= cap:
        return _with(cand[:c].copy(), cval[:c].copy() if values else None, values)
    _buffers.get(2 * c, idt)  # room for next time
    if clear:
        e[cand] = cval  # the buffer's candidates, zeroed in the pass, get their values back
    return _with(again(), None, values)


def compensate_segments_threshold(e: np.ndarray, g: np.ndarray, starts, sizes, thresholds, *, scratch=None,
                                  fused: bool | None = None, values: bool = False, clear: bool = False):
    """``e += g`` in place, then :func:`segments_threshold` of ``e``; with the compiled loop, one pass.
    ``values`` and ``clear``: as :func:`compensate_threshold`'s."""
    _check(e, g)
    n = e.shape[0]
    bounds = _segment_bounds(starts, sizes, n) if _use(fused) and n > nk.SMALL_N else None
    if bounds is None:
        e += g
        return _with(_plain_segments(e, starts, sizes, thresholds, scratch), None, values)
    thr = _thresholds(thresholds, e.dtype)
    return _collected(lambda cand, cval, clr: _segments_fused_pass(e, g, *bounds, thr, cand, cval, clr), e, values,
                      clear, lambda: segments_threshold(e, starts, sizes, thresholds, scratch=scratch))


def narrow(x: np.ndarray, idx, t_known, t, values=None):
    """``threshold_select(x, t)`` taken from ``idx``, the ascending indices of every ``|x| >= t_known``
    (:func:`compensate_momentum`'s result): the same indices, or None when ``idx`` may miss some
    (``t`` below ``t_known``, NaN, or ``idx`` None).  ``values``: ``|x[idx]|`` when known (then ``x`` is
    not read)."""
    if idx is None:
        return None
    tc = nk._ceil_to_dtype(t, x.dtype)
    if not nk._ceil_to_dtype(t_known, x.dtype) <= tc:
        return None
    return idx[(np.abs(x[idx]) if values is None else values) >= tc]
