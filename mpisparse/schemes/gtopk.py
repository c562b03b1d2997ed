"""``gtopk``: global Top-k by recursive-doubling merges of sparse sets.

Shi et al. 2019, "A Distributed Synchronous SGD Algorithm with Global Top-k
Sparsification for Low Bandwidth Networks" (gTop-k S-SGD; a peer baseline,
no seed text: implemented from the project's specification).  Per step,
with ``k = d n`` and ``W`` ranks, ``P`` the largest power of two ``<= W``:

1. error feedback: ``acc = e + g``;
2. local selection: the ``k`` entries of largest ``|acc|`` as an
   (index, value) set;
3. fold-in (only when ``W`` is not a power of two): rank ``r >= P`` sends
   its set to rank ``r - P``, which merges it into its own (step 4's merge);
4. recursive doubling among ranks ``0..P-1``: in round ``j = 0..log2(P)-1``
   rank ``r`` and its peer ``r XOR 2^j`` exchange their current sets
   (``sendrecv`` of indices, then of values), and both *merge*: the union
   of the two sets, values of equal indices summed, keeping the ``k``
   entries of largest magnitude (:func:`merge_topk`).  After the last
   round every rank of the group holds the same set, the global top-k;
5. fold-out: rank ``r - P`` sends the final set back to rank ``r``;
6. output: ``out = (sum of the selected values) / W`` at those ``k``
   indices, zero elsewhere;
7. memory: ``e = acc`` with the entries of this rank's local top-k that
   are in the global set zeroed (those contributions count as sent); its
   local top-k entries that were not selected globally stay in ``e``, as
   does everything it never offered.

Decisions and properties:

* **Deterministic merge.**  Both members of a pair compute the same merge:
  float32 addition is commutative, and ties in magnitude at the ``k``-th
  place are broken towards the smaller index.  Sets travel sorted by index.
  The local selection (step 2) uses the backend's exact top-k; its choice
  among entries tied at the ``k``-th place is local and does not affect
  agreement.
* **Every set has exactly ``k`` entries**: the union of two ``k``-sets has
  at least ``k`` entries, so the fold messages have a known size and use
  plain ``send``/``recv``; the doubling rounds use ``sendrecv`` as the
  pattern is a pairwise exchange (its count exchange costs 8 bytes per call).
* **Bytes per rank and step** (index size ``s_i``, value size 4):
  ``log2(P) (2 * 8 + k (s_i + 4))`` for ranks ``< P``, plus
  ``k (s_i + 4)`` for the fold senders (ranks ``>= P``) and for the
  fold-out senders (ranks ``< W - P``).  ``O(k log W)``, not ``O(k W)``.
* **Pruned contributions are lost** (as in Shi et al.'s algorithm): a
  merge that drops index ``i`` from a partial set drops the contributions
  it carried, but if ``i`` is selected globally through another branch of
  the tree, the ranks whose contributions were dropped still zero
  ``acc[i]`` by step 7.  That mass is neither applied nor remembered, so
  ``W sum(out) + sum(e) = sum(g) - lost``; the MPI test computes ``lost``
  independently and checks this identity.
* ``density_actual = k / n`` exactly: all ranks apply the same ``k`` indices.
* Density 1 (``k = n``) keeps every entry at every merge: the output is the
  mean of the gradients (dense), summed in tree order.
"""

from __future__ import annotations

import numpy as np

from .. import backend
from .base import Scheme, register

_VAL_DTYPE = np.float32


# --------------------------------------------------------------------------
# pure functions
# --------------------------------------------------------------------------


def largest_power_of_two(w: int) -> int:
    """``P``: the largest power of two ``<= w`` (``w >= 1``)."""
    w = int(w)
    if w < 1:
        raise ValueError(f"world size is {w}; it must be >= 1")
    return 1 << (w.bit_length() - 1)


