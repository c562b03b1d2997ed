"""DEFT's partitioning math as pure functions (no MPI).

Source: D. Yoon and S. Oh, "DEFT: Exploiting Gradient Norm Difference between
Model Layers for Scalable Gradient Sparsification", ICPP 2023.  Every function
below transcribes one pseudocode box of Section 4; the code marks the box's
lines with comments such as ``# Alg. 3 l.7``.

* Alg. 2 (two-stage gradient vector partitioning): :func:`two_stage_partition`.
* Alg. 3 (gradient norm-based local k assignment; the paper's text prints the
  box's caption as "Algorithm 5"): :func:`assign_local_k`.
* Alg. 4 (bin-packing-based layer allocation): :func:`leader` (l.1, l.3),
  :func:`my_part` (l.2), :func:`bin_pack` (l.4-15), :func:`encode_bins` /
  :func:`decode_bins` (the payload of the l.16 broadcast) and l.17 is
  ``decode_bins(...)[my_part(rank, iteration, n_workers)]``.
* Alg. 5 (layer-wise gradient selection) and eq. 4-6 (its cost): in
  :mod:`mpisparse.schemes.deft_selection`.

Decisions the paper leaves open (all deterministic, so that every rank that
runs these functions on the same input gets the same answer):

* Alg. 2 compares ``size > n_g / n_workers`` exactly, as the integer test
  ``size * n_workers > n_g``; a split tensor always yields ``n_workers``
  pieces, so a tensor smaller than ``n_workers`` that is still split (possible
  when ``n_g < n_workers**2``) yields some empty pieces.
* Alg. 3 orders layers by decreasing norm; equal norms keep the lower layer
  index first.  The arithmetic is exact (``fractions.Fraction`` of the given
  floats), and ``k_temp`` is rounded DOWN to an integer before ``max(1, .)``;
  the cap test ``size < k_temp`` uses the unrounded value.  An empty layer
  (size 0) gets k = 0, the only case where the paper's ``max(1, .)`` is
  overridden.  With no cap or floor biting, ``sum(k) == floor(k_total)``.
* Alg. 4 costs a layer ``size * ln(k)``: a layer with k = 1 (or k = 0) costs 0,
  so such layers do not count toward a bin's load and land wherever the
  minimum-cost bin is when they are reached (they are placed last).  Ties in
  cost go to the lower layer index, ties in bin load to the lower bin index,
  exactly as ``list.index(max(...))`` / ``list.index(min(...))`` in the box.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np


__all__ = [
    "Layer",
    "two_stage_partition",
    "split_large",
    "assign_local_k",
    "bin_pack",
    "leader",
    "my_part",
    "encode_bins",
    "decode_bins",
    "layer_cost",
]


# --------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------


def _as_int(value: object, name: str) -> int:
    """Return ``value`` as an int, or raise ValueError if it is not integral."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got the boolean {value!r}.")
    try:
        as_int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be an integer, got {value!r}.") from None
    if as_int != value:
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    return as_int


def _check_workers(n_workers: int) -> int:
    n = _as_int(n_workers, "n_workers")
    if n < 1:
        raise ValueError(f"n_workers must be at least 1, got {n}.")
    return n


def _check_sizes(sizes: Sequence[int], name: str = "sizes") -> list[int]:
    out = []
    for i, s in enumerate(sizes):
        v = _as_int(s, f"{name}[{i}]")
        if v < 0:
            raise ValueError(f"{name}[{i}] must be non-negative (>= 0), got {v}.")
        out.append(v)
    return out


def _check_same_length(a: Sequence, b: Sequence, name_a: str, name_b: str) -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{name_a} and {name_b} must have the same length, got {len(a)} and {len(b)}."
        )


def _check_ks(ks: Sequence[int], sizes: list[int]) -> list[int]:
    _check_same_length(sizes, ks, "sizes", "ks")
    out = []
    for i, k in enumerate(ks):
        v = _as_int(k, f"ks[{i}]")
        if not 0 <= v <= sizes[i]:
            raise ValueError(
                f"ks[{i}] must lie between 0 and the layer size {sizes[i]}, got {v}."
            )
        out.append(v)
    return out


def _check_alloc(alloc: Sequence[Sequence[int]], n_layers: int) -> list[list[int]]:
    seen: dict[int, int] = {}
    out = []
    for b, bin_ in enumerate(alloc):
        row = []
        for x in bin_:
            i = _as_int(x, f"alloc[{b}] entry")
            if not 0 <= i < n_layers:
                raise ValueError(
                    f"alloc[{b}] holds layer index {i}, outside the allowed range "
                    f"0 to {n_layers - 1}."
                )
            if i in seen:
                raise ValueError(
                    f"layer {i} appears in both alloc[{seen[i]}] and alloc[{b}]; "
                    f"each layer must be in at most one bin."
                )
            seen[i] = b
            row.append(i)
        out.append(row)
    return out


