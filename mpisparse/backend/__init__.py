"""Backend layer: array-module dispatch and the selection kernels.

Schemes call the functions here and never branch on a device or a kernel
name.  An array is either a NumPy array (host) or a device array that
exposes ``__cuda_array_interface__`` (CuPy); torch tensors are converted
without a copy through DLPack by :func:`as_array`.

The kernels (``topk_abs``, ``threshold_select``, ``estimate_threshold``,
``randomk``, ``rowwise_topk_mask``, and the segmented ``segment_norms`` and
``segment_topk_abs``) dispatch on the array module of their
input: :data:`_KERNEL_MODULES` names one module per array library that holds
the whole kernel API (:mod:`mpisparse.backend.numpy_kernels`, whose kernels
live in ``numpy_select``/``numpy_segments``/``numpy_segment_topk``); the CuPy
kernels of the GPU path (:mod:`mpisparse.backend.cupy_kernels`) plug in under
the same names.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

_KERNEL_MODULES = {"numpy": "mpisparse.backend.numpy_kernels", "cupy": "mpisparse.backend.cupy_kernels"}


def is_device_array(x: Any) -> bool:
    """True for arrays that live in GPU memory (``__cuda_array_interface__``)."""
    return hasattr(x, "__cuda_array_interface__")


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__")


def array_module(x: Any) -> ModuleType:
    """``numpy`` for host arrays, ``cupy`` for device arrays."""
    if is_device_array(x) and type(x).__module__.startswith("cupy"):
        import cupy  # lazy: only reached with a CuPy array in hand

        return cupy
    return np


def as_array(x: Any):
    """View ``x`` as a NumPy (host) or CuPy (device) array, zero-copy.

    torch tensors go through DLPack, so the returned array shares memory
    with the tensor: writing into it writes into the tensor.
    """
    if isinstance(x, np.ndarray):
        return x
    if is_torch_tensor(x):
        return torch_array_module(x).from_dlpack(x.detach())
    if is_device_array(x):
        return x
    return np.asarray(x)


def torch_array_module(t: Any) -> ModuleType:
    """The array module that views torch tensor ``t``: NumPy for a CPU tensor, CuPy for a CUDA one.

    The one place a tensor's placement picks an array module (tests swap it
    to run the device path on CPU tensors).
    """
    if t.device.type == "cpu":
        return np
    import cupy

    return cupy


def to_torch(x: Any):
    """A torch tensor sharing ``x``'s memory (DLPack for device arrays, ``from_numpy`` on the host)."""
    import torch

    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    return torch.from_dlpack(x)


def to_module(x: Any, xp: ModuleType):
    """``x`` on array module ``xp``: itself when it is there, else one explicit copy (H2D or D2H)."""
    if x is None or array_module(x) is xp:
        return x
    if xp is np:
        return to_host(x)
    return xp.asarray(x)


def unique_count(x: Any) -> int:
    """Distinct values of ``x`` (on its own array module; the count is a shape, no copy to the host).

    Host integer arrays (index sets): a sorted copy and a count of its steps.  NumPy 2.4's ``np.unique``
    of 350,000 int32 indices left 18 MiB resident after it returned (a rank's memory grew by 2 MiB a
    step counting threshold's selection in ``bench step``); the sort leaves nothing."""
    xp = array_module(x)
    if xp is not np or not isinstance(x, np.ndarray) or x.dtype.kind not in "iu":
        return int(xp.unique(x).shape[0])
    if x.size == 0:
        return 0
    s = np.sort(x, axis=None)
    return 1 + int(np.count_nonzero(s[1:] != s[:-1]))


def norm(x: Any) -> float:
    """The L2 norm of ``x`` as a Python float (a device array: one explicit 8-byte read)."""
    return float(array_module(x).linalg.norm(x))


def all_finite(x: Any):
    """Whether every entry of ``x`` is finite, as a 0-d array on ``x``'s array module (no host read)."""
    return array_module(x).isfinite(x).all()


def abs_max(xs) -> float:
    """The largest magnitude over the tensors or arrays ``xs`` (one, or a list), as a Python float: NaN or Inf
    when an entry is not finite (NaN propagates), 0.0 when all are empty; one host read in all.

    One read pass, no temporary as large as ``x``: torch's ``aminmax`` for torch tensors (CPU and CUDA alike)
    and for NumPy arrays (viewed as tensors zero-copy, :func:`to_torch`; NumPy's own ``min`` and ``max``
    without torch); a device array's own module's ``min`` and ``max`` (CuPy: two device reductions, one
    host read). The finite checks of :class:`mpisparse.torch.DistributedOptimizer` (a copy of ``x`` costs
    about four times as much on a CPU; ``|x|.max()`` allocates a vector the size of ``x`` and faults its pages).
    """
    xs = xs if isinstance(xs, (list, tuple)) else [xs]
    try:
        import torch
    except ImportError:
        torch = None
    if len(xs) > 1 and all(is_torch_tensor(x) and x.is_cuda and x.is_floating_point() for x in xs):
        # many GPU tensors (a model's parameters): one fused multi-tensor launch (the inf-norm is max |x|,
        # NaN propagating), not two launches per tensor; on the host aminmax stays (the fused norm is slower)
        ts = [x.detach() for x in xs if x.numel()]
        return float(torch.stack(torch._foreach_norm(ts, float("inf"))).max()) if ts else 0.0
    parts = []  # 0-d values, each on its own array module or torch
    for x in xs:
        if is_torch_tensor(x) or (torch is not None and isinstance(x, np.ndarray)):
            t = x.detach() if is_torch_tensor(x) else to_torch(x)
            if t.numel():
                lo, hi = torch.aminmax(t.reshape(-1))
                parts.append(torch.maximum(-lo, hi))
        elif x.size:
            xp = array_module(x)
            parts.append(xp.maximum(-x.min(), x.max()))
    if not parts:
        return 0.0
    if len(parts) == 1:
        return float(parts[0])
    if all(is_torch_tensor(v) for v in parts):
        return float(torch.stack(parts).max())
    vals = [float(v) for v in parts]  # mixed modules (not a case of the library's): one read each
    return float("nan") if any(v != v for v in vals) else max(vals)


