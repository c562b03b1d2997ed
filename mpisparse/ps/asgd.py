"""ASGD: dense asynchronous SGD on a parameter server, DGS's baseline (Yan et al.).

Yan et al., "Dual-Way Gradient Sparsification for Asynchronous Distributed
Deep Learning" (slides): the ``ASGD`` and ``GD-async`` rows of their
CIFAR-10 / ImageNet tables.  Asynchronous: the server applies each push
when it arrives and answers that worker at once.

Worker ``k`` (momentum ``m`` = train's ``--momentum``, lowered for ``K``
workers by :func:`.algorithm.async_momentum` unless ``--async-momentum
as-given``; learning rate ``eta`` = ``--lr``, weight decay ``lambda``):

1. ``u <- m u + eta (grad + lambda w)`` -- momentum on the worker, so that
   the push is the velocity (DGS at density 1 pushes the same vector);
2. push ``u`` (dense, ``n`` values); with ``--worker-density d < 1``
   (gradient dropping, *GD-async*): ``r <- r + u``, push the top
   ``max(1, round(d n_j))`` of ``|r|`` in each layer ``j`` as (key, value)
   pairs and keep the rest in ``r`` (``--no-memory``: drop it);
3. pull the whole model ``w`` (dense) and continue from it.

Server: ``w <- w - push`` (sparse pushes at their keys), then answer with
``w``.  Bytes per communication: up ``4 n`` (dense) or
``4 min(n, 2 sum_j k_j)``; down ``4 n``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .algorithm import (ServerAlgorithm, async_momentum, WorkerAlgorithm, layer_pieces, layerwise_topk, push_sparse,
                        scaled_gradient, single_push)
from .protocol import PULL, PUSH, Part, ProtocolError, decode_into, is_dense


class ASGDWorker(WorkerAlgorithm):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.m = async_momentum(ctx.momentum, ctx.workers, ctx.opts.get("async_momentum", "compensated"))
        self.d = float(ctx.opts.get("worker_density") or 1.0)
        self.u = np.zeros(self.n, dtype=np.float32)
        self.r = np.zeros(self.n, dtype=np.float32) if self.d < 1.0 else None
        self._step = np.zeros(self.n, dtype=np.float32)
        self._pieces = layer_pieces(ctx.layout)

    def make_push(self, w, g):
        c = self.ctx
        with self.phase("compensate"):  # step 1
            scaled_gradient(g, w, c.lr, c.weight_decay, out=self._step)
            self.u *= np.float32(self.m)
            self.u += self._step
        if self.r is None:  # step 2, dense (the blocking sends finish before u changes)
            self.last_pushed = self.n
            return [[Part(PUSH, values=self.u[sh.lo:sh.hi])] for sh in self.shards]
        with self.phase("compensate"):
            if c.memory:
                self.r += self.u
            else:
                self.r[...] = self.u
        with self.phase("select"):  # step 2, gradient dropping
            keys = layerwise_topk(self.r, self._pieces, self.d)
            bundles = push_sparse(PUSH, keys, self.r, self.shards)
        with self.phase("compensate"):
            self.r[keys] = 0
        self.last_pushed = int(keys.size)
        return bundles

    def on_reply(self, w, replies) -> None:
        with self.phase("update"):  # step 3
            for sh, parts in zip(self.shards, replies):
                if parts[-1].kind != PULL or not is_dense(parts[-1], sh.n):
                    raise ProtocolError(f"asgd: server {sh.index} answered {parts[-1].name}")
                decode_into(w[sh.lo:sh.hi], parts[-1])

    def state_dict(self) -> dict[str, Any]:
        st = {**super().state_dict(), "u": self.u.copy()}
        if self.r is not None:
            st["r"] = self.r.copy()
        return st

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.u[...] = state["u"]
        if self.r is not None:
            self.r[...] = state["r"]


class ASGDServer(ServerAlgorithm):
    def receive(self, worker, parts):
        return single_push("asgd", worker, parts, self.n)

    def apply(self, pushes):
        for _, part in pushes:
            decode_into(self.w, part, mode="sub")

    def reply(self, worker):
        return [Part(PULL, values=self.w.copy())]
