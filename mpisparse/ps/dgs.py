"""DGS: Dual-Way Gradient Sparsification with SAMomentum (Yan et al.).

Yan, Xiao, Chen, Zhou, Wu, "Dual-Way Gradient Sparsification for
Asynchronous Distributed Deep Learning" (slides).  Asynchronous parameter
server; ``R`` = ``--density`` (fraction kept per layer on the worker),
``--server-density`` the secondary compression's fraction (unset: none),
``m`` = ``--sam-momentum`` (default: train's ``--momentum``), lowered to
``max(0, m - (1 - 1/K))`` for ``K`` workers unless ``--async-momentum
as-given`` (:func:`.algorithm.async_momentum`: ``K`` asynchronous workers
add about ``1 - 1/K`` of implicit momentum; with ``m = 0.9`` and two
workers the slides' plain form diverges on digits -- as does ASGD).

Worker ``k`` (worker-side algorithm, lines as on the slides):

1. (l.5-6) ``r <- r + eta (grad + lambda w)``;
2. (l.7-13) per layer ``j``: keep the top ``max(1, round(R n_j))`` of
   ``|r[j]|`` (the slides' ``thr <- R% of |r[j]|; Mask <- |r[j]| > thr``,
   as an exact top-k), ``g = r * Mask``;
3. (SAMomentum) sent entries keep ``m r``, unsent ones keep ``r``:
   ``r <- r * (not Mask) + m r * Mask``;
4. (l.14) send ``encode(g)`` as (key, value) pairs;
5. (l.15-16) receive ``G_k`` and apply it: ``theta_k <- theta_k + G_k``.

Steps 1 and 3 are SAMomentum exactly as on the slides, written with the
carried vector ``r = m u``: the slides keep the velocity ``u``, with
``a = m u + eta grad``, ``g = sparsify(a)``, and ``u <- a`` on sent entries,
``u <- a / m`` on unsent ones.  Multiplying by ``m``: ``r = m u`` is ``m a``
on sent and ``a`` on unsent entries, and the next ``a = r + eta grad``.
This form has no ``1/m``: with ``m = 0`` it is the plain residual of
l.6 and l.11 (``r <- r + eta grad``; unsent stays, sent is cleared), and at
density 1 it is heavy-ball momentum SGD pushing the velocity (ASGD's push).
``--no-memory`` drops the unsent part instead.

Server (server-side algorithm):

1. (l.3) on a push from worker ``k``: ``M <- M - g`` (``M`` accumulates
   every applied update; the model is ``w^0 + M``);
2. (l.4) ``G_k = M - v_k`` -- model-difference tracking: what worker ``k``
   has not yet received, however many pushes ago it was made;
3. (l.5-12) with secondary compression: per layer keep the top
   ``max(1, round(s n_j))`` of ``|G_k[j]|``, so the downlink stays sparse
   however many workers there are; the rest stays in ``M - v_k``;
4. (l.13) send ``encode(G_k)`` (without compression: its non-zeros);
5. (l.14) ``v_k <- v_k + G_k`` for what was actually sent (the slides write
   ``v - G`` with the opposite sign convention for ``v``).

At the end every worker gets its whole pending ``M - v_k`` (``DIFF``), then
the model (``MODEL``): the difference between the two, ``final_gap``, shows
that tracking lost nothing (float32 rounding only).  Bytes per
communication: up ``4 min(n, 2 sum_j k_j)``; down the same with the
server's ``k_j`` (secondary compression) or ``4 min(n, 2 nnz(G_k))``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .algorithm import (ServerAlgorithm, async_momentum, WorkerAlgorithm, layer_pieces, layerwise_topk, push_sparse,
                        scaled_gradient, single_push)
from .protocol import DIFF, MODEL, PULL, PUSH, Part, ProtocolError, decode_into, encode


def sam_momentum(ctx) -> float:
    """SAMomentum's ``m``: ``--sam-momentum`` (default train's ``--momentum``), lowered for asynchrony."""
    m = ctx.opts.get("sam_momentum")
    m = float(ctx.momentum if m is None else m)
    return async_momentum(m, ctx.workers, ctx.opts.get("async_momentum", "compensated"))


class DGSWorker(WorkerAlgorithm):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.m = sam_momentum(ctx)
        self.r = np.zeros(self.n, dtype=np.float32)
        self._step = np.zeros(self.n, dtype=np.float32)
        self._pieces = layer_pieces(ctx.layout)

    def make_push(self, w, g):
        c = self.ctx
        with self.phase("compensate"):
            scaled_gradient(g, w, c.lr, c.weight_decay, out=self._step)
            self.r += self._step  # step 1
        with self.phase("select"):
            keys = layerwise_topk(self.r, self._pieces, c.density)  # step 2
            bundles = push_sparse(PUSH, keys, self.r, self.shards)  # step 4 (values copied)
        with self.phase("compensate"):  # step 3: SAMomentum
            if c.memory:
                self.r[keys] *= np.float32(self.m)
            else:
                kept = np.float32(self.m) * self.r[keys]
                self.r.fill(0)
                self.r[keys] = kept
        self.last_pushed = int(keys.size)
        return bundles

    def on_reply(self, w, replies) -> None:
        with self.phase("update"):  # step 5
            for sh, parts in zip(self.shards, replies):
                if parts[-1].kind != PULL:
                    raise ProtocolError(f"dgs: server {sh.index} answered {parts[-1].name}")
                decode_into(w[sh.lo:sh.hi], parts[-1], mode="add")

    def on_final(self, w, replies) -> dict[str, float]:
        gap = 0.0
        for sh, parts in zip(self.shards, replies):
            if [p.kind for p in parts] != [DIFF, MODEL]:
                raise ProtocolError(f"dgs: final bundle of server {sh.index} is {[p.name for p in parts]}")
            ws = w[sh.lo:sh.hi]
            decode_into(ws, parts[0], mode="add")
            decode_into(ws, parts[1], mode="sub")  # ws = (w + G) - model
            gap = max(gap, float(np.max(np.abs(ws))) if ws.size else 0.0)
            decode_into(ws, parts[1])
        return {"final_gap": gap}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "r": self.r.copy()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.r[...] = state["r"]


class DGSServer(ServerAlgorithm):
    def __init__(self, ctx, w0):
        super().__init__(ctx, w0)
        self.M = np.zeros(self.n, dtype=np.float32)
        self.v = np.zeros((ctx.workers, self.n), dtype=np.float32)
        self.s = ctx.opts.get("server_density")
        self._pieces = ctx.shard.local_pieces()
        self._G = np.zeros(self.n, dtype=np.float32)

    def receive(self, worker, parts):
        return single_push("dgs", worker, parts, self.n)

    def apply(self, pushes):
        for _, part in pushes:
            decode_into(self.M, part, mode="sub")  # step 1

    def _difference(self, worker: int, kind: int, compress: bool) -> Part:
        np.subtract(self.M, self.v[worker], out=self._G)  # step 2
        if compress and self.s is not None:
            keys = layerwise_topk(self._G, self._pieces, float(self.s))  # step 3
        else:
            keys = np.flatnonzero(self._G)
        vals = self._G[keys]
        self.v[worker][keys] += vals  # step 5
        return encode(kind, keys, vals, self.n)  # step 4

    def reply(self, worker):
        return [self._difference(worker, PULL, compress=True)]

    def model(self) -> np.ndarray:
        return self.w + self.M

    def final_parts(self, worker):
        return [self._difference(worker, DIFF, compress=False), Part(MODEL, values=self.model())]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "M": self.M.copy(), "v": self.v.copy()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.M[...] = state["M"]
        self.v[...] = state["v"]