# --------------------------------------------------------------------------
# Alg. 2: two-stage gradient vector partitioning
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """One partitioned piece ("layer") of the flat gradient vector.

    ``start`` is ``st_layer`` and ``end`` (exclusive) is ``end_layer`` of
    Alg. 2; ``source`` is the index of the original tensor it came from.
    """

    start: int
    end: int
    source: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(
                f"a Layer needs 0 <= start <= end, got start={self.start}, end={self.end}."
            )

    @property
    def size(self) -> int:
        """Number of gradients in the piece (``end - start``)."""
        return self.end - self.start


def two_stage_partition(tensor_sizes: Sequence[int], n_workers: int) -> list[Layer]:
    """Split a flat gradient vector into layers (DEFT Alg. 2).

    ``tensor_sizes`` are the element counts of the model's tensors in the
    order they are laid out in the flat vector (the first stage, l.1).

    1. tensors <- partition_by_layers(g)  (the caller's ``tensor_sizes``)
    2. thre_part <- n_g / n_workers
    3. layers <- []
    4. alloc_pos <- 0
    5. for each tensor:
    6.   if tensor.size > thre_part (tested exactly as size * n_workers > n_g):
    7.     quotient <- tensor.size // n_workers
    8.     remainder <- tensor.size % n_workers
    9.     for i in range(n_workers):
    10.      size_layer <- quotient
    11-13.   if remainder > 0: size_layer += 1; remainder -= 1
             (so the first ``remainder`` pieces are one larger)
    14-16.   st_layer <- alloc_pos; alloc_pos += size_layer; end_layer <- alloc_pos
    17-18.   append Layer(st_layer, end_layer)
    19.  else:
    20-22. st_layer <- alloc_pos; alloc_pos += tensor.size; end_layer <- alloc_pos
    23-24. append Layer(st_layer, end_layer)

    A split tensor always gives ``n_workers`` pieces, some empty if the tensor
    has fewer than ``n_workers`` elements.  The layers tile ``[0, n_g)``
    contiguously, in order, and each has at most ``ceil(n_g / n_workers)``
    elements.
    """
    n_workers = _check_workers(n_workers)
    sizes = _check_sizes(tensor_sizes, "tensor_sizes")  # Alg. 2 l.1
    n_g = sum(sizes)
    # Alg. 2 l.2: thre_part = n_g / n_workers, kept exact: see l.6.
    layers: list[Layer] = []  # Alg. 2 l.3
    alloc_pos = 0  # Alg. 2 l.4
    for source, size in enumerate(sizes):  # Alg. 2 l.5
        if size * n_workers > n_g:  # Alg. 2 l.6: size > thre_part
            quotient = size // n_workers  # Alg. 2 l.7
            remainder = size % n_workers  # Alg. 2 l.8
            for _ in range(n_workers):  # Alg. 2 l.9
                size_layer = quotient  # Alg. 2 l.10
                if remainder > 0:  # Alg. 2 l.11
                    size_layer += 1  # Alg. 2 l.12
                    remainder -= 1  # Alg. 2 l.13
                st_layer = alloc_pos  # Alg. 2 l.14
                alloc_pos += size_layer  # Alg. 2 l.15
                end_layer = alloc_pos  # Alg. 2 l.16
                layers.append(Layer(st_layer, end_layer, source))  # Alg. 2 l.17-18
        else:  # Alg. 2 l.19
            st_layer = alloc_pos  # Alg. 2 l.20
            alloc_pos += size  # Alg. 2 l.21
            end_layer = alloc_pos  # Alg. 2 l.22
            layers.append(Layer(st_layer, end_layer, source))  # Alg. 2 l.23-24
    return layers