def scatter_sum(out, indices, values, counts, scale: float, *, clear=None) -> None:
    """``out = scale * sum_r sparse(indices_r, values_r)`` on ``out``'s array module.

    ``clear``: on the host, the indices of every non-zero ``out`` holds now
    (what the previous call wrote): only they are zeroed instead of the
    whole vector (a sparse step then never passes over all of ``out``).

    ``counts`` (host integers) splits ``indices``/``values`` into per-rank
    blocks whose indices are distinct, so each block is a plain fancy-index
    add; blocks of different ranks may overlap.  Device arrays use the CuPy
    kernel of the same contract (the same float sums, block by block).
    """
    if is_device_array(out):
        kernels(out).scatter_sum(out, indices, values, counts, scale)
        return
    from . import compiled  # the numba index loops (the same sums), where enabled

    if compiled.scatter_sum(out, indices, values, counts, scale, clear):
        return
    if clear is None:
        out.fill(0)
    else:
        out[clear] = 0
    start = 0
    for c in counts:
        c = int(c)
        if c:
            block = slice(start, start + c)
            out[indices[block]] += values[block]
        start += c
    if scale != 1.0:
        # sum first, then scale (as a reference computes it); duplicates in
        # ``indices`` read and write the same value, so the in-place form is safe
        if 2 * len(indices) < out.size:
            out[indices] *= np.float32(scale)
        else:
            out *= np.float32(scale)


def to_host(x: Any) -> np.ndarray:
    """``x`` as a NumPy array: device arrays are copied to the host, host arrays are viewed."""
    return x.get() if is_device_array(x) and hasattr(x, "get") else np.asarray(x)


def kernels(x: Any) -> ModuleType:
    """The kernel module for the array module of ``x``."""
    name = array_module(x).__name__
    try:
        return importlib.import_module(_KERNEL_MODULES[name])
    except KeyError:
        raise NotImplementedError(
            f"no selection kernels are registered for array module {name!r}; "
            f"available: {', '.join(sorted(_KERNEL_MODULES))}"
        ) from None


def synchronize(x: Any) -> None:
    """Wait for the device work that produces ``x`` (a no-op on the host)."""
    if is_device_array(x) and type(x).__module__.startswith("cupy"):
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def topk_abs(x, k: int, **kw):
    """Indices of the ``k`` entries of largest magnitude (exactly ``k``)."""
    return kernels(x).topk_abs(x, k, **kw)


def threshold_select(x, t: float, *, ordered: bool = False, **kw):
    """Indices of the entries with ``|x| >= t``: ascending on the host (the NumPy kernel's scan), in no
    particular order on a device (atomic appends) unless ``ordered``, which sorts them there only."""
    idx = kernels(x).threshold_select(x, t, **kw)
    if ordered and array_module(idx) is not np:
        idx = array_module(idx).sort(idx)
    return idx


def estimate_threshold(x, k: int, **kw) -> float:
    """Sampled estimate of the ``k``-th largest magnitude."""
    return kernels(x).estimate_threshold(x, k, **kw)


def randomk(n: int, k: int, rng, *, like=None):
    """``k`` distinct indices in ``[0, n)`` drawn from ``rng`` (same seed, same set)."""
    return kernels(like if like is not None else np.empty(0)).randomk(n, k, rng)


def rowwise_topk_mask(x, k: int):
    """Per row of a 2-D array, a boolean mask of the ``k`` largest magnitudes."""
    return kernels(x).rowwise_topk_mask(x, k)


def segment_norms(x, starts, sizes):
    """L2 norm (float64, on the host) of every segment ``x[starts[i]:starts[i] + sizes[i]]``.

    ``starts``/``sizes`` are host integer sequences (any subset of a vector's
    layers, in any order, empty segments allowed: norm 0).  The number of
    kernel calls does not grow with the number of segments.
    """
    return kernels(x).segment_norms(x, starts, sizes)


def segment_topk_abs(x, starts, sizes, ks, **kw):
    """Exactly ``ks[i]`` indices of largest magnitude in every segment, as flat indices into ``x``.

    Grouped by segment in the given order (any order within a segment);
    ``0 <= ks[i] <= sizes[i]``.  The number of kernel calls does not grow
    with the number of segments (see the kernel modules).
    """
    return kernels(x).segment_topk_abs(x, starts, sizes, ks, **kw)


def index_dtype(n: int):
    """The dtype of indices into an ``n``-element array: ``int32`` while they fit, ``int64`` beyond.

    The one place the index width is decided: the kernels (NumPy and CuPy),
    the schemes and the parameter server all ask here.
    """
    return np.int32 if n < 2**31 else np.int64
