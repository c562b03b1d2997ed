"""Plump-DP: the standard parameter-server data parallelism of Slim-DP's paper (Sun et al., Sec. 2.1).

Sun et al., "Slim-DP: A Light Communication Data Parallelism for DNN",
AAAI 2018, Figure 1 and Sec. 2.1 -- the baseline Slim-DP is measured
against.  Synchronous; ``p`` = ``--local-steps``.

Worker ``k``:

1. *Local training*: ``p`` minibatch steps of the front end's own SGD on
   the local model (the optimizer keeps its momentum); the accumulated
   update is ``delta_k = w_k - w_k^sync``.
2. *Push* ``delta_k`` (dense: ``n`` values).
3. *Pull* the whole global model ``w`` (dense: ``n`` values) and set
   ``w_k = w``, ``w_k^sync = w``.

Server: in each round, once every active worker has pushed,
``w <- w + (1/K_r) sum_k delta_k`` (model averaging over the ``K_r``
workers of the round, summed in worker order), then answer each worker.

With ``p = 1`` and plain SGD this is synchronous SGD on the mean gradient;
with momentum, each worker's velocity sees its own gradients, and as SGD's
momentum is linear the average again equals momentum SGD on the mean
gradient (every worker restarts from the same ``w``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .algorithm import ServerAlgorithm, WorkerAlgorithm
from .protocol import PULL, PUSH, Part, ProtocolError, decode_into, is_dense


def average_into(w: np.ndarray, acc: np.ndarray, count: int) -> None:
    """``w += acc / count``: the round's mean update (Slim-DP's ``Update``)."""
    acc /= np.float32(count)
    w += acc


class PlumpDPWorker(WorkerAlgorithm):
    local_optimizer = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.p = int(ctx.opts.get("local_steps") or 1)
        self.local_steps = 0
        self.w_sync = np.zeros(self.n, dtype=np.float32)
        self._delta = np.zeros(self.n, dtype=np.float32)

    def on_init(self, w, replies) -> None:
        super().on_init(w, replies)
        self.w_sync[...] = w

    def due(self) -> bool:
        self.local_steps += 1
        return self.local_steps % self.p == 0

    def make_push(self, w, g):
        with self.phase("select"):
            np.subtract(w, self.w_sync, out=self._delta)  # step 1: delta_k
        self.last_pushed = self.n
        return [[Part(PUSH, values=self._delta[sh.lo:sh.hi])] for sh in self.shards]  # step 2

    def on_reply(self, w, replies) -> None:
        with self.phase("update"):
            for sh, parts in zip(self.shards, replies):  # step 3
                if parts[-1].kind != PULL or not is_dense(parts[-1], sh.n):
                    raise ProtocolError(f"plumpdp: server {sh.index} answered {parts[-1].name}")
                decode_into(w[sh.lo:sh.hi], parts[-1])
            self.w_sync[...] = w

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "local_steps": self.local_steps, "w_sync": self.w_sync.copy()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.local_steps = int(state["local_steps"])
        self.w_sync[...] = state["w_sync"]


class PlumpDPServer(ServerAlgorithm):
    def __init__(self, ctx, w0):
        super().__init__(ctx, w0)
        self._acc = np.zeros(self.n, dtype=np.float32)

    def receive(self, worker, parts):
        part = parts[-1]
        if part.kind != PUSH or not is_dense(part, self.n):
            raise ProtocolError(f"plumpdp: worker {worker} sent {part.name} with {part.values.size} values; "
                                f"expected a dense PUSH of {self.n}")
        return part.values

    def apply(self, pushes):
        self._acc.fill(0)
        for _, delta in pushes:
            self._acc += delta
        average_into(self.w, self._acc, len(pushes))

    def reply(self, worker):
        return [Part(PULL, values=self.w.copy())]
