"""Slim-DP: light-communication data parallelism (Sun et al., Algorithm 1, Sec. 3.2-3.5).

Sun, Chen, Bian, Liu, Liu, "Slim-DP: A Light Communication Data
Parallelism for DNN", AAAI 2018.  Synchronous, as evaluated in the paper.
Hyperparameters: ``alpha`` = ``--density`` (the communication set's
fraction), ``beta`` = ``--core`` (the core's fraction, ``0 <= beta <=
alpha``; default ``alpha / 2``, the paper's settings), ``p`` =
``--local-steps``, ``q`` = ``--core-every``, ``c`` = ``--significance-c``.

Per shard of ``n`` elements the core holds ``C = round(beta n)`` keys and
the explorer ``E = max(1, round(alpha n)) - C`` (so ``C + E`` is the
communication set ``T_C``).

Worker ``k`` (Alg. 1, local worker):

1. (l.1) ``w_k^0 <- Pull(w^0)``, with the initial core's keys (cached);
2. (l.3, step 1 *LocalTrain*) ``p`` minibatch steps of the front end's
   SGD; ``delta_k = w_k - w_k^sync``;
3. (l.4, step 2 *Exploration*) draw ``T_R^k``: ``E`` keys uniformly among
   the non-core keys, afresh at every communication, from this worker's
   own generator (seeded by ``(seed, worker)``);
4. (l.5-8, step 3 *Push*) at communication ``t`` with ``(t+1) % q == 0``
   push all of ``delta_k`` (``PUSH_FULL``: ``n`` values, plus the explorer
   keys so the server knows ``T_C``), else ``T_C(delta_k)``: the ``C``
   core values (keys cached on both sides: values only) then the ``E``
   explorer (key, value) pairs;
5. (l.9, step 4 *Pull*) receive ``T_C(w)``: core values, explorer pairs;
6. (l.10, step 5 *Merge*) overwrite the local model at ``T_C`` with the
   pulled values; elsewhere the local model keeps its own values (what it
   learned there was not pushed and is not kept anywhere else);
   ``w_k^sync = w_k``.

Server (Alg. 1, parameter server):

1. ``w^0`` is the model every rank built from the seed; the initial core
   is the top ``C`` of ``|w^0|`` (no gradient exists yet);
2. (l.3, step 3 *Update*) once every active worker has pushed:
   ``w <- w + (1/K_r) sum_k T_C(delta_k)`` in worker order (entries a
   worker did not push count as 0; a full push is applied on ``T_C``
   only, as the algorithm box says);
3. (l.4) ``t <- t + 1``;
4. (l.5-6, step 6 *Core-Selection*) if ``t % q == 0``: significance
   ``S_i = |w_i| + c |g_i|`` (eq. 1) with ``g`` the mean of the full pushes
   just received (an old gradient, as the paper says), the new core the
   top ``C`` of ``S``; with ``c`` unset, ``c = mean|w| / mean|g|`` puts the
   two terms on the same scale;
5. answer each worker with ``T_C(w)`` for the set it pushed (the core of
   this round and its explorer), preceded by the new core's keys when the
   core changed (the key cache is refreshed only then).

Bytes per communication and direction: ``C`` core values + ``2E`` for
the explorer pairs = ``(2 alpha - beta) n`` values (Sec. 3.5), except a
full push (``n`` values + ``E`` keys up) and an answer that carries new
core keys (``+ C``).  ``alpha = beta = 1`` sends ``n`` values each way and
computes exactly what Plump-DP computes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..registry import k_for
from .algorithm import ServerAlgorithm, WorkerAlgorithm
from .plumpdp import average_into
from .protocol import CORE, KEY_DTYPE, MODEL, PULL, PUSH, PUSH_FULL, Part, ProtocolError, decode_into
from .roles import Shard

DEFAULT_CORE_EVERY = 20


# --------------------------------------------------------------------------- pure math
def comm_set_sizes(n: int, alpha: float, beta: float) -> tuple[int, int]:
    """``(C, E)``: core and explorer sizes of an ``n``-element shard."""
    if not 0.0 <= beta <= alpha <= 1.0:
        raise ValueError(f"--core is {beta!r}; allowed range is [0, --density = {alpha!r}]")
    total = k_for(alpha, n)
    core = min(total, int(round(beta * n)))
    return core, total - core


def auto_c(w: np.ndarray, g: np.ndarray) -> float:
    """The ``c`` of eq. 1 that gives ``|w|`` and ``c |g|`` the same mean."""
    mg = float(np.mean(np.abs(g), dtype=np.float64))
    return float(np.mean(np.abs(w), dtype=np.float64)) / mg if mg > 0 else 0.0


def significance(w: np.ndarray, g: np.ndarray | None, c: float | None) -> np.ndarray:
    """Eq. 1: ``S_i = |w_i| + c |g_i|`` (``|w_i|`` alone without a gradient)."""
    s = np.abs(w).astype(np.float32)
    if g is not None:
        cc = auto_c(w, g) if c is None else float(c)
        if cc:
            s += np.float32(cc) * np.abs(g)
    return s


def select_core(w: np.ndarray, g: np.ndarray | None, size: int, c: float | None) -> np.ndarray:
    """Core-Selection: sorted keys of the ``size`` most significant entries."""
    keys = backend.topk_abs(significance(w, g, c), size).astype(KEY_DTYPE)
    keys.sort()
    return keys


def complement(n: int, keys: np.ndarray) -> np.ndarray:
    """Sorted keys of ``range(n)`` not in ``keys``."""
    mask = np.ones(n, dtype=bool)
    mask[keys] = False
    return np.flatnonzero(mask).astype(KEY_DTYPE)


def sample_explorer(outside: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Exploration: ``size`` distinct keys drawn uniformly from the sorted non-core keys ``outside``.

    Sorted.  A large draw (more than 1/8 of ``outside``) keeps each key with a
    probability a little above ``size / len(outside)`` (one pass of float32
    uniforms) and then drops the surplus uniformly at random: still a uniform
    ``size``-subset, several times faster than a partial shuffle of the keys.
    """
    m = outside.size
    if size * 8 <= m or m < (1 << 16):
        return outside[backend.randomk(m, size, rng)]
    p = min(1.0, size / m + 6.0 * math.sqrt(size) / m)
    while True:
        cand = np.flatnonzero(rng.random(m, dtype=np.float32) < np.float32(p))
        if cand.size >= size:
            break
        p = min(1.0, 1.5 * p)  # a rare shortfall (6 sigma): draw again with more room
    if cand.size > size:
        cand = np.delete(cand, rng.choice(cand.size, cand.size - size, replace=False))
    return outside[cand]


