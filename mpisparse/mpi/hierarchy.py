"""Hierarchical exchange: combine within a host first, cross hosts once per host.

:class:`HierarchicalCommunicator` is a :class:`mpisparse.mpi.comm.Communicator`
whose three collectives the schemes exchange with -- ``allreduce``,
``bcast`` and ``allgatherv`` (with ``allgather_counts``) -- run in two
levels:

* ``node``: the ranks of one host (grouped by host name, or by
  ``MPISPARSE_RANKS_PER_HOST`` consecutive ranks to emulate hosts on one
  machine), whose traffic stays in the host's memory;
* ``leaders``: one rank per host (the lowest), the only ranks whose
  traffic crosses the host links.

=============  ================================================================
collective     two levels
=============  ================================================================
allreduce      Reduce to the host's leader; Allreduce among leaders; Bcast in
               the host.  Same sum, different order of the additions (floating
               point: equal to the flat result to rounding, not bit for bit).
bcast          Bcast among leaders from the root's leader (the root sends to
               its leader first when it is not one); Bcast in each host.
               Bit-identical.
allgatherv     Gatherv to the host's leader; Allgatherv of the hosts' blocks
               among leaders; reordered into global rank order; Bcast in the
               host.  Bit-identical, same order as the flat call.
=============  ================================================================

Every other call (point-to-point, Alltoallv, control-plane objects) stays
flat on the whole communicator.  Schemes therefore keep their math; those
that exchange only through the three collectives (dense, topk, cltk, deft,
dct, dgc, randomk, threshold) cross the host links once per host instead of
once per rank.  gTop-k pairs ranks point-to-point in a tree whose merges
decide which values survive; a topology-aware pairing would change its
result, so it stays flat.

Byte accounting: calls are recorded under their usual names with the bytes
this rank sends across hosts (0 on a non-leader), and under ``node_<op>``
with the bytes sent inside the host, so ``bytes_sent`` still counts every
byte and :attr:`cross_host_bytes` counts the ones that leave the host.
"""

from __future__ import annotations

import os

import numpy as np

from .. import backend
from .comm import Communicator, check_dtype, dtype_name

#: environment variable: group ranks into emulated hosts of this many consecutive ranks
RANKS_PER_HOST_ENV = "MPISPARSE_RANKS_PER_HOST"


