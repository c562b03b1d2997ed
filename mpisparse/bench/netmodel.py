"""Exchange models of nodes with several ranks: which bytes cross a host's NIC, and how long a collective takes.

Pure functions.  ``W`` ranks sit on ``H = W / G`` hosts, ``G`` consecutive ranks a host (``--ranks-per-host``;
rank ``r`` on host ``r // G``).  A host has one NIC (:class:`~mpisparse.bench.costmodel.Link` ``nic``: its
bandwidth each way, per host) and its ranks reach each other over an intra-host link (``intra``: NVLink, PCIe,
shared memory; its bandwidth each way, per rank).  A collective runs in rounds; in a round each rank sends some
bytes to a partner, and the round takes as long as its busiest link: a NIC carries the bytes of every rank of
its host whose partner is on another host, an intra-host link one rank's bytes
(:func:`round_seconds`).  Latency is counted apart, per collective, as the cost model counts it
(:mod:`mpisparse.bench.costmodel`), at the NIC's latency when the collective crosses hosts.

Three ways to run a scheme's exchange (:class:`Topology`, :func:`collective`):

``flat``
    every collective on all ``W`` ranks, as MPI runs it for the messages at hand:

    * ``allreduce``: MPICH's reduce-scatter by recursive halving, then allgather by recursive doubling
      (Rabenseifner; its choice for long messages at a power-of-two ``W``): the partner at distance ``d = 1,
      2, 4, ...`` gets ``m / (2 d)``, so the large halves stay inside a host and every rank of a host crosses
      its NIC only at ``d >= G`` (:func:`cross_ranks`): ``2 (H-1)/H m`` leave each host, the least any
      allreduce can send (measured so on 2 emulated hosts of 2 ranks: ``docs/results/hierarchical.md``).
      Another ``W``: a ring (below).
    * ``allgatherv`` and the allgather half of a large Bcast: a ring (``r`` sends to ``r + 1``): in each of its
      ``W - 1`` rounds one block leaves each host (its last rank's), whatever ``G`` is (:func:`ring_nic_bytes`).
    * ``alltoallv`` (the 16-bit sum's reduce-scatter, oktopk's split): every rank sends ``m / W`` to every
      other, at once: ``G (W - G) m / W`` bytes leave each host.
    * ``bcast``: short (< 12 KiB), a binomial tree; long, a binomial scatter then the ring.
    * ``pairwise`` (gtopk's rounds): partner ``r XOR 2^j``, ``s`` bytes each way.

``two-level`` (``--hierarchical``)
    :mod:`mpisparse.mpi.hierarchy`'s ``allreduce``, ``bcast`` and ``allgatherv``: within the host to its leader
    (Reduce, Gatherv), among the ``H`` leaders (one rank a host: the flat forms at ``G = 1``), back within the
    host (Bcast).  Its other calls (alltoallv, pairwise) stay flat, as the code runs them.

``nccl`` (the dense baseline on a GPU cluster, :func:`nccl_allreduce`)
    NCCL's allreduce across nodes of several GPUs: a ring reduce-scatter within the node (each GPU ends with a
    ``1/G`` shard), an allreduce of its shard across the nodes (``G`` rings at once, one per local GPU, sharing
    the node's NIC: ``2 (H-1)/H m`` bytes through it), a ring allgather within the node.

With one rank a host (``G = 1``) the flat forms are the cost model's (:func:`mpisparse.bench.costmodel.predict`,
validated on the emulated cluster), term for term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .costmodel import BCAST_SHORT_BYTES, Link

__all__ = ["EXCHANGES", "Topology", "collective", "cross_ranks", "halving_doubling_nic_bytes", "nccl_allreduce",
           "ring_nic_bytes", "round_seconds"]

#: the ways an exchange can run (:class:`Topology`)
EXCHANGES = ("flat", "two-level", "nccl")


@dataclass(frozen=True)
class Topology:
    """``world`` ranks, ``ranks_per_host`` consecutive ranks a host, each host's ``nic``, each rank's ``intra``
    link to its host's other ranks (needed when ``ranks_per_host`` > 1), collectives ``hierarchical`` or flat."""

    world: int
    ranks_per_host: int
    nic: Link
    intra: Link | None = None
    hierarchical: bool = False

    def __post_init__(self) -> None:
        if self.world < 1 or self.ranks_per_host < 1 or self.world % self.ranks_per_host:
            raise ValueError(f"W = {self.world} with {self.ranks_per_host} ranks a host; W must be a positive "
                             "multiple of the ranks per host")
        if self.ranks_per_host > 1 and self.intra is None:
            raise ValueError(f"{self.ranks_per_host} ranks a host need an intra-host link (intra)")

    @property
    def hosts(self) -> int:
        return self.world // self.ranks_per_host

    def sub(self, world: int, ranks_per_host: int) -> "Topology":
        """The same links over another group of ranks (the leaders: one a host; a host: all of one host)."""
        return Topology(world, ranks_per_host, self.nic, self.intra if ranks_per_host > 1 or world > 1 else None)

    @property
    def latency(self) -> float:
        """A message's latency: the NIC's when the ranks span hosts, else the intra-host link's."""
        return self.nic.latency if self.hosts > 1 else self.intra.latency  # type: ignore[union-attr]