def bytes_per_direction(shards: list[Shard], alpha: float, beta: float) -> int:
    """Sec. 3.5: ``sum_shards 4 (C + 2E)``, i.e. ``(2 alpha - beta) n`` float32 values."""
    total = 0
    for sh in shards:
        c, e = comm_set_sizes(sh.n, alpha, beta)
        total += 4 * (c + 2 * e)
    return total


def _beta(ctx) -> float:
    b = ctx.opts.get("core")
    return ctx.density / 2 if b is None else float(b)


# --------------------------------------------------------------------------- worker
class SlimDPWorker(WorkerAlgorithm):
    local_optimizer = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.alpha, self.beta = ctx.density, _beta(ctx)
        self.p = int(ctx.opts.get("local_steps") or 1)
        self.q = int(ctx.opts.get("core_every") or DEFAULT_CORE_EVERY)
        self.sizes = [comm_set_sizes(sh.n, self.alpha, self.beta) for sh in self.shards]
        self.rng = np.random.default_rng([int(ctx.seed), 3, int(ctx.worker)])
        self.core: list[np.ndarray] = [np.empty(0, KEY_DTYPE) for _ in self.shards]
        self.outside: list[np.ndarray] = [np.empty(0, KEY_DTYPE) for _ in self.shards]
        self.explorer: list[np.ndarray] = [np.empty(0, KEY_DTYPE) for _ in self.shards]
        self.local_steps = 0
        self.w_sync = np.zeros(self.n, dtype=np.float32)
        self._delta = np.zeros(self.n, dtype=np.float32)

    def _set_core(self, s: int, keys: np.ndarray) -> None:
        if keys.size != self.sizes[s][0]:
            raise ProtocolError(f"slimdp: server {s} sent {keys.size} core keys, expected {self.sizes[s][0]}")
        self.core[s] = keys.copy()
        self.outside[s] = complement(self.shards[s].n, keys)

    def on_init(self, w, replies) -> None:  # step 1
        for s, (sh, parts) in enumerate(zip(self.shards, replies)):
            if [p.kind for p in parts] != [CORE, MODEL]:
                raise ProtocolError(f"slimdp: server {s} started with {[p.name for p in parts]}")
            self._set_core(s, parts[0].keys)
            decode_into(w[sh.lo:sh.hi], parts[1])
        self.w_sync[...] = w

    def due(self) -> bool:
        self.local_steps += 1
        return self.local_steps % self.p == 0

    def full_push_now(self) -> bool:
        return (self.communications + 1) % self.q == 0

    def make_push(self, w, g):
        full = self.full_push_now()
        bundles = []
        with self.phase("select"):
            if full:
                np.subtract(w, self.w_sync, out=self._delta)  # step 2: delta_k, all of it
            for s, sh in enumerate(self.shards):
                expl = sample_explorer(self.outside[s], self.sizes[s][1], self.rng)  # step 3
                self.explorer[s] = expl
                if full:  # step 4
                    bundles.append([Part(PUSH_FULL, keys=expl, values=self._delta[sh.lo:sh.hi])])
                else:  # step 2 on T_C only: the same values, without a pass over all of w
                    keys = np.concatenate((self.core[s], expl))
                    ws, ss = w[sh.lo:sh.hi], self.w_sync[sh.lo:sh.hi]
                    bundles.append([Part(PUSH, keys=expl, values=ws[keys] - ss[keys])])
        self.last_pushed = self.n if full else sum(c + e for c, e in self.sizes)
        return bundles

    def on_reply(self, w, replies) -> None:
        with self.phase("update"):
            new_core: dict[int, np.ndarray] = {}
            for s, (sh, parts) in enumerate(zip(self.shards, replies)):
                for part in parts:
                    if part.kind == CORE:
                        new_core[s] = part.keys
                    elif part.kind == PULL:  # steps 5-6: merge T_C(w) into the local model
                        core, expl = self.core[s], self.explorer[s]
                        if not np.array_equal(part.keys, expl) or part.values.size != core.size + expl.size:
                            raise ProtocolError(f"slimdp: server {s} answered for another communication set")
                        ws = w[sh.lo:sh.hi]
                        ws[core] = part.values[:core.size]
                        ws[expl] = part.values[core.size:]
                    else:
                        raise ProtocolError(f"slimdp: unexpected {part.name} from server {s}")
            for s, keys in new_core.items():
                self._set_core(s, keys)
            self.w_sync[...] = w

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "local_steps": self.local_steps, "w_sync": self.w_sync.copy(),
                "core": [c.copy() for c in self.core], "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.local_steps = int(state["local_steps"])
        self.w_sync[...] = state["w_sync"]
        for s, keys in enumerate(state["core"]):
            self._set_core(s, np.asarray(keys, dtype=KEY_DTYPE))
        self.rng.bit_generator.state = state["rng"]


