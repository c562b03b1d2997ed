"""CPU (NumPy) selection kernels: threshold_select, topk_abs, estimate_threshold, randomk, rowwise_topk_mask.

Also the tunables and helpers that the segmented kernels (:mod:`.numpy_segments`,
:mod:`.numpy_segment_topk`) and the CuPy kernels share with these: the
sample sizing (:func:`sample_plan`), the argument checks, the default
generator.

All kernels take a 1-D floating-point array ``x`` (float32 usually), never
write into it, and return indices of :func:`mpisparse.backend.index_dtype`
(``int32`` while ``x.size < 2**31``, ``int64`` beyond).  ``scratch``, where accepted, is an optional
preallocated float array of ``x``'s dtype (``x``'s size is always enough)
that the kernel may overwrite, so that a training loop allocates nothing
large per call.

How the fast paths work
-----------------------
``threshold_select`` walks ``x`` in chunks of :data:`CHUNK` elements
(512 KiB of float32, which stays in L2): per chunk ``|x|`` goes into a slice
of the scratch buffer, ``>= t`` into a small boolean buffer, and
``np.flatnonzero`` collects the hits.  Chunking keeps the intermediates in
cache, so the whole selection costs about one streaming read of ``x``
(measured on a 25M float32 vector: ~7 ms chunked, ~10 ms as three full-size
passes; a fresh ``np.abs(x)`` is ~7 ms).

``topk_abs`` is exact.  It draws a small random sample of ``|x|`` (with
replacement), takes as threshold ``t`` the sample's ``r``-th largest value,
with ``r`` the expected number of sampled top-k elements plus a safety
margin of about 4 standard deviations, so that ``t`` lies a little *below*
the true k-th largest magnitude.  One chunked ``threshold_select`` pass
collects the candidates ``|x| >= t``; if there are at least ``k`` of them
the top k of the candidates are the global top k (every non-candidate is
``< t``), found with ``np.argpartition`` on the candidates only.  If there
are fewer than ``k`` (rare: the margin makes it a ~1e-5 event) the rank is
raised and the pass retried; after :data:`MAX_RETRIES` failed passes, or
when the threshold degenerates to 0 (mostly-zero input), it falls back to a
full ``np.argpartition`` of ``|x|``.  The result is therefore always the
exact top k; the ``rng`` only affects speed.

NaN: the threshold paths never select NaN, the full-argpartition fallback
ranks NaN as the largest magnitude.  Exactly ``k`` distinct indices are
returned either way, but inputs are expected to be NaN-free.
"""

from __future__ import annotations

import math

import numpy as np

from . import index_dtype  # the one place the index width is decided

#: Elements per chunk of the streaming passes (1 << 17 measured fastest for
#: float32 on a 1 MiB-L2 core; 64K..256K are all within ~10 %).
CHUNK = 1 << 17

#: Below this size ``topk_abs`` skips the sampling and runs a full
#: ``np.argpartition`` (it is as fast there, and simpler).
SMALL_N = 1 << 16

#: Densities above this use a full ``np.argpartition`` directly: the candidate
#: set would be a large part of ``x`` anyway.
DENSE_FRACTION = 0.25

#: Threshold passes before ``topk_abs`` falls back to a full argpartition.
MAX_RETRIES = 3

# Sample sizing for topk_abs: aim at ~_SAMPLE_HITS sampled top-k elements,
# within [_SAMPLE_MIN, _SAMPLE_MAX] samples, never more than n / 8.
_SAMPLE_HITS = 32
_SAMPLE_MIN = 8192
_SAMPLE_MAX = 1 << 16
_MARGIN_SIGMAS = 4.0
_MARGIN_EXTRA = 4

_default_rng: np.random.Generator | None = None


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def kth_largest(a: np.ndarray, k: int):
    """The ``k``-th largest entry of the 1-D ``a`` (``1 <= k <= a.size``), found by selection, not a sort."""
    m = a.shape[0]
    return np.partition(a, m - k)[m - k]