def _log2(w: int) -> float:
    return math.log2(w) if w > 1 else 0.0


@lru_cache(maxsize=4096)
def cross_ranks(world: int, per_host: int, distance: int) -> int:
    """The most ranks of one host whose partner ``r XOR distance`` is on another host (rank ``r`` on host
    ``r // per_host``; partners outside ``[0, world)`` do not count): how many messages a round of a
    recursive-halving, recursive-doubling or pairwise pattern puts on the busiest NIC."""
    worst = 0
    for h in range(world // per_host):
        ranks = range(h * per_host, (h + 1) * per_host)
        worst = max(worst, sum(1 for r in ranks if (r ^ distance) < world and (r ^ distance) // per_host != h))
    return worst


def round_seconds(t: Topology, nbytes: float, crossing: int) -> float:
    """Bandwidth seconds of one round in which every rank sends ``nbytes`` and ``crossing`` ranks of the busiest
    host send theirs across its NIC (the others inside the host): the NIC carries ``crossing x nbytes``, an
    intra-host link ``nbytes``."""
    if nbytes <= 0:
        return 0.0
    nic = crossing * nbytes / t.nic.bandwidth if crossing else 0.0
    inside = nbytes / t.intra.bandwidth if crossing < t.ranks_per_host and t.intra is not None else 0.0
    return max(nic, inside)


def ring_nic_bytes(world: int, per_host: int, block: float, rounds: int | None = None) -> float:
    """Bytes that leave one host's NIC in a ring of ``rounds`` rounds (default ``W - 1``: an allgather) in which
    rank ``r`` sends a ``block`` to ``r + 1``: one block a round (its last rank's), none on one host."""
    rounds = world - 1 if rounds is None else rounds
    return 0.0 if world // per_host <= 1 else rounds * block


def halving_doubling_nic_bytes(world: int, per_host: int, nbytes: float) -> float:
    """Bytes that leave one host's NIC in MPICH's recursive-halving reduce-scatter and recursive-doubling
    allgather of ``nbytes`` (a power-of-two ``world``): at distance ``d`` each rank sends ``nbytes / (2 d)``, and
    :func:`cross_ranks` of them cross."""
    total, d = 0.0, 1
    while d < world:
        total += 2 * cross_ranks(world, per_host, d) * nbytes / (2 * d)
        d *= 2
    return total


def _ring(t: Topology, block: float, rounds: int) -> float:
    """Bandwidth seconds of ``rounds`` ring rounds of ``block`` bytes a rank (one block crosses each NIC)."""
    crossing = 1 if t.hosts > 1 else 0
    return rounds * round_seconds(t, block, crossing)


def _is_pow2(w: int) -> bool:
    return w >= 1 and w & (w - 1) == 0


def _distances(world: int) -> tuple[list[int], float]:
    """The partner distances ``1, 2, 4, ... < W`` of a tree or pairwise pattern, and the weight of each round:
    ``log2(W) / rounds`` (1 at a power-of-two ``W``; elsewhere the cost model's ``log2(W)`` rounds, spread over
    the distances)."""
    ds = [1 << j for j in range(max(0, (world - 1).bit_length()))]
    return ds, (_log2(world) / len(ds) if ds else 0.0)


def _allreduce(t: Topology, m: float) -> float:
    W, lg = t.world, _log2(t.world)
    if W == 1:
        return 0.0
    lat = 2 * lg * t.latency
    if not _is_pow2(W):  # a ring reduce-scatter and allgather
        return lat + _ring(t, m / W, 2 * (W - 1))
    bw, d = 0.0, 1
    while d < W:
        bw += 2 * round_seconds(t, m / (2 * d), cross_ranks(W, t.ranks_per_host, d))
        d *= 2
    return lat + bw


def _allgatherv(t: Topology, block: float) -> float:
    W = t.world
    return 0.0 if W == 1 else _log2(W) * t.latency + _ring(t, block, W - 1)


def _alltoallv(t: Topology, m: float) -> float:
    """Every rank sends ``m / W`` bytes to each other rank, all at once."""
    W, G = t.world, t.ranks_per_host
    if W == 1:
        return 0.0
    nic = G * (W - G) * m / W / t.nic.bandwidth if t.hosts > 1 else 0.0
    inside = (G - 1) * m / W / t.intra.bandwidth if G > 1 else 0.0  # type: ignore[union-attr]
    return _log2(W) * t.latency + max(nic, inside)


def _bcast(t: Topology, m: float) -> float:
    W, G, lg = t.world, t.ranks_per_host, _log2(t.world)
    if W == 1:
        return 0.0
    if m < BCAST_SHORT_BYTES:  # binomial tree: in round j the ranks below 2^j send it 2^j on
        ds, weight = _distances(W)
        return lg * t.latency + weight * sum(round_seconds(t, m, cross_ranks(W, G, d)) for d in ds)
    if _is_pow2(W):  # binomial scatter (the holders, 2d apart, send half of what they hold d on)
        bw, d = 0.0, W // 2
        while d >= 1:
            bw += round_seconds(t, m * d / W, min(cross_ranks(W, G, d), max(1, G // (2 * d))))
            d //= 2
    else:  # (W - 1)/W of it leaves the root, once through a NIC
        bw = round_seconds(t, m * (W - 1) / W, 1 if t.hosts > 1 else 0)
    return 2 * lg * t.latency + bw + _ring(t, m / W, W - 1)


def _pairwise(t: Topology, nbytes: float) -> float:
    ds, weight = _distances(t.world)
    return weight * sum(2 * t.latency + round_seconds(t, nbytes, cross_ranks(t.world, t.ranks_per_host, d))
                        for d in ds)


def _two_level(op: str, t: Topology, m: float) -> float:
    """:mod:`mpisparse.mpi.hierarchy`'s form of ``op``: within the host, among the leaders, within the host."""
    H, G = t.hosts, t.ranks_per_host
    node, leaders = t.sub(G, G), t.sub(H, 1)
    if op == "allreduce":  # Reduce to the leader (reduce-scatter + gather), Allreduce of leaders, Bcast
        reduce = 0.0 if G == 1 else 2 * _log2(G) * node.latency + 2 * (G - 1) / G * m / t.intra.bandwidth  # type: ignore[union-attr]
        return reduce + _allreduce(leaders, m) + _bcast(node, m)
    if op == "bcast":
        return _bcast(leaders, m) + _bcast(node, m)
    if op == "allgatherv":  # m: one rank's block; Gatherv to the leader, Allgatherv of the hosts' blocks, Bcast
        gather = 0.0 if G == 1 else _log2(G) * node.latency + (G - 1) * m / t.intra.bandwidth  # type: ignore[union-attr]
        return gather + _allgatherv(leaders, G * m) + _bcast(node, t.world * m)
    raise ValueError(f"collective {op!r} has no two-level form; allowed: allreduce, bcast, allgatherv")


_FLAT = {"allreduce": _allreduce, "allgatherv": _allgatherv, "alltoallv": _alltoallv, "bcast": _bcast,
         "pairwise": _pairwise}


def collective(op: str, t: Topology, m: float) -> float:
    """Seconds of one collective on ``t``: ``allreduce`` and ``bcast`` of ``m`` bytes, ``allgatherv`` of ``m``
    bytes a rank, ``alltoallv`` of ``m`` bytes a rank (``m / W`` to each), ``pairwise`` (gtopk's rounds) of ``m``
    bytes each way a round.  Two-level where ``t.hierarchical`` and the op has that form, else flat."""
    if op not in _FLAT:
        raise ValueError(f"collective {op!r}; allowed: {', '.join(_FLAT)}")
    if t.hierarchical and op in ("allreduce", "bcast", "allgatherv") and t.world > 1:
        return _two_level(op, t, m)
    return _FLAT[op](t, m)


def nccl_allreduce(t: Topology, m: float) -> float:
    """Seconds of NCCL's allreduce of ``m`` bytes on ``t`` (the module docstring): ring reduce-scatter in the
    node (``(G-1)/G m`` over the intra link), the shards' allreduce across the ``H`` nodes (``2 (H-1)/H m``
    through each NIC, ``2 (H-1)`` rounds), ring allgather in the node."""
    G, H = t.ranks_per_host, t.hosts
    node = 0.0
    if G > 1:
        node = 2 * ((G - 1) * t.intra.latency + (G - 1) / G * m / t.intra.bandwidth)  # type: ignore[union-attr]
    across = 0.0
    if H > 1:
        across = 2 * (H - 1) * (t.nic.latency + m / H / t.nic.bandwidth)
    return node + across
