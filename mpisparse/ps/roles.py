"""Who serves, who trains, and which part of the model each server holds.

With ``W`` ranks and ``S`` servers the *workers* are ranks ``0 .. K-1``
(``K = W - S``) and the *servers* ranks ``K .. W-1``: rank 0 is the first
worker, so the rank that prints and writes the results also trains and
evaluates.  Worker ``k`` is rank ``k``; server ``s`` is rank ``K + s``.

The flat parameter vector (the fusion layout) is cut into ``S`` contiguous
shards, server ``s`` holding ``[lo_s, hi_s)``:

* by range (default): equal sizes, ``lo_s = round(s n / S)``;
* by layer (``--shard-by-layer``): whole layers only, each boundary at the
  layer boundary nearest to ``s n / S`` (every server gets at least one
  layer, so it needs ``S <= layers``).

A shard keeps the pieces of the layers it covers (``pieces``), so a server
can work layer by layer (DGS's per-layer secondary compression) even when a
range boundary cuts a layer in two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend.fusion import FusionLayout


@dataclass(frozen=True)
class Roles:
    """Ranks of the workers and servers in a world of ``world`` ranks."""

    world: int
    servers: int

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ValueError(f"--servers is {self.servers}; allowed range is [1, {max(self.world - 1, 1)}]")
        if self.world - self.servers < 1:
            raise ValueError(
                f"--servers {self.servers} leaves no worker among {self.world} ranks: "
                f"use at least {self.servers + 1} ranks (-n) or at most {max(self.world - 1, 1)} server(s)")

    @property
    def workers(self) -> int:
        return self.world - self.servers

    @property
    def worker_ranks(self) -> list[int]:
        return list(range(self.workers))

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.workers, self.world))

    def is_server(self, rank: int) -> bool:
        return rank >= self.workers

    def server_index(self, rank: int) -> int:
        return rank - self.workers

    def server_rank(self, s: int) -> int:
        return self.workers + s


@dataclass(frozen=True)
class Shard:
    """Server ``index`` (rank ``rank``) holds elements ``[lo, hi)`` of the flat vector.

    ``pieces`` are ``(layer, lo, hi)`` in global coordinates: the part of
    each layer inside the shard, in order.
    """

    index: int
    rank: int
    lo: int
    hi: int
    pieces: tuple[tuple[int, int, int], ...]

    @property
    def n(self) -> int:
        return self.hi - self.lo

    def local_pieces(self) -> list[tuple[int, int, int]]:
        """``pieces`` in shard-local coordinates."""
        return [(j, a - self.lo, b - self.lo) for j, a, b in self.pieces]


def shard_bounds(layout: FusionLayout, servers: int, *, by_layer: bool = False) -> list[int]:
    """The ``servers + 1`` boundaries ``0 = b_0 < ... < b_S = n``."""
    n, S = layout.n, int(servers)
    if S < 1:
        raise ValueError(f"servers is {S}; allowed range is [1, inf)")
    if not by_layer:
        if S > n:
            raise ValueError(f"{S} servers cannot share {n} parameters: at most {n} servers")
        return [int(round(s * n / S)) for s in range(S + 1)]
    ends = [s.end for s in layout.layers if s.size > 0]
    if S > len(ends):
        raise ValueError(f"--shard-by-layer: {len(ends)} non-empty layers cannot be shared by {S} servers; "
                         "shard by range instead (the default)")
    bounds = [0]
    for s in range(1, S):
        target = s * n / S
        # candidate boundaries leave at least one layer before and S - s after
        lo_i = ends.index(bounds[-1]) + 1 if bounds[-1] in ends else 0
        cands = ends[lo_i:len(ends) - (S - s)]
        bounds.append(min(cands, key=lambda e: (abs(e - target), e)))
    bounds.append(n)
    return bounds


def make_shards(layout: FusionLayout, roles: Roles, *, by_layer: bool = False) -> list[Shard]:
    """One :class:`Shard` per server of ``roles``."""
    b = shard_bounds(layout, roles.servers, by_layer=by_layer)
    shards = []
    for s in range(roles.servers):
        lo, hi = b[s], b[s + 1]
        pieces = tuple((j, max(sl.offset, lo), min(sl.end, hi)) for j, sl in enumerate(layout.layers)
                       if sl.size > 0 and sl.offset < hi and sl.end > lo)
        shards.append(Shard(s, roles.server_rank(s), lo, hi, pieces))
    return shards


def split_by_shard(keys: np.ndarray, shards: list[Shard]) -> list[slice]:
    """Slices of the sorted global ``keys`` falling into each shard."""
    cuts = np.searchsorted(keys, [sh.lo for sh in shards] + [shards[-1].hi])
    return [slice(int(cuts[i]), int(cuts[i + 1])) for i in range(len(shards))]
