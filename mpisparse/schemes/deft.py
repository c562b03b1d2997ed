"""``deft``: distributed execution of fragmented top-k (DEFT, Yoon & Oh, ICPP 2023).

Source: D. Yoon and S. Oh, "DEFT: Exploiting Gradient Norm Difference between
Model Layers for Scalable Gradient Sparsification", ICPP 2023.  The
partitioning math is in :mod:`mpisparse.schemes.deft_partition` (pure functions, one
per pseudocode box); this module wires it into Alg. 1 and adds the fast
selection of Alg. 5.

Once, at construction
    Alg. 2 (two-stage partitioning): the fusion layout's tensors
    (``layout.layers``) are split into "layers"; a tensor larger than
    ``n / W`` becomes ``W`` pieces.  Depends only on the layout and ``W``.

Every step, on every rank (Alg. 1 with ``Sparsify`` = Alg. 3-5)
    1. Alg. 1 l.5: ``acc = e + g`` (phase ``compensate``).
    2. Alg. 3: the L2 norm of every layer of ``acc``, then the layer's local
       k from the norms, ``k_total = k = round(density * n)``
       (phase ``select``; with the compiled pass the norms are summed while
       step 1 writes ``acc``, in ``compensate``: one pass instead of two).
    3. Alg. 4 l.1-15: the leader ``t mod W`` packs the layers into ``W``
       bins by cost ``n_x ln k_x`` (highest cost to the least-loaded bin),
       from its own norms and k (phase ``select``, leader only).
    4. Alg. 4 l.16: the leader broadcasts the bins, int32, one entry per
       layer (its bin), ``4 L`` bytes (phase ``exchange_indices``).
       Steps 3-4 run only under the paper's cost model (``PACK_COST =
       "eq3"``).  Under this project's default, ``"size"``, a layer's cost
       is its size (plus a fixed per-layer cost) whatever its k, so the bins
       depend on the layout and ``W`` alone: every rank packs them once, at
       construction, and gets the leader's bins without the Bcast (see
       "Bins without a broadcast" below).
    5. Alg. 4 l.17 and Alg. 5: rank ``r`` takes bin ``(t + r) mod W`` and
       runs top-k only in those layers, with its OWN local k per layer
       (phase ``select``).  With the compiled pass and fixed bins, the rank
       knows its layers before step 1, so step 1's pass also collects their
       candidates (a threshold per layer from a sample of ``e + g``, sized
       for the last step's k plus a quarter: this step's k needs every
       layer's norm, known only after the pass); Alg. 5 then picks each
       layer's top k among them, and a layer whose candidates fall short of
       its k is selected again from ``acc`` (the result never depends on
       the guess: ``tests/test_deft.py``).  The rank's share is then read
       once per step, not twice.
    6. Alg. 1 l.7: Allgatherv of the index sets (counts first; sets of
       different ranks are disjoint, so the union is their concatenation)
       (phase ``exchange_indices``).
    7. Alg. 1 l.8-9: every rank takes ``acc[union]`` and the values are
       summed with Allreduce (phase ``exchange_values``).
    8. Alg. 1 l.10-12: ``out = sum / W`` at the union; ``acc[union] = 0``
       becomes the new residual (phase ``update``).  The GATHERED set is
       zeroed (Alg. 1 l.11 zeroes ``idx_t``, the AllGather's result), unlike
       ``topk``, which zeroes only its own selection: an entry one rank sent
       leaves every rank's memory.

Decisions where the paper is open
---------------------------------
* **Whose norms.**  The leader packs the bins from its own norms and the k it
  derives from them (Sec. 4.3: "the delegated worker computes computational
  cost c_x"); only the bins are broadcast.  Each rank then selects with the
  local k it computes from ITS OWN norms for the layers of its bin (Sec. 4.3:
  "the local k of each layer differs slightly between workers ... the total
  number of selected gradients is approximately k").  So the selected total
  is ``sum_r sum_{x in bin_r} k_x^(r)``, close to but not exactly ``k``.
  Correctness never depends on the ranks agreeing on k: Allgatherv exchanges
  each rank's count, and the union is whatever was gathered.
* **Norms of what.**  Alg. 1 l.6 applies ``Sparsify`` to ``acc``, so the
  norms are those of the error-compensated vector (``e + g``), computed per
  layer as ``sqrt(x . x)`` in the vector's dtype (float64 when that
  overflows).
* **k_total** is the framework's ``k = round(density * n)`` (at least 1),
  an integer, so with no cap or floor biting ``sum(k_x) == k``.
* **Density 1.**  Alg. 3 as printed does not always give every layer its
  full size when ``k_total = n`` (a capped layer's excess only flows to
  later, lower-norm layers).  When ``k_total >= n`` every layer gets
  ``k_x = n_x`` instead, so DEFT at density 1 equals dense, as any sparsifier
  that sends everything must.
* **Timing.**  The bins' Bcast (``"eq3"`` only) is timed as
  ``exchange_indices`` (it is communication, and a non-leader's wait for the
  leader's packing lands there, as waits for the slowest rank do in every
  scheme).  ``select`` is
  the rank's own compute: norms, Alg. 3, the leader's Alg. 4 and Alg. 5.
  Its per-rank seconds of the last step are kept in
  :attr:`Deft.last_select_seconds` (Alg. 5 alone in
  :attr:`Deft.last_topk_seconds`) whether or not a timer is enabled.
* **Bins without a broadcast.**  With ``PACK_COST = "size"`` Alg. 4's
  cost of layer ``x`` is ``n_x + PACK_LAYER_OVERHEAD`` when ``k_x > 0`` and
  0 otherwise, and Alg. 3 gives ``k_x = 0`` exactly to the empty layers
  (``max(1, .)`` floors every other layer at 1).  So any rank's norms pack
  the same bins as the leader's, every step: the broadcast would carry
  nothing a rank does not know.  The scheme packs them once
  (:func:`size_bins`) and drops Alg. 4 l.3-16 from the step (one collective
  and ``4 L`` bytes less per step; the selections and the aggregate are the
  same).  The leader cycle still decides which bin each rank takes
  (Alg. 4 l.2, l.17).  Under ``"eq3"`` the leader packs and broadcasts as
  printed.
* **State.**  Besides ``iteration`` (the leader cycle) and the memory, DEFT
  keeps nothing: the partition is recomputed from the layout and ``W``.

:func:`simulate_selection_times` runs every rank's Alg. 5 share one after
another in one process (the per-rank selection time of Fig. 9 for world
sizes larger than the ranks at hand).
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from .. import backend
from ..backend import numpy_segment_topk, numpy_select, reference
from .deft_partition import (Layer, assign_local_k, bin_pack, decode_bins, encode_bins, leader, my_part, split_large,
                             two_stage_partition)
from .deft_selection import predicted_speedup, selection_cost
from .base import SELECT_KERNEL, WIRE_DTYPE, Scheme, k_for, register, validate_density

#: Cost model of the leader's bin packing (Alg. 4 l.6-8): ``"size"``, one
#: unit per element, because the segmented top-k makes one pass over each
#: layer whatever its k; the paper's ``n_x ln k_x`` (``"eq3"``) left the
#: measured per-rank times 1.3-1.4x apart at W = 8-16 on resnet50 shapes
#: (``bench select --mode deft``, density 0.001) while its own costs were equal.
PACK_COST = "size"
#: The size model's fixed cost per layer, in elements: the pass's per-layer
#: calls cost about as much as 32K elements' worth of the pass (measured:
#: bins of equal size, 11 vs 28 layers, 2.3 vs 3.2 ms at W = 16).
PACK_LAYER_OVERHEAD = 32768.0

__all__ = ["Deft", "deft_layers", "layer_norms", "local_k", "select_layers",
           "simulate_selection_times", "size_bins"]


# --------------------------------------------------------------------------
# pure functions (no MPI)
# --------------------------------------------------------------------------


#: Granularity of the bin packing: for ``W > 1`` workers, every layer Alg. 2
#: leaves larger than ``n / (PACK_PIECES * W)`` is cut further
#: (:func:`mpisparse.schemes.deft_partition.split_large`), so one layer can exceed
#: a bin's ideal load by at most ``1 / PACK_PIECES``.
PACK_PIECES = 8



def _compiled():
    """:mod:`mpisparse.backend.compiled_compensate`, imported on DEFT's first use (it imports numba:
    about 0.2 s that a rank running another scheme should not pay before its first step)."""
    from ..backend import compiled_compensate

    return compiled_compensate

def deft_layers(layout, world_size: int) -> list[Layer]:
    """Alg. 2 on a fusion layout, its tensors split for ``world_size`` workers,
    then (``world_size > 1``) every piece above ``n / (PACK_PIECES * W)``
    elements cut into near-equal pieces (:func:`split_large`)."""
    sizes = [s.size for s in layout.layers]
    layers = two_stage_partition(sizes, world_size)  # Alg. 2
    if world_size > 1 and sum(sizes) > 0:
        layers = split_large(layers, -(-sum(sizes) // (PACK_PIECES * world_size)))
    return layers


def size_bins(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Alg. 4 l.4-15 under the ``"size"`` cost model, from the layer sizes alone.

    The cost of layer ``x`` is ``sizes[x] + PACK_LAYER_OVERHEAD`` when its
    ``k_x > 0`` and 0 otherwise; :func:`local_k` gives ``k_x = 0`` exactly to
    the empty layers, so this equals ``bin_pack(sizes, ks, world_size, "size",
    PACK_LAYER_OVERHEAD)`` for the ``ks`` of any norms and any ``k_total``.
    """
    return bin_pack(sizes, [min(int(s), 1) for s in sizes], world_size, "size", PACK_LAYER_OVERHEAD)


