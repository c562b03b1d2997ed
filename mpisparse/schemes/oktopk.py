"""``oktopk``: Ok-Topk's O(k) sparse allreduce, balanced split-and-reduce then allgatherv.

Li and Hoefler, "Near-Optimal Sparse Allreduce for Distributed Deep
Learning", PPoPP 2022 (Algorithm 1, the sparse allreduce; Algorithm 2,
Ok-Topk SGD with residuals).  A peer users choose instead of the
all-reduce-compatible sparsifiers; implemented from the paper.  Per step,
with ``k = d n`` and ``W`` ranks (``t`` the step; an *estimation step* is
``t % tau == 0``, ``--tau``):

1. error feedback: ``acc = e + g``;
2. local selection: on an estimation step the exact top-k of ``|acc|``, and
   the local threshold ``th_l`` becomes its smallest magnitude; between them
   every entry with ``|acc| >= th_l`` (threshold reuse: one pass, the count
   drifts around ``k``);
3. region boundaries (estimation steps): the vector is split into ``W``
   regions; each rank proposes the ``W-1`` boundaries that cut its selected
   indices into ``W`` equal-count parts, and the boundaries are their mean
   over ranks (one Allreduce of ``W-1`` numbers), so every region holds about
   ``k / W`` of each rank's entries (the balanced split);
4. split and reduce: each rank sends the entries of region ``j`` to rank
   ``j`` (Alltoallv of indices, then of values; the paper's point-to-point
   rounds with destination rotation move the same data) and sums what it
   receives for its own region (float32, in rank order);
5. global selection: on an estimation step the global threshold ``th_g``
   becomes the ``k``-th largest magnitude of all reduced entries, found
   without moving them (bisection on the float32 bit pattern, one Allreduce
   of a count per round, about 31 rounds; 0 when there are at most ``k``
   entries); every rank keeps its region's entries with ``|v| >= th_g``;
6. balance: the kept entries, in index order across regions, are
   redistributed so that rank ``j`` holds the ``j``-th of ``W`` equal blocks
   (one Alltoallv each of indices and values; skipped when already equal);
7. allgatherv of the balanced blocks (indices, then values; their sizes are
   known to every rank, so no counts travel);
8. output: ``out = (summed value) / W`` at the gathered indices, zero
   elsewhere;
9. memory: ``e = acc`` with this rank's selected entries that made the global
   set zeroed; selected entries that did not stay in ``e``, as does everything
   not selected.

Decisions and properties:

* **The result does not depend on the regions**: the global set is the union
  of the ranks' local sets, summed, thresholded; regions and balancing only
  decide who moves what.  The NumPy reference (``tests/mpi/check_oktopk.py``)
  computes it from all ranks' inputs.
* **Mass is conserved exactly** (unlike ``gtopk``): a global entry carries
  every contribution offered for its index, and exactly those leave the
  residuals: ``W sum(out) + sum(e) = sum(g)``.
* **Bytes per rank** (4-byte indices and values, the communicator's model):
  split and reduce ``8 s`` for ``s`` entries sent to other regions (about
  ``k (W-1)/W`` when balanced), balancing at most ``8 K (W-1)/W``, and the
  ring allgatherv ``8 (K - K/W)`` for ``K`` global entries (about ``k``), so
  about ``4k (W-1)/W`` elements (16 bytes an entry crossing ranks) between
  estimations, under the paper's bound of ``6k (W-1)/W`` elements
  (:func:`oktopk_bound_bytes`); the counts (8 bytes each) and, on estimation
  steps, the boundaries and the ~31 one-count Allreduces are counted too.
  Between estimations the counts drift with the gradients, and so do the
  bytes.
* ``density_actual`` is ``K / n``.  The paper reuses the thresholds for
  ``tau`` = 32 or 128 steps; the default here is 32.
* Not with ``--hierarchical`` (its Alltoallv has no two-level form here), nor
  bucket by bucket (its top-k spans the whole vector).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from .base import CollectiveScheme, SchemeOption, register
from .gtopk import in_sorted

_INF_BITS = 0x7F800000  # the bit pattern of float32 +inf: every finite magnitude's pattern is below it


def oktopk_bound_bytes(k: int, world: int, itemsize: int = 4) -> float:
    """The paper's bound on what one rank sends per step: ``6k (W-1)/W`` elements of ``itemsize`` bytes."""
    return 6.0 * k * (world - 1) / world * itemsize


