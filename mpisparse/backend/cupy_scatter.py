"""GPU (CuPy) helpers of the sparse exchanges (no NumPy counterpart in the kernel API).

:func:`scatter_sum` (the contract of :func:`mpisparse.schemes.base.scatter_sum`,
block by block without atomics, so the float sums equal NumPy's),
:func:`scatter_add` (atomic, duplicates allowed) and :func:`gather_clear`
(take the sent values out of an error-feedback memory in one pass).
"""

from __future__ import annotations

import numpy as np

from .cupy_launch import BLOCK, _cupy, _grid, _in, _kernel, _tn


def _index_arg(cp, indices):
    idx = cp.asarray(indices)
    if idx.dtype not in (np.int32, np.int64):
        idx = idx.astype(np.int64)
    return cp.ascontiguousarray(idx)


def _float_out(out) -> None:
    if out.dtype not in (np.float32, np.float64) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a contiguous float32/float64 CuPy array, got {out.dtype}")


def scatter_sum(out, indices, values, counts, scale: float) -> None:
    """``out = scale * sum_r sparse(indices_r, values_r)``, in place (:func:`mpisparse.schemes.base.scatter_sum`).

    ``counts`` splits ``indices``/``values`` into per-rank blocks whose
    indices are distinct; blocks are added one after another without atomics,
    so every entry is summed in rank order as the NumPy version does.
    Indices and values may arrive on the host (they are copied).
    """
    cp = _cupy()
    _float_out(out)
    idx = _index_arg(cp, indices)
    vals = cp.ascontiguousarray(cp.asarray(values).astype(out.dtype, copy=False))
    out.fill(0)
    kern = _kernel("scatter.cu", f"scatter_add_distinct_{_tn(out.dtype)}_{_in(idx.dtype)}")
    start = 0
    for c in counts:
        c = int(c)
        if c:
            kern(_grid(c), (BLOCK,), (out, idx[start:start + c], vals[start:start + c], np.int64(c)))
        start += c
    if scale != 1.0:
        if 2 * idx.size < out.size:  # duplicates gather and write back the same value: scaled once
            tmp = out[idx]
            tmp *= np.float32(scale)
            out[idx] = tmp
        else:
            out *= np.float32(scale)


def scatter_add(out, indices, values) -> None:
    """``out[indices[i]] += values[i]`` with atomics: duplicate indices all count (sum order not fixed)."""
    cp = _cupy()
    _float_out(out)
    idx = _index_arg(cp, indices)
    vals = cp.ascontiguousarray(cp.asarray(values).astype(out.dtype, copy=False))
    if idx.size != vals.size:
        raise ValueError(f"{idx.size} indices but {vals.size} values")
    if idx.size:
        _kernel("scatter.cu", f"scatter_add_atomic_{_tn(out.dtype)}_{_in(idx.dtype)}")(
            _grid(idx.size), (BLOCK,), (out, idx, vals, np.int64(idx.size)))


def gather_clear(acc, indices):
    """``vals = acc[indices]; acc[indices] = 0`` in one pass (indices distinct); returns ``vals``."""
    cp = _cupy()
    _float_out(acc)
    idx = _index_arg(cp, indices)
    vals = cp.empty(idx.size, dtype=acc.dtype)
    if idx.size:
        _kernel("scatter.cu", f"gather_clear_{_tn(acc.dtype)}_{_in(idx.dtype)}")(
            _grid(idx.size), (BLOCK,), (acc, idx, vals, np.int64(idx.size)))
    return vals