def keep_topk(idx, vals, k: int):
    """The ``k`` entries of largest ``|vals|`` of an index-sorted set, still index-sorted.

    Ties in magnitude at the ``k``-th place go to the smaller index, so the
    result depends only on the set, never on how it was assembled.
    """
    m = int(idx.shape[0])
    k = int(k)
    if k < 0:
        raise ValueError(f"k is {k}; it must be >= 0")
    if m <= k:
        return idx, vals
    if k == 0:
        return idx[:0], vals[:0]
    xp = backend.array_module(vals)
    a = xp.abs(vals)
    t = xp.partition(a, m - k)[m - k]  # k-th largest magnitude (selection, not a sort; stays on the device)
    keep = a > t
    need = k - int(xp.count_nonzero(keep))  # an explicit scalar read
    if need:
        tied = xp.flatnonzero(a == t)  # ascending positions = ascending indices
        keep[tied[:need]] = True
    return idx[keep], vals[keep]


def merge_sets(idx_a, vals_a, idx_b, vals_b):
    """Union of two sparse sets (each with distinct indices): equal indices summed, index-sorted."""
    from ..backend import compiled

    merged = compiled.merge_sets(idx_a, vals_a, idx_b, vals_b)  # both index-sorted on the host: one linear merge
    if merged is not None:
        return merged
    xp = backend.array_module(idx_a)
    idx = xp.concatenate((idx_a, idx_b))
    vals = xp.concatenate((vals_a, vals_b))
    # equal indices come in pairs whose sum is symmetric: any order of the pair. On the host a stable sort:
    # two ascending runs, one merge (timsort) instead of a full sort
    order = xp.argsort(idx, kind="stable") if xp is np else xp.argsort(idx)
    idx = idx[order]
    vals = vals[order]
    if idx.size < 2:
        return idx, vals
    dup = xp.flatnonzero(idx[1:] == idx[:-1])  # position i and i+1 hold the same index
    if dup.size:
        vals[dup] = vals[dup] + vals[dup + 1]  # float32 a + b == b + a: symmetric
        keep = xp.ones(idx.size, dtype=bool)
        keep[dup + 1] = False
        idx, vals = idx[keep], vals[keep]
    return idx, vals


def merge_topk(idx_a, vals_a, idx_b, vals_b, k: int):
    """Step 4's merge: :func:`merge_sets` then :func:`keep_topk` (symmetric in a and b)."""
    idx, vals = merge_sets(idx_a, vals_a, idx_b, vals_b)
    return keep_topk(idx, vals, k)


def in_sorted(x, sorted_set):
    """Boolean mask: which entries of ``x`` occur in the ascending array ``sorted_set``."""
    xp = backend.array_module(x)
    if sorted_set.size == 0:
        return xp.zeros(x.shape, dtype=bool)
    pos = xp.searchsorted(sorted_set, x)
    xp.minimum(pos, sorted_set.size - 1, out=pos)
    return sorted_set[pos] == x


def doubling_schedule(rank: int, world: int) -> list[tuple[str, int]]:
    """The communication steps of ``rank`` in a world of ``world`` ranks.

    A list of ``(kind, peer)`` with ``kind`` one of ``"fold_send"`` (send
    my set to ``peer`` and wait for the result), ``"fold_recv"`` (merge
    ``peer``'s set into mine), ``"exchange"`` (a doubling round) and
    ``"unfold_send"`` (send the final set back to ``peer``).
    """
    rank, world = int(rank), int(world)
    if not 0 <= rank < world:
        raise ValueError(f"rank is {rank}; it must be in [0, {world})")
    p = largest_power_of_two(world)
    if rank >= p:
        return [("fold_send", rank - p)]
    steps: list[tuple[str, int]] = []
    extra = rank + p < world
    if extra:
        steps.append(("fold_recv", rank + p))
    d = 1
    while d < p:
        steps.append(("exchange", rank ^ d))
        d <<= 1
    if extra:
        steps.append(("unfold_send", rank + p))
    return steps