def sample_plan(n: int, k: int) -> tuple[int, int]:
    """``(m, r)`` of a sampled top-k: draw ``m`` entries, start at the ``r``-th largest sampled ``|x|``.

    ``m`` aims at ``_SAMPLE_HITS`` sampled top-k elements, within
    ``[_SAMPLE_MIN, _SAMPLE_MAX]`` and never above ``n / 8``; ``r`` is the
    expected number of sampled top-k elements plus a safety margin, so the
    first threshold usually lies just below the k-th largest magnitude.
    Shared by the NumPy and CuPy kernels.
    """
    m = int(math.ceil(_SAMPLE_HITS * n / k))
    m = max(_SAMPLE_MIN, min(_SAMPLE_MAX, m))
    m = max(1, min(m, n // 8))
    lam = m * k / n  # expected number of sampled top-k elements
    return m, max(1, int(math.ceil(lam + _MARGIN_SIGMAS * math.sqrt(lam) + _MARGIN_EXTRA)))


def lowered_rank(r: int, k: int, found: int) -> int:
    """The next sample rank after a threshold that found only ``found < k`` candidates.

    The threshold was above the k-th magnitude: scale the rank by the
    observed shortfall, with room to spare.
    """
    return int(math.ceil(r * 2.0 * k / max(found, 1))) + 16


def _as_1d_float(x, xp=np):
    """``x`` as a 1-D real float array of the array module ``xp`` (integers widened to float64)."""
    x = xp.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D array, got shape {x.shape}")
    if x.dtype.kind != "f":
        if x.dtype.kind in "biu":
            x = x.astype(np.float64)
        else:
            raise TypeError(f"expected a real floating-point array, got dtype {x.dtype}")
    return x


def _check_k(k, n: int) -> int:
    k = int(k)
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")
    return k


def _get_rng(rng) -> np.random.Generator:
    global _default_rng
    if rng is None:
        if _default_rng is None:
            _default_rng = np.random.default_rng()
        return _default_rng
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def _ceil_to_dtype(t, dtype) -> np.generic:
    """Smallest value of ``dtype`` that is ``>= t``.

    ``v >= t`` (exact) and ``v >= _ceil_to_dtype(t)`` then agree for every
    ``v`` of ``dtype``; a plain cast rounds to nearest and would wrongly admit
    the value just below ``t`` when ``t`` rounds down.
    """
    ft = dtype.type
    if dtype.itemsize > 8:  # long double: no wider type to compare in
        return ft(t)
    tf = float(t)
    if dtype.itemsize >= 4 and -3.0e38 < tf < 3.0e38:  # finite in float32/64: no overflow to silence
        tc = ft(tf)
        return np.nextafter(tc, ft(np.inf)) if float(tc) < tf else tc
    with np.errstate(over="ignore", invalid="ignore"):
        tc = ft(tf)
        # Compare as Python floats (float64): comparing the numpy scalar with
        # a Python float would cast the float down to dtype first (NEP 50).
        if float(tc) < tf:  # rounded down (False for NaN)
            tc = np.nextafter(tc, ft(np.inf))
    return tc


def _chunk_buffer(x: np.ndarray, scratch, size: int) -> np.ndarray:
    """A float buffer of at least ``size`` elements of ``x.dtype``."""
    if scratch is None:
        return np.empty(size, dtype=x.dtype)
    if not isinstance(scratch, np.ndarray) or scratch.ndim != 1:
        raise ValueError("scratch must be a 1-D NumPy array")
    if scratch.dtype != x.dtype:
        raise ValueError(f"scratch dtype {scratch.dtype} does not match x dtype {x.dtype}")
    if scratch.size < size:
        raise ValueError(f"scratch has {scratch.size} elements, need at least {size}")
    if not scratch.flags.writeable:
        raise ValueError("scratch must be writeable")
    if np.may_share_memory(scratch, x):
        raise ValueError("scratch must not overlap x")
    return scratch


def _select_ge(x: np.ndarray, t, fbuf: np.ndarray, idt) -> np.ndarray:
    """Ascending indices ``i`` with ``|x[i]| >= t`` (``t`` of x's dtype)."""
    n = x.shape[0]
    c = min(n, CHUNK)
    bbuf = np.empty(c, dtype=np.bool_)
    ab, ge, fnz = np.abs, np.greater_equal, np.flatnonzero
    parts = []
    for st in range(0, n, c):
        xc = x[st : st + c]
        m = xc.shape[0]
        hits = fnz(ge(ab(xc, out=fbuf[:m]), t, out=bbuf[:m]))
        if hits.size:
            if st:
                hits += st
            parts.append(hits)
    if not parts:
        return np.empty(0, dtype=idt)
    if len(parts) == 1:
        return parts[0].astype(idt, copy=False)
    return np.concatenate(parts).astype(idt, copy=False)


def _fast_select_ge(x: np.ndarray, t, cap: int, idt):
    """The compiled candidate pass (:func:`mpisparse.backend.compiled.select_ge`: one read of ``x``) when numba
    is enabled, else None (then :func:`_select_ge`, the same indices, runs).  Imported on the first selection:
    a rank that selects nothing does not import numba before its first step."""
    from . import compiled  # the optional numba loops (imports nothing of the package)

    return compiled.select_ge(x, t, cap, idt)


def _full_topk(x: np.ndarray, k: int, scratch, idt) -> np.ndarray:
    n = x.shape[0]
    if scratch is not None and scratch.size >= n:
        a = np.abs(x, out=scratch[:n])
    else:
        a = np.abs(x)
    return np.argpartition(a, n - k)[n - k :].astype(idt, copy=False)


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


def threshold_select(x, t, *, scratch=None) -> np.ndarray:
    """Indices ``i`` with ``|x[i]| >= t``, ascending.

    One chunked pass over ``x``.  ``t`` is compared exactly (a float64 ``t``
    against float32 data is rounded *up* to float32, never to nearest).
    ``t <= 0`` selects every non-NaN entry; ``t`` NaN selects nothing.
    """
    x = _as_1d_float(x)
    n = x.shape[0]
    idt = index_dtype(n)
    if n == 0:
        return np.empty(0, dtype=idt)
    fbuf = _chunk_buffer(x, scratch, min(n, CHUNK))
    return _select_ge(x, _ceil_to_dtype(t, x.dtype), fbuf, idt)


def topk_abs(x, k, *, scratch=None, rng=None) -> np.ndarray:
    """Exact top-k by magnitude: exactly ``k`` distinct indices, any order.

    The ``|x|`` at the returned indices are the ``k`` largest (on ties any
    choice among the tied entries, still exactly ``k``).  ``k`` in ``[0, n]``.
    ``rng`` (a ``np.random.Generator``, a seed, or ``None``) drives the
    threshold sample and only affects speed, never the result's value set.
    """
    x = _as_1d_float(x)
    n = x.shape[0]
    k = _check_k(k, n)
    idt = index_dtype(n)
    if k == 0:
        return np.empty(0, dtype=idt)
    if k == n:
        return np.arange(n, dtype=idt)
    if scratch is not None:
        _chunk_buffer(x, scratch, min(n, CHUNK))  # validate early
    if n <= SMALL_N or k > DENSE_FRACTION * n:
        return _full_topk(x, k, scratch, idt)

    rng = _get_rng(rng)
    m, r = sample_plan(n, k)
    samp = x[rng.integers(0, n, size=m)]
    np.abs(samp, out=samp)

    fbuf = _chunk_buffer(x, scratch, min(n, CHUNK))
    for _ in range(MAX_RETRIES):
        if r >= m:
            break
        t = kth_largest(samp, r)  # r-th largest sampled |x|
        if not t > 0:  # 0 (mostly-zero input: everything is a candidate) or NaN
            break
        cand = _fast_select_ge(x, t, 4 * k + 1024, idt)
        if cand is None:
            cand = _select_ge(x, t, fbuf, idt)
        c = cand.shape[0]
        if c >= k:
            if c == k:
                return cand.astype(idt, copy=True)  # the fast pass's result is a reused buffer
            vals = x[cand]
            np.abs(vals, out=vals)
            sel = np.argpartition(vals, c - k)[c - k :]
            return cand[sel].astype(idt, copy=False)
        r = lowered_rank(r, k, c)  # too few candidates: lower the threshold
    return _full_topk(x, k, scratch, idt)


def estimate_threshold(x, k, *, sample=0.01, rng=None) -> float:
    """DGC-style estimate of the k-th largest ``|x|``.

    Draws ``m = round(sample * n)`` entries of ``x`` at random (with
    replacement; all of ``x`` exactly when ``m >= n``) and returns the
    ``round(k * m / n)``-th largest sampled magnitude (at least the 1st).
    ``k == 0`` gives ``inf``.  An estimate: ``threshold_select(x, t)`` returns
    about ``k`` indices, not exactly ``k``.
    """
    x = _as_1d_float(x)
    n = x.shape[0]
    k = _check_k(k, n)
    if not 0.0 < sample <= 1.0:
        raise ValueError(f"sample must be in (0, 1], got {sample}")
    if k == 0:
        return math.inf
    m = max(1, int(round(sample * n)))
    if m >= n:
        m = n
        a = np.abs(x)
    else:
        a = x[_get_rng(rng).integers(0, n, size=m)]
        np.abs(a, out=a)
    ks = min(m, max(1, int(round(k * m / n))))
    return float(kth_largest(a, ks))


def randomk(n, k, rng) -> np.ndarray:
    """``k`` distinct indices uniform in ``[0, n)``, ascending.

    Deterministic given ``rng``: generators in the same state (same seed,
    same previous draws) give the same indices on every process.  ``rng`` is
    a ``np.random.Generator`` (an int seed is accepted too).
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    k = _check_k(k, n)
    if rng is None:
        raise ValueError("randomk needs an explicit rng (same seed on every process)")
    rng = _get_rng(rng)
    idt = index_dtype(n)
    if k == 0:
        return np.empty(0, dtype=idt)
    idx = rng.choice(n, size=k, replace=False, shuffle=False)
    idx.sort()
    return idx.astype(idt, copy=False)


def rowwise_topk_mask(X, k) -> np.ndarray:
    """Boolean mask of ``X``'s shape: per row, the ``k`` largest ``|X|``.

    Exactly ``k`` entries per row are True (ties broken arbitrarily).
    """
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {X.shape}")
    rows, cols = X.shape
    k = _check_k(k, cols)
    if k == 0:
        return np.zeros(X.shape, dtype=np.bool_)
    if k == cols:
        return np.ones(X.shape, dtype=np.bool_)
    a = np.abs(X)
    idx = np.argpartition(a, cols - k, axis=1)[:, cols - k :]
    mask = np.zeros(X.shape, dtype=np.bool_)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask
