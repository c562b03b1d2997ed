"""DEFT's layer-wise selection as pure functions (no MPI): Alg. 5 as a NumPy reference, and its cost (eq. 4-6).

Source: D. Yoon and S. Oh, "DEFT: Exploiting Gradient Norm Difference between
Model Layers for Scalable Gradient Sparsification", ICPP 2023.  The
partitioning boxes (Alg. 2-4) are :mod:`mpisparse.schemes.deft_partition`.

* Alg. 5 (layer-wise gradient selection): :func:`layerwise_topk` (the fast
  form the scheme runs is :func:`mpisparse.schemes.deft.select_layers`).
* Eq. 4 (per-worker selection cost): :func:`selection_cost`; eq. 6 (predicted
  speedup over a whole-vector Top-k): :func:`predicted_speedup`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..backend import index_dtype
from .deft_partition import Layer, _as_int, _check_alloc, _check_ks, _check_sizes, layer_cost

__all__ = ["layerwise_topk", "selection_cost", "predicted_speedup"]


# --------------------------------------------------------------------------
# Alg. 5: layer-wise gradient selection
# --------------------------------------------------------------------------


def layerwise_topk(
    grad: np.ndarray,
    layers: Sequence[Layer],
    ks: Sequence[int],
    alloc_part: Sequence[int],
) -> tuple[np.ndarray, int]:
    """Select the top-k gradients of each allocated layer (DEFT Alg. 5).

    1. k <- 0
    2. indices <- []
    3. for part in alloc_part:
    4.   part_idx <- topk(|grads of layers[part]|, ks[part])
    5.   part_idx <- part_idx + layers[part].st_layer
    6.   indices.extend(part_idx)
    7.   k <- k + ks[part]

    A numpy reference: within a layer the indices come by decreasing
    magnitude, equal magnitudes by lower index.  Returns ``(indices, k)``
    with indices into the flat ``grad`` of ``backend.index_dtype(grad.size)``.
    """
    g = np.asarray(grad)
    if g.ndim != 1:
        raise ValueError(f"grad must be one-dimensional, got shape {g.shape}.")
    sizes = [layer.size for layer in layers]
    k_list = _check_ks(ks, sizes)
    for i, layer in enumerate(layers):
        if layer.end > g.size:
            raise ValueError(
                f"layers[{i}] ends at {layer.end}, past the gradient's length {g.size}."
            )
    parts = _check_alloc([alloc_part], len(layers))[0]
    idt = index_dtype(g.size)
    if not parts:
        return np.zeros(0, dtype=idt), 0
    # Alg. 5 l.3-7 for all parts at once (no per-layer loop): one stable
    # lexsort of the parts' entries by (part, -|grad|, index), then the first
    # ks[part] of every part.
    p = np.asarray(parts, dtype=np.int64)
    span = np.array([(layers[x].start, layers[x].size) for x in parts], dtype=np.int64)
    st, sz = span[:, 0], span[:, 1]
    kk = np.asarray(k_list, dtype=np.int64)[p]
    vend = np.cumsum(sz)
    vstart = vend - sz
    gi = np.arange(int(vend[-1]), dtype=np.int64) + np.repeat(st - vstart, sz)  # the parts' flat indices
    pos = np.repeat(np.arange(p.size), sz)
    order = np.lexsort((gi, -np.abs(g[gi]), pos))  # Alg. 5 l.4: decreasing magnitude, ties by lower index
    kend = np.cumsum(kk)
    first = np.arange(int(kend[-1]), dtype=np.int64) + np.repeat(vstart - (kend - kk), kk)
    indices = gi[order[first]].astype(idt)  # Alg. 5 l.5-6 (flat indices: l.5's offset included)
    return indices, int(kk.sum())  # Alg. 5 l.7


# --------------------------------------------------------------------------
# Eq. 4-6: cost model
# --------------------------------------------------------------------------


def selection_cost(
    sizes: Sequence[int], ks: Sequence[int], alloc: Sequence[Sequence[int]]
) -> np.ndarray:
    """Eq. 4: C_i = sum over worker i's layers x of n_{g,x} * ln(k_x).

    Returns one float64 per bin of ``alloc`` (0 for an empty bin).
    """
    size_list = _check_sizes(sizes)
    k_list = _check_ks(ks, size_list)
    rows = _check_alloc(alloc, len(size_list))
    return np.array(
        [sum(layer_cost(size_list[x], k_list[x]) for x in row) for row in rows],
        dtype=np.float64,
    )


def predicted_speedup(
    n_g: int,
    k: float,
    sizes: Sequence[int],
    ks: Sequence[int],
    alloc: Sequence[Sequence[int]],
) -> float:
    """Eq. 6: f(n) = n_g ln(k) / max_i C_i (eq. 5), DEFT's speedup over Top-k.

    ``n_g`` and ``k`` are the whole vector's size and global k.  Returns
    ``inf`` when every bin costs 0 but ``n_g ln(k) > 0``.
    """
    n_g = _as_int(n_g, "n_g")
    if n_g < 0:
        raise ValueError(f"n_g must be non-negative (>= 0), got {n_g}.")
    kf = float(k)
    if not math.isfinite(kf) or kf < 1:
        raise ValueError(f"k must be a finite number of at least 1, got {k!r}.")
    costs = selection_cost(sizes, ks, alloc)
    if len(costs) == 0:
        raise ValueError("alloc must have at least one bin, got none.")
    numerator = n_g * math.log(kf)
    c_max = float(costs.max())  # eq. 5
    if c_max == 0.0:
        if numerator == 0.0:
            raise ValueError(
                "the speedup is 0/0: both n_g*ln(k) and every bin's cost are 0."
            )
        return math.inf
    return numerator / c_max