def gtopk_bytes(rank: int, world: int, k: int, index_itemsize: int = 4) -> int:
    """Bytes ``rank`` sends per step under the communicator's byte model."""
    payload = k * (index_itemsize + np.dtype(_VAL_DTYPE).itemsize)
    total = 0
    for kind, _ in doubling_schedule(rank, world):
        if kind == "exchange":
            total += payload + 2 * 8  # two sendrecv calls, 8-byte count each
        elif kind in ("fold_send", "unfold_send"):
            total += payload
    return total


# --------------------------------------------------------------------------
# the scheme
# --------------------------------------------------------------------------


@register("gtopk")
class GTopK(Scheme):
    """gTop-k S-SGD (Shi et al. 2019): the same global top-k set on every rank."""

    wire_refusal = ("each of its log2(W) merges sums and re-selects partial sums: a 16-bit wire would round "
                    "them at every level, and no rank's memory could keep that rounding")

    #: its tree pairs ranks point-to-point and each merge decides which values survive: a host-aware
    #: pairing would change the result, so ``--hierarchical`` does not apply
    hierarchical = False
    compiled_kernels = ("fused", "merge")

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._scratch = None
        self.global_indices = None
        self.local_indices = None

    def _send_set(self, idx, vals, peer: int) -> None:
        with self.phase("exchange_indices"):
            self.comm.send(idx, peer, tag=10)
        with self.phase("exchange_values"):
            self.comm.send(vals, peer, tag=11)

    def _recv_set(self, peer: int, idt):
        idx = self.xp.empty(self.k, dtype=idt)
        vals = self.xp.empty(self.k, dtype=_VAL_DTYPE)
        with self.phase("exchange_indices"):
            _, _, c = self.comm.recv(idx, peer, tag=10)
        with self.phase("exchange_values"):
            _, _, c2 = self.comm.recv(vals, peer, tag=11)
        if c != self.k or c2 != self.k:
            raise RuntimeError(f"gtopk: received {c} indices and {c2} values from rank {peer}; expected {self.k}")
        return idx, vals

    def _step(self, grad):
        comm, k = self.comm, self.k
        idt = backend.index_dtype(self.n)
        acc, local = self.compensate_topk(grad, k, ascending=True)  # steps 1 and 2
        with self.phase("select"):
            local = local.astype(idt, copy=False)
            idx, vals = local, acc[local].astype(_VAL_DTYPE, copy=False)
        for kind, peer in doubling_schedule(comm.rank, comm.size):
            if kind == "fold_send":  # step 3 (sender), then step 5 (receive the result)
                self._send_set(idx, vals, peer)
                idx, vals = self._recv_set(peer, idt)
            elif kind == "fold_recv":  # step 3 (receiver)
                oi, ov = self._recv_set(peer, idt)
                with self.phase("select"):
                    idx, vals = merge_topk(idx, vals, oi, ov, k)
            elif kind == "exchange":  # step 4
                with self.phase("exchange_indices"):
                    oi = comm.sendrecv(idx, peer, tag=0)
                with self.phase("exchange_values"):
                    ov = comm.sendrecv(vals, peer, tag=2)
                with self.phase("select"):
                    idx, vals = merge_topk(idx, vals, oi, ov, k)
            else:  # "unfold_send", step 5
                self._send_set(idx, vals, peer)
        with self.phase("update"):
            out = self.write_output(idx, vals, 1.0 / comm.size, self.global_indices)  # step 6
            # step 7: local top-k entries that made the global set were sent
            self.memory.update(acc, local[in_sorted(local, idx)])
        self.global_indices, self.local_indices = idx, local
        return out

    def selected_global(self) -> int:
        return self.k

    def diagnostics(self) -> dict[str, float]:
        d = super().diagnostics()
        hit = 0 if self.local_indices is None else int(in_sorted(self.local_indices, self.global_indices).sum())
        total = self.comm.allreduce(np.array([hit / max(self.k, 1)]))
        d["local_in_global"] = float(total[0]) / self.comm.size
        return d