def split_large(layers: Sequence[Layer], max_size: int) -> list[Layer]:
    """Split every layer of more than ``max_size`` elements into near-equal pieces.

    Not in the paper: a refinement of Alg. 2 for the bin packing.  Alg. 2
    cuts a tensor larger than ``n_g / n_workers`` into exactly ``n_workers``
    pieces, which can still be far above the ideal bin load ``n_g /
    n_workers`` (lstm-wt2's embedding at W = 16: pieces of 1.4M elements for
    bins of 3.1M), so Alg. 4 cannot balance the bins.  A layer of ``s >
    max_size`` elements becomes ``ceil(s / max_size)`` contiguous pieces, the
    first ``s % count`` one element larger, all with the layer's ``source``;
    the pieces tile the layer exactly, in order, so the result still tiles
    the vector.  Like Alg. 2's own pieces, each piece is a layer of its own
    for Alg. 3 (its k comes from its own norm, so the layer's k is shared
    among its pieces in proportion to their norms) and for Alg. 4.
    """
    max_size = _as_int(max_size, "max_size")
    if max_size < 1:
        raise ValueError(f"max_size must be at least 1, got {max_size}.")
    out: list[Layer] = []
    for layer in layers:
        s = layer.size
        if s <= max_size:
            out.append(layer)
            continue
        count = -(-s // max_size)
        q, rem = divmod(s, count)
        pos = layer.start
        for i in range(count):
            e = pos + q + (1 if i < rem else 0)
            out.append(Layer(pos, e, layer.source))
            pos = e
    return out


# --------------------------------------------------------------------------
# Alg. 3: gradient norm-based local k assignment
# --------------------------------------------------------------------------


def assign_local_k(
    sizes: Sequence[int], norms: Sequence[float], k_total: float
) -> np.ndarray:
    """Assign a local k to every layer from its gradient norm (DEFT Alg. 3).

    ``sizes[i]`` and ``norms[i]`` are layer i's element count and gradient
    L2 norm; ``k_total`` is ``n_g * d``.  Layers are processed in priority
    order: decreasing norm, equal norms by increasing layer index.

    1. k_remain <- k_total (= n_g * d)
    2-4. norm_remain <- sum of all layer norms
    5. for each layer in priority order:
    6-7.   if norm_remain > 0: k_temp <- k_remain * norm / norm_remain
    8-9.   else: k_temp <- 0
    10-11. if size < k_temp: k <- size            (cap; the excess stays in k_remain)
    12-13. else: k <- max(1, floor(k_temp))       (rounded down, at least 1)
    14.    k_remain <- k_remain - k
    15.    norm_remain <- norm_remain - norm

    Arithmetic is exact (rationals built from the given floats), so the
    result does not depend on float rounding.  Rounding down leaves the
    fractional part in ``k_remain`` for the next layer, so when no cap or
    floor bites ``sum(k) == floor(k_total)``.  The ``max(1, .)`` floor can
    push ``sum(k)`` above ``k_total`` (and ``k_remain`` below 0, after which
    every remaining layer gets k = 1).  An empty layer gets k = 0; otherwise
    ``1 <= k <= size``.

    Returns the k of every layer in the ORIGINAL layer order, as int64.
    """
    size_list = _check_sizes(sizes)
    _check_same_length(size_list, norms, "sizes", "norms")
    norm_list = []
    for i, x in enumerate(norms):
        v = float(x)
        if not math.isfinite(v) or v < 0:
            raise ValueError(
                f"norms[{i}] must be a finite non-negative number (>= 0), got {x!r}."
            )
        norm_list.append(v)
    kt = float(k_total)
    if not math.isfinite(kt) or kt <= 0:
        raise ValueError(f"k_total must be a finite number greater than 0, got {k_total!r}.")

    n = len(size_list)
    # Priority: decreasing norm, ties by lower index (sorted() is stable).
    order = sorted(range(n), key=lambda i: (-norm_list[i], i))
    if isinstance(k_total, (int, np.integer)) or kt.is_integer():
        return _assign_local_k_int(size_list, norm_list, int(kt) if not isinstance(
            k_total, (int, np.integer)) else int(k_total), order)
    exact_norms = [Fraction(v) for v in norm_list]
    if isinstance(k_total, (int, np.integer)):
        k_remain = Fraction(int(k_total))  # Alg. 3 l.1
    else:
        k_remain = Fraction(kt)  # Alg. 3 l.1
    norm_remain = Fraction(0)  # Alg. 3 l.2
    for i in order:  # Alg. 3 l.3
        norm_remain += exact_norms[i]  # Alg. 3 l.4

    ks = np.zeros(n, dtype=np.int64)
    for i in order:  # Alg. 3 l.5
        size, norm = size_list[i], exact_norms[i]
        if norm_remain > 0:  # Alg. 3 l.6
            k_temp = k_remain * norm / norm_remain  # Alg. 3 l.7
        else:
            k_temp = Fraction(0)  # Alg. 3 l.8-9
        if size < k_temp:  # Alg. 3 l.10
            k = size  # Alg. 3 l.11
        else:
            k = max(1, math.floor(k_temp))  # Alg. 3 l.12-13 (rounded down)
            k = min(k, size)  # bites only for an empty layer (size 0 -> k 0)
        ks[i] = k
        k_remain -= k  # Alg. 3 l.14
        norm_remain -= norm  # Alg. 3 l.15
    return ks


def _assign_local_k_int(sizes: list[int], norms: list[float], k_total: int,
                        order: list[int]) -> np.ndarray:
    """Alg. 3 for an integral ``k_total`` in integer arithmetic, same result as the Fraction form.

    Every finite float is ``M * 2**e`` with integers ``M, e``; scaled by
    ``2**-e_min`` all norms become integers ``N_i`` and the scale cancels in
    ``k_temp = k_remain * N_i / N_remain``.  With ``k_remain`` an integer
    (it starts integral and loses integers), l.10's ``size < k_temp`` is
    ``size * N_remain < k_remain * N_i`` and l.12's floor is an integer
    division (Python's ``//`` floors, also for a negative ``k_remain``).
    """
    parts = [v.as_integer_ratio() for v in norms]  # (M, 2**d): denominators are powers of 2
    shift = max((d.bit_length() - 1 for _, d in parts), default=0)
    scaled = [m << (shift - (d.bit_length() - 1)) for m, d in parts]
    k_remain = k_total  # Alg. 3 l.1
    norm_remain = 0  # Alg. 3 l.2
    for i in order:  # Alg. 3 l.3
        norm_remain += scaled[i]  # Alg. 3 l.4
    ks = np.zeros(len(sizes), dtype=np.int64)
    for i in order:  # Alg. 3 l.5
        size, norm = sizes[i], scaled[i]
        if norm_remain > 0:  # Alg. 3 l.6-7: k_temp = k_remain * norm / norm_remain
            num, den = k_remain * norm, norm_remain
        else:  # Alg. 3 l.8-9: k_temp = 0
            num, den = 0, 1
        if size * den < num:  # Alg. 3 l.10: size < k_temp
            k = size  # Alg. 3 l.11
        else:
            k = min(max(1, num // den), size)  # Alg. 3 l.12-13 (rounded down); min: empty layer -> 0
        ks[i] = k
        k_remain -= k  # Alg. 3 l.14
        norm_remain -= norm  # Alg. 3 l.15
    return ks


# --------------------------------------------------------------------------
# Alg. 4: bin-packing-based layer allocation
# --------------------------------------------------------------------------


def leader(iteration: int, n_workers: int) -> int:
    """Rank that runs the bin packing at ``iteration`` (Alg. 4 l.1, l.3).

    1. cycle <- iteration % n_workers
    3. the rank with rank == cycle packs the bins and broadcasts them (l.16)
    """
    n_workers = _check_workers(n_workers)
    iteration = _as_int(iteration, "iteration")
    if iteration < 0:
        raise ValueError(f"iteration must be non-negative (>= 0), got {iteration}.")
    return iteration % n_workers  # Alg. 4 l.1


def my_part(rank: int, iteration: int, n_workers: int) -> int:
    """Index of the bin that ``rank`` takes at ``iteration`` (Alg. 4 l.2, l.17).

    2. curr_part <- (cycle + rank) % n_workers
    17. alloc_part <- alloc_bin[curr_part]
    """
    cycle = leader(iteration, n_workers)  # Alg. 4 l.1
    rank = _as_int(rank, "rank")
    if not 0 <= rank < n_workers:
        raise ValueError(f"rank must lie between 0 and {n_workers - 1}, got {rank}.")
    return (cycle + rank) % n_workers  # Alg. 4 l.2


def layer_cost(size: int, k: int) -> float:
    """Eq. 3: c_x = n_{g,x} * ln(k_x); 0 when k <= 1 (k = 0 selects nothing)."""
    return float(size) * math.log(k) if k >= 1 else 0.0


def bin_pack(sizes: Sequence[int], ks: Sequence[int], n_workers: int,
             cost_model: str = "eq3", layer_overhead: float = 0.0) -> list[list[int]]:
    """Allocate layers to workers' bins by cost (DEFT Alg. 4 l.4-15).

    4. size_bin <- zeros(n_workers)
    5. alloc_bin <- n_workers empty lists
    6-8. cost[i] <- sizes[i] * ln(ks[i])   (natural log; k = 1 -> cost 0)
    9. repeat once per layer:
    10-11. idx_max <- first index of max(cost)       (ties: lowest layer index)
    12.    bin_min <- first index of min(size_bin)   (ties: lowest bin index)
    13.    alloc_bin[bin_min].append(idx_max)
    14.    size_bin[bin_min] += cost[idx_max]
    15.    cost[idx_max] <- -1                       (taken)

    Because every cost is >= 0, lines 10-11 and 15 visit the layers in a
    stable sort by decreasing cost; the code does that and keeps the bins in
    a heap of ``(load, bin)``, which picks the same bin as line 12.  Layers
    with k = 1 cost 0: they add nothing to a bin's load and are placed last.

    ``cost_model="size"`` replaces line 6-8's cost by ``sizes[i] +
    layer_overhead`` (0 when ``ks[i] == 0``): the cost of a selection kernel
    that makes one pass over the layer whatever its k (this project's
    segmented top-k), plus a fixed per-layer cost in element units; eq. 3's
    ``ln k`` factor misjudges that kernel's time.  The rest of the box is
    unchanged.

    Returns ``alloc_bin``: ``n_workers`` lists of layer indices, each in the
    order the layers were placed.  Bins may be empty (fewer layers than
    workers).
    """
    n_workers = _check_workers(n_workers)
    size_list = _check_sizes(sizes)
    k_list = _check_ks(ks, size_list)
    n = len(size_list)
    alloc_bin: list[list[int]] = [[] for _ in range(n_workers)]  # Alg. 4 l.5
    size_bin = [(0.0, b) for b in range(n_workers)]  # Alg. 4 l.4, as a heap
    if cost_model == "eq3":
        cost = [layer_cost(size_list[i], k_list[i]) for i in range(n)]  # Alg. 4 l.6-8
    elif cost_model == "size":
        ov = float(layer_overhead)
        if not math.isfinite(ov) or ov < 0:
            raise ValueError(f"layer_overhead must be a finite number >= 0, got {layer_overhead!r}.")
        cost = [float(size_list[i]) + ov if k_list[i] > 0 else 0.0 for i in range(n)]
    else:
        raise ValueError(f"cost_model must be 'eq3' or 'size', got {cost_model!r}.")
    by_cost = sorted(range(n), key=lambda i: (-cost[i], i))  # Alg. 4 l.9-11, 15
    for idx_max in by_cost:  # Alg. 4 l.9
        val_max = cost[idx_max]  # Alg. 4 l.10
        load, bin_min = heapq.heappop(size_bin)  # Alg. 4 l.12
        alloc_bin[bin_min].append(idx_max)  # Alg. 4 l.13
        heapq.heappush(size_bin, (load + val_max, bin_min))  # Alg. 4 l.14
    return alloc_bin


def encode_bins(alloc: Sequence[Sequence[int]], n_layers: int) -> np.ndarray:
    """Flatten ``alloc_bin`` to the Alg. 4 l.16 broadcast payload.

    Returns an int32 array of length ``n_layers`` whose entry i is the bin
    holding layer i (4 bytes per layer, the paper's 4L-byte payload).  Every
    layer must be in exactly one bin.  The order of layers within a bin is
    not kept; :func:`decode_bins` lists each bin in increasing layer index.
    """
    n_layers = _as_int(n_layers, "n_layers")
    if n_layers < 0:
        raise ValueError(f"n_layers must be non-negative (>= 0), got {n_layers}.")
    if len(alloc) > np.iinfo(np.int32).max:
        raise ValueError(f"alloc has {len(alloc)} bins, more than int32 can number.")
    rows = _check_alloc(alloc, n_layers)
    out = np.full(n_layers, -1, dtype=np.int32)
    for b, row in enumerate(rows):
        out[row] = b
    missing = np.flatnonzero(out < 0)
    if missing.size:
        raise ValueError(
            f"every layer 0 to {n_layers - 1} must be in a bin, but layer "
            f"{int(missing[0])} is in none."
        )
    return out


def decode_bins(arr: np.ndarray, n_workers: int) -> list[list[int]]:
    """Inverse of :func:`encode_bins`: ``n_workers`` lists of layer indices.

    Each bin lists its layers in increasing index order.
    """
    n_workers = _check_workers(n_workers)
    a = np.asarray(arr)
    if a.ndim != 1:
        raise ValueError(f"arr must be one-dimensional, got shape {a.shape}.")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"arr must hold integers, got dtype {a.dtype}.")
    bad = np.flatnonzero((a < 0) | (a >= n_workers))
    if bad.size:
        raise ValueError(
            f"arr[{int(bad[0])}] = {int(a[bad[0]])} is not a bin index; "
            f"allowed range is 0 to {n_workers - 1}."
        )
    alloc: list[list[int]] = [[] for _ in range(n_workers)]
    for i, b in enumerate(a.tolist()):
        alloc[b].append(i)
    return alloc
