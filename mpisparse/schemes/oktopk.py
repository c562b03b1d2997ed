"""``oktopk``: Ok-Topk's O(k) sparse allreduce, balanced split-and-reduce then allgatherv.

Li and Hoefler, "Near-Optimal Sparse Allreduce for Distributed Deep
Learning", PPoPP 2022 (Algorithm 1, the sparse allreduce; Algorithm 2,
Ok-Topk SGD with residuals).  A peer users choose instead of the
all-reduce-compatible sparsifiers; implemented from the paper.  Per step,
with ``k = d n`` and ``W`` ranks (``t`` the step; an *estimation step* is
``t % tau == 0``, ``--tau``):

1. error feedback: ``acc = e + g``;
2. local selection: the exact top-k of ``|acc|`` at every step, in one pass
   over memory where the compiled loops run (the compensation and a
   candidate search from a sampled threshold, as ``topk``'s; the exact ``k``
   picked among the candidates), sorted ascending;
3. region boundaries (estimation steps): the vector is split into ``W``
   regions; each rank proposes the ``W-1`` boundaries that cut its selected
   indices into ``W`` equal-count parts, and the boundaries are their mean
   over ranks (one Allreduce of ``W-1`` numbers), so every region holds about
   ``k / W`` of each rank's entries (the balanced split);
4. split and reduce: each rank sends the entries of region ``j`` to rank
   ``j`` (one Alltoallv of (index, value) pairs after an Alltoall of their
   counts; the paper's point-to-point rounds with destination rotation move
   the same data) and sums what it receives for its own region (float32, in
   rank order);
5. global selection: on an estimation step the global threshold ``th_g``
   becomes the ``k``-th largest magnitude of all reduced entries, found
   without moving them (a 15-way search on the float32 bit pattern, one
   Allreduce of 16 counts a round, 8 rounds; 0 when there are at most ``k``
   entries).  Between estimations ``th_g`` is reused and corrected at every
   step: each rank counts its region's entries at 128 probes ``th_g
   2^(j/64)``, ``j = -64..63`` (1.1 % apart, an octave either way), one
   Allgatherv of those counts gives every rank the global count at every
   probe, and the probe whose count is closest to ``k`` becomes ``th_g``.
   The same Allgatherv carries the per-rank counts steps 6 and 7 need.
   Every rank keeps its region's entries with ``|v| >= th_g``;
6. balance: when some rank holds more than ``1 + BALANCE_SLACK`` (1/8) times
   the largest of ``W`` equal blocks, the kept entries, in index order
   across regions, are redistributed so that rank ``j`` holds the ``j``-th
   block (one Alltoallv of pairs, its counts known from step 5);
7. allgatherv of the blocks (pairs; their sizes are known to every rank, so
   no counts travel);
8. output: ``out = (summed value) / W`` at the gathered indices, zero
   elsewhere;
9. memory: ``e = acc`` with this rank's selected entries that made the global
   set zeroed; selected entries that did not stay in ``e``, as does everything
   not selected.

Decisions and properties:

* **The counts are held at k on every step.**  The paper reuses both
  thresholds between estimations; with error feedback the residual grows
  past a reused local threshold and the counts drift (measured here: 5.5 k
  local entries and 2 MB a rank after 5 steps at W = 4 on resnet50's
  shapes, against the bound's 0.46 MB).  The local selection is exact at
  every step (the threshold pass it replaces costs the same here: one read
  of ``e`` and ``g``), and the global one is corrected at every step, so
  ``K`` stays within a few percent of ``k``.
* **The result does not depend on the regions**: the global set is the union
  of the ranks' local sets, summed, thresholded; regions and balancing only
  decide who moves what.  The NumPy reference (``tests/mpi/check_oktopk.py``)
  computes it from all ranks' inputs.
* **Mass is conserved exactly** (unlike ``gtopk``): a global entry carries
  every contribution offered for its index, and exactly those leave the
  residuals: ``W sum(out) + sum(e) = sum(g)``.
* **Bytes per rank** (4-byte indices and values, the communicator's model):
  split and reduce ``8 s`` for ``s`` entries sent to other regions (about
  ``k (W-1)/W`` when balanced), balancing at most ``8 K (W-1)/W`` (rarely
  run), and the ring allgatherv ``8 (K - K_next)`` for ``K`` global entries
  (``K_next`` the next rank's block), so about ``4k (W-1)/W`` elements,
  under the paper's bound of ``6k (W-1)/W`` elements
  (:func:`oktopk_bound_bytes`); the split's counts (``8 (W-1)``), the probe
  counts (``512 (W-1)``) and, on estimation steps, the boundaries and the
  search's Allreduces are counted too.
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


#: the probes of each round of the estimation's search for the global threshold (one Allreduce a round:
#: 8 rounds over the 2**31 magnitude patterns instead of bisection's 31)
SEARCH_WAYS = 15


def kth_largest_bits(count_at_least, k: int, ways: int = 1) -> int:
    """The largest float32 bit pattern ``T`` with ``count_at_least(T) >= k``; ``count_at_least`` takes an
    ascending int64 array of patterns and returns their counts (non-increasing in ``T``).  Each round
    probes ``lo + 1`` and ``ways`` evenly spaced patterns of ``(lo, hi]`` (``ways = 1``: bisection,
    about 31 rounds; 15: about 8).  For non-negative floats it is the pattern of the ``k``-th largest (0
    when fewer than ``k`` are above zero)."""
    lo, hi = 0, _INF_BITS
    steps = np.arange(1, ways + 1, dtype=np.int64)
    while lo < hi:
        span = hi - lo
        probes = np.unique(np.concatenate(([lo + 1], lo - (-span * steps // (ways + 1)))))  # ceilings
        ok = np.asarray(count_at_least(probes)) >= k
        reached = int(np.count_nonzero(ok))  # a prefix: the counts do not increase
        if reached:
            lo = int(probes[reached - 1])
        if reached < probes.shape[0]:
            hi = int(probes[reached]) - 1
    return lo


#: step 6 runs only when the largest kept block exceeds the balanced one by more than this fraction
BALANCE_SLACK = 0.125


def needs_balance(counts, blocks) -> bool:
    """Whether step 6 moves entries before the allgatherv: only when some rank holds more than
    ``1 + BALANCE_SLACK`` times the largest equal block (a ring allgatherv's time follows its largest
    block; a few entries more on one rank cost less than the extra Alltoallv's latency)."""
    return int(np.max(counts)) > (1.0 + BALANCE_SLACK) * int(np.max(blocks))


def balance_moves(counts, blocks) -> np.ndarray:
    """Step 6's traffic: ``M[s, r]`` entries go from rank ``s`` to rank ``r`` when the ranks' kept entries
    (``counts``, concatenated in rank order) are cut into the equal ``blocks``; every rank computes the
    whole matrix from the shared counts, so the Alltoallv needs no count exchange."""
    held = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
    cut = np.concatenate(([0], np.cumsum(blocks, dtype=np.int64)))
    lo = np.maximum(held[:-1, None], cut[None, :-1])
    hi = np.minimum(held[1:, None], cut[None, 1:])
    return np.maximum(hi - lo, 0)


def pack_entries(idx, vals):
    """One message of ``(index, value)`` pairs: a ``(c, 2)`` array of the indices' dtype, the float32
    value's bit pattern in the second column (so indices and values travel in one call)."""
    xp = backend.array_module(idx)
    out = xp.empty((idx.shape[0], 2), dtype=idx.dtype)
    out[:, 0] = idx
    out[:, 1] = vals.astype(np.float32, copy=False).view(np.int32)  # widened by sign for 64-bit indices
    return out


def unpack_entries(packed):
    """``(indices, float32 values)`` of a :func:`pack_entries` message (flat or ``(c, 2)``), contiguous."""
    pairs = packed.reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].astype(np.int32).view(np.float32)