def host_colors(names: list[str], ranks_per_host: int | None = None) -> list[int]:
    """A host number for every rank: by ``ranks_per_host`` consecutive ranks when given,
    else by host name (numbered in order of first appearance)."""
    if ranks_per_host is not None:
        if ranks_per_host < 1:
            raise ValueError(f"{RANKS_PER_HOST_ENV}={ranks_per_host}; it must be an integer >= 1")
        return [r // ranks_per_host for r in range(len(names))]
    first: dict[str, int] = {}
    return [first.setdefault(n, len(first)) for n in names]


def ranks_per_host_from_env() -> int | None:
    raw = os.environ.get(RANKS_PER_HOST_ENV, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{RANKS_PER_HOST_ENV}={raw!r}; it must be an integer >= 1") from None


class HierarchicalCommunicator(Communicator):
    """Two-level collectives over ``base``'s ranks (see the module docstring).

    Collective over ``base``: every rank constructs it.  ``ranks_per_host``
    overrides the grouping by host name (default: ``MPISPARSE_RANKS_PER_HOST``
    when set); ``hosts`` (a host number per rank, the same on every rank)
    overrides both.
    """

    def __init__(self, base: Communicator, *, ranks_per_host: int | None = None,
                 hosts: list[int] | None = None):
        super().__init__(base.comm, check=base.check, cuda_aware=base.cuda_aware)
        if hosts is None:
            if ranks_per_host is None:
                ranks_per_host = ranks_per_host_from_env()
            names = base.allgather_obj(base.processor_name())
            hosts = host_colors(names, ranks_per_host)
        if len(hosts) != self.size or sorted(set(hosts)) != list(range(max(hosts) + 1)):
            raise ValueError(f"hosts={hosts!r}; allowed: one host number per rank ({self.size}), numbered 0, 1, ...")
        self.hosts = list(hosts)
        self.host = self.hosts[self.rank]
        self.num_hosts = max(self.hosts) + 1
        #: the ranks of each host, in rank order
        self.host_ranks = [[r for r, h in enumerate(self.hosts) if h == c] for c in range(self.num_hosts)]
        self.node = self._sub(self.comm.Split(self.host, self.rank))
        self.leader_of = [ranks[0] for ranks in self.host_ranks]
        self.is_leader = self.rank == self.leader_of[self.host]
        lead = self.comm.Split(0 if self.is_leader else self._MPI.UNDEFINED, self.host)
        self.leaders = self._sub(lead) if self.is_leader else None
        # allgatherv: position of each rank's block in the hosts-major order
        self._host_major = [r for ranks in self.host_ranks for r in ranks]

    def _sub(self, mpi_comm) -> Communicator:
        return Communicator(mpi_comm, check=self.check, cuda_aware=self.cuda_aware)

    # ----------------------------------------------------------- accounting
    @property
    def cross_host_bytes(self) -> int:
        """Bytes this rank sent across hosts (the leaders' level), by the ring/chain byte model."""
        return sum(s.bytes for op, s in self.stats.items() if not op.startswith("node_"))

    def _merge_stats(self, op: str, before_node: dict, before_lead: dict) -> None:
        for level, sub, before in (("node_", self.node, before_node), ("", self.leaders, before_lead)):
            if sub is None:
                continue
            b = sum(s.bytes for s in sub.stats.values()) - before["bytes"]
            t = sum(s.seconds for s in sub.stats.values()) - before["seconds"]
            self._record(level + op, b, t)
        if self.leaders is None:
            self._record(op, 0, 0.0)

    def _snap(self) -> tuple[dict, dict]:
        def one(sub):
            if sub is None:
                return {"bytes": 0, "seconds": 0.0}
            return {"bytes": sum(s.bytes for s in sub.stats.values()),
                    "seconds": sum(s.seconds for s in sub.stats.values())}
        return one(self.node), one(self.leaders)

    # ---------------------------------------------------------- collectives
    def allreduce(self, x, out=None, *, op: str = "sum"):
        check_dtype(x, reduce=True)
        self._agree("allreduce", (int(x.size), dtype_name(x), op), lambda s: f"{s[0]} x {s[1]} ({s[2]})")
        if out is None:
            out = np.empty_like(x) if not backend.is_device_array(x) else x.copy()
        if out is not x:
            out[...] = x
        snap = self._snap()
        if self.node.size > 1:
            self._node_reduce(out, op)
        if self.leaders is not None and self.leaders.size > 1:
            self.leaders.allreduce(out, out, op=op)
        if self.node.size > 1:
            self.node.bcast(out, 0)
        self._merge_stats("allreduce", *snap)
        return out

    def _node_reduce(self, x, op: str) -> None:
        """In-place Reduce of ``x`` to the host's leader (node rank 0); timed and counted on ``node``."""
        mpi_op = {"sum": self._MPI.SUM, "max": self._MPI.MAX, "min": self._MPI.MIN}[op]
        nbytes = int(x.size) * np.dtype(x.dtype).itemsize
        node = self.node
        with node._timed("reduce", 0 if node.rank == 0 else nbytes):
            with node._mpi_buffer(x, write=node.rank == 0) as b:
                if node.rank == 0:
                    node.comm.Reduce(self._MPI.IN_PLACE, b, op=mpi_op, root=0)
                else:
                    node.comm.Reduce(b, None, op=mpi_op, root=0)

    def bcast(self, x, root: int = 0):
        check_dtype(x, reduce=False)
        self._agree("bcast", (int(x.size), dtype_name(x), int(root)), lambda s: f"{s[0]} x {s[1]} from root {s[2]}")
        snap = self._snap()
        root_host = self.hosts[root]
        root_leader = self.leader_of[root_host]
        if root != root_leader and self.host == root_host:  # the root hands the vector to its leader first
            node_root = self.host_ranks[root_host].index(root)
            if self.node.rank == node_root:
                self.node.send(x, 0, tag=31)
            elif self.node.rank == 0:
                self.node.recv(x, node_root, tag=31)
        if self.leaders is not None and self.leaders.size > 1:
            self.leaders.bcast(x, root_host)
        if self.node.size > 1:
            self.node.bcast(x, 0)
        self._merge_stats("bcast", *snap)
        return x

    def allgather_counts(self, count: int) -> np.ndarray:
        """Every rank's ``count``, gathered in two levels like :meth:`allgatherv`."""
        ones = np.ones(self.size, dtype=np.int64)
        return self._allgatherv(np.array([count], dtype=np.int64), ones, "allgather_counts")

    def allgatherv(self, x, counts: np.ndarray | None = None):
        check_dtype(x, reduce=False)
        if counts is None:
            counts = self.allgather_counts(int(x.size))
        elif int(counts[self.rank]) != int(x.size):
            raise ValueError(
                f"allgatherv: this rank passes {x.size} elements but counts[{self.rank}] is {int(counts[self.rank])}")
        self._agree("allgatherv", (dtype_name(x), tuple(int(c) for c in counts)),
                    lambda s: f"dtype {s[0]} with counts {list(s[1])}")
        return self._allgatherv(x, counts, "allgatherv"), counts

    def _allgatherv(self, x, counts, op: str):
        snap = self._snap()
        xp = backend.array_module(x)
        counts = np.asarray(counts)
        total = int(counts.sum())
        # hosts-major order: each host's ranks consecutively, hosts in order
        hm_counts = counts[self._host_major]
        hm = xp.empty(total, dtype=x.dtype)
        hm_offsets = np.concatenate([[0], np.cumsum(hm_counts)])
        host_total = [int(counts[ranks].sum()) for ranks in self.host_ranks]
        host_offset = np.concatenate([[0], np.cumsum(host_total)]).astype(np.int64)
        mine = hm[host_offset[self.host]:host_offset[self.host + 1]]
        if self.node.size > 1:
            self._node_gatherv(x, mine, counts[self.host_ranks[self.host]])
        else:
            mine[...] = x
        if self.leaders is not None and self.leaders.size > 1:
            got, _ = self.leaders.allgatherv(mine, np.asarray(host_total, dtype=counts.dtype))
            hm[...] = got
        if self.node.size > 1:
            self.node.bcast(hm, 0)
        self._merge_stats(op, *snap)
        if self._host_major == list(range(self.size)):
            return hm
        out = xp.empty(total, dtype=x.dtype)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for pos, r in enumerate(self._host_major):
            out[offsets[r]:offsets[r + 1]] = hm[hm_offsets[pos]:hm_offsets[pos + 1]]
        return out

    def _node_gatherv(self, x, into, node_counts) -> None:
        """Gatherv of the host's ranks' ``x`` into ``into`` on the leader; counted on ``node``."""
        node = self.node
        node_counts = np.asarray(node_counts, dtype=np.int64)
        displs = np.concatenate([[0], np.cumsum(node_counts[:-1])]).astype(np.int64)
        nbytes = int(x.size) * np.dtype(x.dtype).itemsize
        with node._timed("gatherv", 0 if node.rank == 0 else nbytes):
            with node._mpi_buffer(x) as s:
                if node.rank == 0:
                    with node._mpi_buffer(into, read=False, write=True) as r:
                        node.comm.Gatherv(s, [r, (node_counts, displs)], root=0)
                else:
                    node.comm.Gatherv(s, None, root=0)
