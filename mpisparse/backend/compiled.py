"""The loops compiled by numba (optional: ``pip install mpisparse[fast]``) and the switch that enables them.

Two loops over a float vector, each collecting the indices whose magnitude
reaches a threshold into a bounded buffer (the count is returned even when
it exceeds the buffer): :func:`_fused_pass` first adds the gradient into
the residual (``e += g``), :func:`_select_pass` only reads. Each walks the
vector in blocks of :data:`_BLOCK` and counts a block's hits before
collecting them; the count vectorises (a max reduction would not without
fast-math), so the read-only pass runs at about the speed of a read of the
vector. :mod:`mpisparse.backend.fused` builds the fused compensation +
selection on them, :func:`mpisparse.backend.numpy_kernels.topk_abs` its
candidate pass (:func:`select_ge`). This module imports nothing of the
package, so both can use it.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["available", "enabled", "select_ge"]

#: elements per block of the loops: a block's hits are counted (one vectorised loop) before any is collected
_BLOCK = 64

try:  # optional: the compiled loop
    import numba

    @numba.njit(cache=True, nogil=True)
    def _fused_pass(e, g, t, cand):  # pragma: no cover - compiled
        n = e.shape[0]
        cap = cand.shape[0]
        c = 0
        full = n - n % _BLOCK
        for b in range(0, full, _BLOCK):
            hits = 0
            for j in range(b, b + _BLOCK):  # add, store and count the hits: one vectorised loop
                v = e[j] + g[j]
                e[j] = v
                hits += abs(v) >= t
            if hits:
                for j in range(b, b + _BLOCK):
                    if abs(e[j]) >= t:
                        if c < cap:
                            cand[c] = j
                        c += 1
        for j in range(full, n):
            v = e[j] + g[j]
            e[j] = v
            if abs(v) >= t:
                if c < cap:
                    cand[c] = j
                c += 1
        return c

    @numba.njit(cache=True, nogil=True)
    def _select_pass(x, t, cand):  # pragma: no cover - compiled
        n = x.shape[0]
        cap = cand.shape[0]
        c = 0
        full = n - n % _BLOCK
        for b in range(0, full, _BLOCK):
            hits = 0
            for j in range(b, b + _BLOCK):  # a count of the hits vectorises (a max reduction does not)
                hits += abs(x[j]) >= t
            if hits:
                for j in range(b, b + _BLOCK):
                    if abs(x[j]) >= t:
                        if c < cap:
                            cand[c] = j
                        c += 1
        for j in range(full, n):
            if abs(x[j]) >= t:
                if c < cap:
                    cand[c] = j
                c += 1
        return c

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
    """Candidate index buffers, reused across calls (keyed by index dtype and capacity)."""

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


def select_ge(x: np.ndarray, t, cap: int, idt):
    """Ascending indices with ``|x| >= t`` (``t`` of x's dtype) found by the compiled read-only pass, or None
    (not enabled, or more than ``cap`` of them). The result is a view of a reused buffer: copy it to keep it."""
    if not enabled() or x.ndim != 1 or x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous:
        return None
    cand = _buffers.get(cap, idt)
    c = int(_select_pass(x, t, cand))
    return cand[:c] if c <= cap else None