def local_boundaries(indices, world: int, n: int) -> np.ndarray:
    """Step 3's proposal of one rank: the ``W-1`` indices that cut its ascending ``indices`` into ``W``
    equal-count parts (evenly spaced positions of ``[0, n)`` when it selected nothing)."""
    m = len(indices)
    if m == 0:
        return np.array([j * n // world for j in range(1, world)], dtype=np.float64)
    picks = np.array([j * m // world for j in range(1, world)], dtype=np.int64)
    if not len(picks):
        return np.empty(0, dtype=np.float64)
    xp = backend.array_module(indices)
    # the W-1 picks go to the indices' module (a host index into a device array is refused there)
    return np.asarray(backend.to_host(indices[backend.to_module(picks, xp)]), dtype=np.float64)


def region_bounds(proposal_sum: np.ndarray, world: int, n: int) -> np.ndarray:
    """``[0, b_1, ..., b_{W-1}, n]`` from the sum over ranks of their proposals (their mean, floored,
    kept non-decreasing)."""
    inner = np.floor(proposal_sum / world).astype(np.int64)
    bounds = np.concatenate(([0], np.clip(inner, 0, n), [n])).astype(np.int64)
    return np.maximum.accumulate(bounds)


def block_sizes(total: int, world: int) -> np.ndarray:
    """Step 6's equal blocks: ``total`` entries over ``world`` ranks, the first ``total % W`` one larger."""
    base, extra = divmod(int(total), world)
    return np.array([base + (j < extra) for j in range(world)], dtype=np.int64)


def kth_largest_bits(count_at_least, k: int) -> int:
    """The largest float32 bit pattern ``T`` with ``count_at_least(T) >= k`` (bisection, ~31 rounds);
    ``count_at_least`` must be non-increasing in ``T``.  For non-negative floats it is the pattern of
    the ``k``-th largest."""
    lo, hi = 0, _INF_BITS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_at_least(mid) >= k:
            lo = mid
        else:
            hi = mid - 1
    return lo


@register("oktopk")
class OkTopk(CollectiveScheme):
    """Ok-Topk (Li and Hoefler, PPoPP 2022): balanced split-and-reduce, then allgatherv of the global top-k."""

    options = (
        SchemeOption("tau", int, 32,
                     "oktopk: re-estimate the local and global thresholds and the region boundaries every "
                     "tau steps (exact top-k there, threshold reuse between)", low=1),
    )
    #: its Alltoallv has no two-level form in the communicator
    hierarchical = False
    wire_refusal = "its reduced values are summed region by region as float32"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.tau = self.opts["tau"]
        self.local_threshold: float | None = None
        self.global_threshold: float | None = None
        self.bounds: np.ndarray | None = None
        self._scratch = None
        self._last = None  # the gathered indices of the last step (zeroed in the output next step)
        self.local_count = 0

    # -------------------------------------------------------------- pieces
    def _estimating(self) -> bool:
        return self.iteration % self.tau == 0 or self.local_threshold is None or self.bounds is None

    def _select_local(self, acc, estimate: bool):
        """Step 2: ascending indices of this rank's offer."""
        xp = backend.array_module(acc)
        if self._scratch is None:
            self._scratch = xp.empty_like(acc)
        if estimate:
            idx = xp.sort(backend.topk_abs(acc, self.k, scratch=self._scratch))
            # one scalar read; density 1 keeps every entry at every step (0, not the smallest magnitude)
            self.local_threshold = float(xp.abs(acc[idx]).min()) if len(idx) and self.k < self.n else 0.0
            return idx
        # steps 4 and 9 need them ascending (one contiguous run per region, in_sorted): a device kernel's
        # appends are sorted, the host's scan already is
        return backend.threshold_select(acc, self.local_threshold, scratch=self._scratch, ordered=True)

    def _global_threshold(self, mags) -> float:
        """Step 5 on an estimation step: the ``k``-th largest of every rank's ``mags`` (0 when at most k)."""
        comm = self.comm
        total = int(comm.allreduce(np.array([mags.size], dtype=np.int64))[0])
        if total <= self.k:
            return 0.0
        xp = backend.array_module(mags)
        bits = mags.astype(np.float32, copy=False).view(np.int32)  # stays where mags is: one count read a round
        count = np.empty(1, dtype=np.int64)

        def at_least(t: int) -> int:
            count[0] = int(xp.count_nonzero(bits >= t))
            return int(comm.allreduce(count, count)[0])

        return float(np.array([kth_largest_bits(at_least, self.k)], dtype=np.int32).view(np.float32)[0])

    def _reduce_region(self, ridx, rvals, recvcounts):
        """Step 4's sum of what this rank received for its region: ascending unique indices and float32 sums
        (added in the order received, i.e. rank order).  ``recvcounts`` (host) splits the received entries
        into the senders' blocks, whose indices are distinct: a plain fancy-index add per block is exact on
        NumPy and CuPy alike and keeps the rank order (CuPy's ``add.at`` adds atomically, in any order)."""
        xp = backend.array_module(rvals)
        uniq, inv = xp.unique(ridx, return_inverse=True)
        inv = inv.reshape(-1)
        sums = xp.zeros(uniq.shape[0], dtype=np.float32)
        start = 0
        for c in recvcounts:
            c = int(c)
            if c:
                sums[inv[start:start + c]] += rvals[start:start + c]
            start += c
        return uniq, sums

    # -------------------------------------------------------------- the step
    def _step(self, grad):
        comm, W = self.comm, self.comm.size
        estimate = self._estimating()
        with self.phase("compensate"):  # step 1
            acc = self.memory.compensate(grad)
        xp = backend.array_module(acc)
        with self.phase("select"):  # step 2
            idx = self._select_local(acc, estimate).astype(backend.index_dtype(self.n), copy=False)
            vals = acc[idx]
            self.local_count = int(idx.shape[0])
        if estimate:  # step 3
            with self.phase("exchange_indices"):
                proposal = local_boundaries(idx, W, self.n)
                if W > 1:
                    comm.allreduce(proposal, proposal)
                self.bounds = region_bounds(proposal, W, self.n)
        with self.phase("exchange_indices"):  # step 4: split
            # idx ascending: region j's entries are the run between the positions of bounds j and j+1
            # (W+1 positions read back, not the indices)
            cuts = xp.searchsorted(idx, backend.to_module(self.bounds.astype(idx.dtype), xp), side="left")
            sendcounts = np.diff(backend.to_host(cuts).astype(np.int64))
            ridx, recvcounts = comm.alltoallv(idx, sendcounts)
        with self.phase("exchange_values"):
            rvals, _ = comm.alltoallv(vals, sendcounts)
        with self.phase("select"):  # step 4: reduce; step 5
            uniq, sums = self._reduce_region(ridx, rvals, recvcounts)
            mags = backend.array_module(sums).abs(sums)
            if estimate:
                self.global_threshold = self._global_threshold(mags)
            keep = mags >= np.float32(self.global_threshold)
            gidx, gvals = uniq[keep], sums[keep]
        counts = comm.allgather_counts(int(gidx.shape[0])) if W > 1 else np.array([gidx.shape[0]])
        blocks = block_sizes(int(counts.sum()), W)
        if not np.array_equal(counts, blocks):  # step 6 (the same decision on every rank: counts are shared)
            first = int(counts[:comm.rank].sum())
            owner = np.searchsorted(np.cumsum(blocks), np.arange(first, first + int(counts[comm.rank])), side="right")
            moves = np.bincount(owner, minlength=W)
            with self.phase("exchange_indices"):
                gidx, _ = comm.alltoallv(gidx, moves)
            with self.phase("exchange_values"):
                gvals, _ = comm.alltoallv(gvals, moves)
        with self.phase("exchange_indices"):  # step 7
            all_idx, _ = comm.allgatherv(gidx, blocks)
        with self.phase("exchange_values"):
            all_vals, _ = comm.allgatherv(gvals, blocks)
        with self.phase("update"):
            out = self.write_output(all_idx, all_vals, 1.0 / W, self._last)  # step 8
            self.memory.update(acc, idx[in_sorted(idx, all_idx)])  # step 9
        self._last = all_idx
        return out

    def selected_global(self) -> int:
        return 0 if self._last is None else int(self._last.shape[0])

    def diagnostics(self) -> dict[str, float]:
        d = super().diagnostics()
        counts = self.comm.allreduce(np.array([self.local_count / max(self.k, 1)]))
        d["local_over_k"] = float(counts[0]) / self.comm.size
        d["global_over_k"] = self.selected_global() / max(self.k, 1)
        return d

    # -------------------------------------------------------------- state
    def _extra_state(self) -> dict[str, Any]:
        return {"local_threshold": self.local_threshold, "global_threshold": self.global_threshold,
                "bounds": None if self.bounds is None else self.bounds.tolist()}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self.local_threshold = extra.get("local_threshold")
        self.global_threshold = extra.get("global_threshold")
        b = extra.get("bounds")
        # boundaries of another world size are re-estimated at the next step
        self.bounds = None if b is None or len(b) != self.comm.size + 1 else np.array(b, dtype=np.int64)