#: the per-step correction of the reused global threshold: probes ``2**(1/PROBES_PER_OCTAVE)`` apart ...
PROBES_PER_OCTAVE = 64
#: ... over ``PROBE_OCTAVES`` octaves either side of the last threshold (128 probes, one count each per rank)
PROBE_OCTAVES = 1


def probe_thresholds(center: float) -> np.ndarray:
    """Step 5 between estimations: the candidate global thresholds, ascending float32,
    ``center * 2**(j / PROBES_PER_OCTAVE)`` for ``j`` in ``[-PROBE_OCTAVES * PROBES_PER_OCTAVE,
    PROBE_OCTAVES * PROBES_PER_OCTAVE)`` (the product in float64, then rounded)."""
    half = PROBE_OCTAVES * PROBES_PER_OCTAVE
    return (float(center) * np.exp2(np.arange(-half, half) / PROBES_PER_OCTAVE)).astype(np.float32)


def counts_at_least(mags, probes: np.ndarray) -> np.ndarray:
    """``#(mags >= p)`` for each ascending float32 probe ``p`` (int32, on the host: one read of the counts)."""
    xp = backend.array_module(mags)
    srt = xp.sort(mags.astype(np.float32, copy=False))
    below = xp.searchsorted(srt, backend.to_module(probes, xp), side="left")
    return backend.to_host((srt.shape[0] - below).astype(np.int32))