def _spans(layers: Sequence[Layer]) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, sizes)`` of ``layers`` as int64 arrays (the segmented kernels' input)."""
    a = np.array([(layer.start, layer.size) for layer in layers], dtype=np.int64).reshape(-1, 2)
    return a[:, 0], a[:, 1]


def layer_norms(vec, layers: Sequence[Layer], spans=None) -> np.ndarray:
    """L2 norm of ``vec`` over every layer (input of Alg. 3), as float64.

    All layers in O(1) kernel calls (:func:`mpisparse.backend.segment_norms`:
    sums of squares accumulated per row of ``vec`` in its dtype, combined in
    float64; a float32 overflow is redone in float64).  Empty layers give 0.
    """
    starts, sizes = _spans(layers) if spans is None else spans
    return backend.segment_norms(vec, starts, sizes)


def local_k(sizes: Sequence[int], norms: Sequence[float], k_total: int) -> np.ndarray:
    """Alg. 3 (:func:`mpisparse.schemes.deft_partition.assign_local_k`), with density 1 exact.

    When ``k_total`` reaches the number of gradients every layer keeps all of
    its entries (``k_x = n_x``); otherwise this is Alg. 3 unchanged.
    """
    sizes = [int(s) for s in sizes]
    if k_total >= sum(sizes):
        return np.asarray(sizes, dtype=np.int64)
    return assign_local_k(sizes, norms, k_total)  # Alg. 3 l.1-15


def select_layers(vec, layers: Sequence[Layer], ks: Sequence[int], part: Sequence[int],
                  scratch=None, spans=None, kernel: str = "native"):
    """Alg. 5: top-``ks[x]`` by magnitude in each layer ``x`` of ``part``.

    The fast counterpart of :func:`mpisparse.schemes.deft_selection.layerwise_topk`:
    all of ``part``'s layers in one :func:`mpisparse.backend.segment_topk_abs`
    call (no per-layer loop; indices in any order within a layer).  Returns
    the flat indices of ``vec`` (``backend.index_dtype(vec.size)``), layer by
    layer in the order of ``part``.  ``scratch`` (optional) is a buffer like
    ``vec`` the kernel may overwrite.  ``spans`` (optional) is the layers'
    ``(starts, sizes)`` arrays computed once by the caller (building them
    walks every layer in Python, 0.7 ms for 288 layers).  ``kernel``: the
    selection primitive (:mod:`mpisparse.backend.reference`; other than
    native, one call per layer, the DEFT reference's loop).
    """
    starts, sizes = _spans(layers) if spans is None else spans
    p = np.asarray(part, dtype=np.int64).reshape(-1)
    k = np.asarray(ks, dtype=np.int64).reshape(-1)
    return reference.segment_topk_abs(vec, starts[p], sizes[p], k[p], kernel, scratch=scratch)  # Alg. 5 l.2-6


def simulate_selection_times(layout, grad, density: float, world_size: int,
                             repeats: int = 3, kernel: str = "native") -> dict[str, Any]:
    """Every rank's Alg. 5 share of ``grad``, run one after another, timed.

    For ``W = world_size`` workers: Alg. 2 on ``layout``, Alg. 3 from
    ``grad``'s layer norms (all ranks share this one gradient here), Alg. 4 by
    the leader of iteration 0 (so rank ``r`` takes bin ``r``), then each
    rank's layer-wise top-k, timed ``repeats`` times (ranks interleaved, best
    kept per rank).  Returns a dict with ``per_rank_seconds`` (list of W),
    ``max_seconds`` (eq. 5's measured counterpart), ``mean_seconds``,
    ``imbalance`` (max / mean), ``norms_seconds`` and ``alloc_seconds``
    (Alg. 3 + Alg. 4: work every rank or the leader does on top of Alg. 5;
    best of ``repeats`` too), ``per_rank_cost`` (eq. 4), ``predicted_speedup``
    (eq. 6 against a whole-vector top-k of ``k``),
    ``layers`` (count after Alg. 2), ``k`` and ``selected`` (sum of local k).
    ``kernel``: the selection primitive of Alg. 5 (:mod:`mpisparse.backend.reference`).
    """
    density = validate_density(density)
    if isinstance(world_size, bool) or int(world_size) != world_size or world_size < 1:
        raise ValueError(f"world_size is {world_size!r}; it must be an integer of at least 1.")
    if isinstance(repeats, bool) or int(repeats) != repeats or repeats < 1:
        raise ValueError(f"repeats is {repeats!r}; it must be an integer of at least 1.")
    world_size, repeats = int(world_size), int(repeats)
    n = layout.n
    if tuple(grad.shape) != (n,):
        raise ValueError(f"grad has shape {tuple(grad.shape)}; the layout needs ({n},).")
    k = k_for(density, n)
    layers = deft_layers(layout, world_size)  # Alg. 2
    sizes = [layer.size for layer in layers]
    spans = _spans(layers)

    norms_s = alloc_s = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        norms = layer_norms(grad, layers, spans)
        t1 = time.perf_counter()
        ks = local_k(sizes, norms, k)  # Alg. 3
        bins = bin_pack(sizes, ks, world_size, PACK_COST, PACK_LAYER_OVERHEAD)  # Alg. 4 l.4-15
        t2 = time.perf_counter()
        norms_s, alloc_s = min(norms_s, t1 - t0), min(alloc_s, t2 - t1)

    scratch = backend.array_module(grad).empty_like(grad)
    parts = [bins[my_part(rank, 0, world_size)] for rank in range(world_size)]  # Alg. 4 l.17
    per_rank = [math.inf] * world_size
    for _ in range(repeats):  # ranks interleaved, so a burst of load hits them alike
        for rank, part in enumerate(parts):
            s = time.perf_counter()
            idx = select_layers(grad, layers, ks, part, scratch, spans, kernel)  # Alg. 5
            backend.synchronize(idx)
            per_rank[rank] = min(per_rank[rank], time.perf_counter() - s)
    mx, mean = max(per_rank), sum(per_rank) / world_size
    try:
        pred = predicted_speedup(n, k, sizes, ks, bins)  # eq. 6
    except ValueError:  # 0/0: k = 1 everywhere
        pred = float("nan")
    return {
        "world_size": world_size,
        "n": n,
        "k": k,
        "density": density,
        "layers": len(layers),
        "selected": int(ks.sum()),
        "per_rank_seconds": per_rank,
        "per_rank_layers": [len(b) for b in bins],
        "per_rank_cost": selection_cost(sizes, ks, bins).tolist(),  # eq. 4
        "max_seconds": mx,
        "mean_seconds": mean,
        "imbalance": mx / mean if mean > 0 else 1.0,
        "norms_seconds": norms_s,
        "alloc_seconds": alloc_s,
        "predicted_speedup": pred,
        "repeats": repeats,
    }


# --------------------------------------------------------------------------
# the scheme
# --------------------------------------------------------------------------


@register("deft")
class Deft(Scheme):
    """DEFT (Alg. 1-5 of the DEFT paper); see the module docstring."""

    options = (SELECT_KERNEL, WIRE_DTYPE)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        W = self.comm.size
        self.layers: list[Layer] = deft_layers(self.layout, W)  # Alg. 2, once
        self.layer_sizes = [layer.size for layer in self.layers]
        self._spans = _spans(self.layers)
        self._bins = np.zeros(len(self.layers), dtype=np.int32)  # Alg. 4 l.16 payload
        #: the W bins as layer-index arrays, packed once when the cost model reads no k (PACK_COST "size"),
        #: else None (the leader packs and broadcasts every step)
        self._fixed_parts: list[np.ndarray] | None = None
        if PACK_COST == "size":
            self._bins[...] = encode_bins(size_bins(self.layer_sizes, W), len(self.layers))
            self._bins.flags.writeable = False
            self._fixed_parts = [np.asarray(p, dtype=np.int64) for p in decode_bins(self._bins, W)]
        self._scratch = None
        #: this rank's select-phase seconds of the last step (own compute)
        self.last_select_seconds = 0.0
        #: this rank's Alg. 5 seconds of the last step
        self.last_topk_seconds = 0.0
        #: leader of the last step and its bins (encoded; under PACK_COST "size" the bins packed at
        #: construction, the same array every step)
        self.last_leader: int | None = None
        self.last_bins: np.ndarray | None = None
        #: this rank's local k (Alg. 3, own norms) and own selection, last step
        self.last_ks: np.ndarray | None = None
        self.last_own_indices = None
        self._last_indices = None
        #: the local k of the last step (every layer), the guess that sizes the pass's candidate search
        self._prev_ks: np.ndarray | None = None
        #: whether the last step's Alg. 5 took the pass's candidates, and how many of its layers they fell
        #: short of (selected again)
        self.last_from_pass = False
        self.last_reselected = 0

    def _step(self, grad):
        W, rank, t = self.comm.size, self.comm.rank, self.iteration
        # the rank's layers are known before the pass when the bins are fixed: the pass then collects their
        # candidates too (Alg. 5's reading of them joins Alg. 1 l.5's)
        known = None if self._fixed_parts is None else self._fixed_parts[my_part(rank, t, W)]
        with self.phase("compensate"):
            acc, norms, cands = self._compensate_norms(grad, known)  # Alg. 1 l.5 (+ the norms, fused)
        if self._scratch is None:
            self._scratch = backend.array_module(acc).empty_like(acc)

        with self.phase("select"):
            s0 = time.perf_counter()
            if norms is None:
                norms = layer_norms(acc, self.layers, self._spans)
            ks = local_k(self.layer_sizes, norms, self.k)  # Alg. 3, own norms
            cycle = leader(t, W)  # Alg. 4 l.1
            # eq3: the bins read this step's k, so the leader packs them (Alg. 4 l.3-15) and broadcasts them;
            # otherwise every rank packed the same bins at construction (the leader's, whatever its norms)
            repack = self._fixed_parts is None
            if repack and rank == cycle:
                packed = bin_pack(self.layer_sizes, ks, W, PACK_COST, PACK_LAYER_OVERHEAD)
                self._bins[...] = encode_bins(packed, len(self.layers))
            s1 = time.perf_counter()

        if repack:
            with self.phase("exchange_indices"):
                self.comm.bcast(self._bins, root=cycle)  # Alg. 4 l.16

        with self.phase("select"):
            s2 = time.perf_counter()
            parts = decode_bins(self._bins, W) if repack else self._fixed_parts
            part = parts[my_part(rank, t, W)]  # Alg. 4 l.2, l.17
            self.last_from_pass = cands is not None
            self.last_reselected = 0
            if cands is None:
                idx = select_layers(acc, self.layers, ks, part, self._scratch, self._spans,  # Alg. 1 l.6 = Alg. 5
                                    self.select_kernel)
            else:  # Alg. 5 from the pass's candidates; a layer whose k they fall short of is read again
                idx, short = _compiled().take_candidates(cands, ks)
                self.last_reselected = int(short.sum())
                if self.last_reselected:
                    again = select_layers(acc, self.layers, ks, part[short], self._scratch, self._spans)
                    idx = np.concatenate([idx, again.astype(idx.dtype, copy=False)])
            backend.synchronize(idx)
            s3 = time.perf_counter()

        with self.phase("exchange_indices"):
            all_idx, _ = self.comm.allgatherv(idx)  # Alg. 1 l.7

        with self.phase("exchange_values"):
            vals = acc[all_idx]  # Alg. 1 l.8
            lost = self.sum_values(vals)  # Alg. 1 l.9 (values as --wire-dtype; the rounding is kept below)

        with self.phase("update"):
            out = self.write_output(all_idx, vals, 1.0 / W, self._last_indices)  # Alg. 1 l.10: (1/n) g_t
            self.memory.update(acc, all_idx)  # Alg. 1 l.11-12: acc[idx_t] = 0; e = acc
            self.keep_lost(all_idx, lost)

        self._prev_ks = ks
        self.last_select_seconds = (s1 - s0) + (s3 - s2)
        self.last_topk_seconds = s3 - s2
        self.last_leader = cycle
        self.last_bins = self._bins.copy() if repack else self._bins
        self.last_ks = ks
        self.last_own_indices = idx
        self._last_indices = all_idx
        return out

    def warm_up(self) -> tuple[str, ...]:
        """The compiled compensation-and-norms pass and segmented top-k, loaded on tiny arrays
        (:meth:`CollectiveScheme.warm_up`)."""
        if self.xp is not np:
            return ()
        if not _compiled().warm_up(numpy_segment_topk._segc_sizing(), backend.index_dtype(self.n)):
            return ()
        return ("compensate_norms", "segment_topk")

    def _compensate_norms(self, grad, part=None):
        """``(acc, norms, candidates)``: Alg. 1 l.5 and, where the compiled pass runs (residual error feedback
        on host float arrays, numba, ``MPISPARSE_FUSED`` not 0), the layer norms of ``acc`` found in the same
        pass (:func:`mpisparse.backend.compiled_compensate.compensate_norms`); otherwise ``norms`` is None and
        :func:`layer_norms` computes them in ``select``.

        ``part``: this step's layers of the rank, when known before the pass (fixed bins). With the native
        selection and a previous step's k to size the guess, the pass then also collects the candidates of
        their top k (:func:`mpisparse.backend.compiled_compensate.compensate_norms_candidates`); else, or when
        they would not fit, ``candidates`` is None.  The guess is the last step's k of each layer, a
        quarter more: the k of this step is known only after the pass (Alg. 3 reads every layer's norm)."""
        residual = self.fused_residual(grad)
        if residual is not None:
            if part is not None and self._prev_ks is not None and self.select_kernel == "native":
                guess = self._prev_ks + (self._prev_ks + 3) // 4
                got = _compiled().compensate_norms_candidates(
                    residual, grad, *self._spans, part, guess, numpy_segment_topk._segc_sizing(),
                    int(numpy_select._get_rng(None).integers(1 << 32)))
                if got is not None:
                    return residual, got[0], got[1]
            norms = _compiled().compensate_norms(residual, grad, *self._spans)
            if norms is not None:
                return residual, norms, None
        return self.memory.compensate(grad), None, None

    def selected_global(self) -> int:
        if self._last_indices is None:
            return 0
        return backend.unique_count(self._last_indices)

    def diagnostics(self) -> dict[str, float]:
        """Base error norm plus the per-rank select time of the last step.

        ``select_seconds_max`` / ``select_seconds_mean`` over ranks and
        ``select_imbalance = max / mean`` (1 is perfect balance).
        """
        d = super().diagnostics()
        times = [float(x) for x in self.comm.allgather_obj(float(self.last_select_seconds))]
        mx, mean = max(times), sum(times) / len(times)
        d["select_seconds_max"] = mx
        d["select_seconds_mean"] = mean
        d["select_imbalance"] = mx / mean if mean > 0 else 1.0
        return d