# --------------------------------------------------------------------------- server
class SlimDPServer(ServerAlgorithm):
    def __init__(self, ctx, w0):
        super().__init__(ctx, w0)
        self.alpha, self.beta = ctx.density, _beta(ctx)
        self.q = int(ctx.opts.get("core_every") or DEFAULT_CORE_EVERY)
        self.c = ctx.opts.get("significance_c")
        self.C, self.E = comm_set_sizes(self.n, self.alpha, self.beta)
        self.core = select_core(self.w, None, self.C, self.c)  # step 1
        self.t = 0
        self._acc = np.zeros(self.n, dtype=np.float32)
        self._gsum = np.zeros(self.n, dtype=np.float32)
        self._gcount = 0
        self._round_core = self.core
        self._round_explorer: dict[int, np.ndarray] = {}
        self._new_core: np.ndarray | None = None
        #: communications (rounds) after which the core changed
        self.reselections: list[int] = []

    def init_parts(self, worker):
        return [Part(CORE, keys=self.core.copy()), Part(MODEL, values=self.w.copy())]

    def receive(self, worker, parts):
        part = parts[-1]
        expl = part.keys
        if expl.size != self.E:
            raise ProtocolError(f"slimdp: worker {worker} explored {expl.size} keys, expected {self.E}")
        if part.kind == PUSH:
            if part.values.size != self.C + self.E:
                raise ProtocolError(f"slimdp: worker {worker} pushed {part.values.size} values, "
                                    f"expected {self.C + self.E}")
            return expl, part.values[:self.C], part.values[self.C:], None
        if part.kind == PUSH_FULL:
            if part.values.size != self.n:
                raise ProtocolError(f"slimdp: full push of {part.values.size} values, expected {self.n}")
            return expl, part.values[self.core], part.values[expl], part.values
        raise ProtocolError(f"slimdp: worker {worker} sent {part.name}")

    def apply(self, pushes):
        self._acc.fill(0)
        for worker, (expl, core_vals, expl_vals, full) in pushes:  # step 2, worker order
            self._acc[self.core] += core_vals
            self._acc[expl] += expl_vals
            if full is not None:
                self._gsum += full
                self._gcount += 1
        average_into(self.w, self._acc, len(pushes))
        self._round_core = self.core
        self._round_explorer = {w: p[0] for w, p in pushes}
        self._new_core = None
        self.t += 1  # step 3
        if self.t % self.q == 0:  # step 4
            g = self._gsum / np.float32(self._gcount) if self._gcount else None
            new = select_core(self.w, g, self.C, self.c)
            self._gsum.fill(0)
            self._gcount = 0
            if not np.array_equal(new, self.core):
                self.core = new
                self._new_core = new
                self.reselections.append(self.t)

    def reply(self, worker):  # step 5
        expl = self._round_explorer[worker]
        parts = [] if self._new_core is None else [Part(CORE, keys=self._new_core.copy())]
        vals = np.concatenate((self.w[self._round_core], self.w[expl]))
        parts.append(Part(PULL, keys=expl.copy(), values=vals))
        return parts

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "core": self.core.copy(), "t": self.t, "gsum": self._gsum.copy(),
                "gcount": self._gcount, "reselections": list(self.reselections)}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.core = np.asarray(state["core"], dtype=KEY_DTYPE)
        self._round_core = self.core
        self.t = int(state["t"])
        if "gsum" in state:
            self._gsum[...] = state["gsum"]
            self._gcount = int(state["gcount"])
            self.reselections = [int(t) for t in state["reselections"]]