def closest_probe(totals, k: int) -> int:
    """The probe whose global count (``totals``, non-increasing) is closest to ``k``; on a tie, the higher
    threshold (the smaller count)."""
    gap = np.abs(np.asarray(totals, dtype=np.int64) - int(k))
    return int(np.flatnonzero(gap == gap.min())[-1])


@register("oktopk")
class OkTopk(CollectiveScheme):
    """Ok-Topk (Li and Hoefler, PPoPP 2022): balanced split-and-reduce, then allgatherv of the global top-k."""

    options = (
        SchemeOption("tau", int, 32,
                     "oktopk: find the global threshold exactly and re-estimate the region boundaries every "
                     "tau steps (between them the threshold is reused, corrected at every step from counts at "
                     "probes around it; the local top-k is exact at every step)", low=1),
    )
    #: its Alltoallv has no two-level form in the communicator
    hierarchical = False
    wire_refusal = "its reduced values are summed region by region as float32"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.tau = self.opts["tau"]
        #: the last step's k-th largest local magnitude (the paper's local threshold; exact at every step here)
        self.local_threshold: float | None = None
        self.global_threshold: float | None = None
        self.bounds: np.ndarray | None = None
        self._scratch = None
        self._last = None  # the gathered indices of the last step (zeroed in the output next step)
        self.local_count = 0
        #: what this rank sent in the last step (the communicator's count)
        self.step_bytes = 0

    # -------------------------------------------------------------- pieces
    def _estimating(self) -> bool:
        return self.iteration % self.tau == 0 or self.global_threshold is None or self.bounds is None

    def _select_local(self, grad):
        """Steps 1 and 2: ``(acc, the ascending indices of its k largest magnitudes, acc at them)``, timed as
        ``compensate`` and ``select`` (the fused pass of :meth:`compensate_topk` where it runs)."""
        acc, idx = self.compensate_topk(grad, self.k, ascending=True)
        with self.phase("select"):
            idx = idx.astype(backend.index_dtype(self.n), copy=False)
            vals = acc[idx]
            # one scalar read; density 1 keeps every entry (0, not the smallest magnitude)
            self.local_threshold = float(abs(vals).min()) if len(idx) and self.k < self.n else 0.0
        return acc, idx, vals

    def _global_threshold(self, mags) -> float:
        """Step 5 on an estimation step: the ``k``-th largest of every rank's ``mags`` (0 when there are at
        most ``k``, or fewer than ``k`` above zero), by :func:`kth_largest_bits` with :data:`SEARCH_WAYS`
        probes a round."""
        comm = self.comm
        total = int(comm.allreduce(np.array([mags.size], dtype=np.int64))[0]) if comm.size > 1 else int(mags.size)
        if total <= self.k:
            return 0.0
        xp = backend.array_module(mags)
        bits = xp.sort(mags.astype(np.float32, copy=False).view(np.int32))  # stays where mags is

        def at_least(patterns):
            below = xp.searchsorted(bits, backend.to_module(patterns.astype(np.int32), xp), side="left")
            counts = (bits.shape[0] - backend.to_host(below)).astype(np.int64)  # one read of the counts a round
            return comm.allreduce(counts, counts) if comm.size > 1 else counts

        return float(np.array([kth_largest_bits(at_least, self.k, SEARCH_WAYS)], dtype=np.int32).view(np.float32)[0])

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
    def _corrected_threshold(self, mags):
        """Step 5 between estimations: the probe around the last global threshold whose count over all
        ranks is closest to ``k`` (:func:`probe_thresholds`, :func:`closest_probe`), from one Allgatherv of
        every rank's counts at the probes; returns ``(threshold, every rank's count of entries at or above
        it)``, the counts that steps 6 and 7 need, so no other count travels."""
        comm, W = self.comm, self.comm.size
        probes = probe_thresholds(self.global_threshold)
        mine = counts_at_least(mags, probes)
        if W > 1:
            every, _ = comm.allgatherv(mine, np.full(W, probes.shape[0], dtype=np.int64))
            every = every.reshape(W, probes.shape[0])
        else:
            every = mine.reshape(1, -1)
        j = closest_probe(every.sum(axis=0), self.k)
        return float(probes[j]), every[:, j].astype(np.int64)

    def _step(self, grad):
        comm, W = self.comm, self.comm.size
        sent_before = getattr(comm, "bytes_sent", 0)
        estimate = self._estimating()
        acc, idx, vals = self._select_local(grad)  # steps 1 and 2
        xp = backend.array_module(acc)
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
        with self.phase("exchange_values"):  # indices and values in one message (its counts first, an Alltoall)
            received, recvcounts = comm.alltoallv(pack_entries(idx, vals).reshape(-1), 2 * sendcounts)
            ridx, rvals = unpack_entries(received)
            recvcounts = recvcounts // 2
        with self.phase("select"):  # step 4: reduce
            uniq, sums = self._reduce_region(ridx, rvals, recvcounts)
            mags = backend.array_module(sums).abs(sums)
        with self.phase("exchange_indices"):  # step 5: the threshold, and every rank's count above it
            if estimate or not self.global_threshold > 0:
                self.global_threshold = self._global_threshold(mags)
                counts = None
            else:
                self.global_threshold, counts = self._corrected_threshold(mags)
        with self.phase("select"):
            keep = mags >= np.float32(self.global_threshold)
            gidx, gvals = uniq[keep], sums[keep]
        if counts is None:
            with self.phase("exchange_indices"):
                counts = comm.allgather_counts(int(gidx.shape[0])) if W > 1 else np.array([gidx.shape[0]])
        blocks = block_sizes(int(counts.sum()), W)
        entries = pack_entries(gidx, gvals).reshape(-1)
        if needs_balance(counts, blocks):  # step 6 (the same decision on every rank: counts are shared)
            moves = balance_moves(counts, blocks)
            with self.phase("exchange_values"):
                entries, _ = comm.alltoallv(entries, 2 * moves[comm.rank], 2 * moves[:, comm.rank])
        else:
            blocks = counts
        with self.phase("exchange_values"):  # step 7
            gathered, _ = comm.allgatherv(entries, 2 * blocks)
            all_idx, all_vals = unpack_entries(gathered)
        with self.phase("update"):
            out = self.write_output(all_idx, all_vals, 1.0 / W, self._last)  # step 8
            self.memory.update(acc, idx[in_sorted(idx, all_idx)])  # step 9
        self._last = all_idx
        self.step_bytes = getattr(comm, "bytes_sent", 0) - sent_before
        return out

    def selected_global(self) -> int:
        return 0 if self._last is None else int(self._last.shape[0])

    def diagnostics(self) -> dict[str, float]:
        d = super().diagnostics()
        counts = self.comm.allreduce(np.array([self.local_count / max(self.k, 1)]))
        d["local_over_k"] = float(counts[0]) / self.comm.size
        d["global_over_k"] = self.selected_global() / max(self.k, 1)
        if self.comm.size > 1:  # this step's bytes, the most any rank sent, over the paper's bound
            most = self.comm.allreduce(np.array([float(self.step_bytes)]), op="max")
            d["bytes_over_bound"] = float(most[0]) / oktopk_bound_bytes(self.k, self.comm.size)
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
