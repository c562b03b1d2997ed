"""What each parameter-server scheme implements: a worker side and a server side.

The runtime (:mod:`.worker`, :mod:`.server`) moves bundles of
:class:`~.protocol.Part` and times the phases; a scheme only says what goes
into a push, what a server does with it and what it answers.

Worker side (:class:`WorkerAlgorithm`), on the flat parameter vector ``w``
(float32, the model itself: changes to it are changes to the model) and
this minibatch's gradient ``g``:

* ``local_optimizer``: True when the front end steps its own optimizer on
  every minibatch (Slim-DP's *LocalTrain*); False when the scheme turns
  ``g`` into the update itself (ASGD, DGS: ``w`` changes only by pulls);
* :meth:`~WorkerAlgorithm.due`: called once per minibatch, whether to
  communicate now (every ``p`` minibatches for Slim-DP);
* :meth:`~WorkerAlgorithm.make_push` -> one bundle per server;
* :meth:`~WorkerAlgorithm.on_reply`, :meth:`~WorkerAlgorithm.on_init`,
  :meth:`~WorkerAlgorithm.on_final`: apply what the servers answered.

Server side (:class:`ServerAlgorithm`), on its shard: ``receive`` decodes a
push, ``apply`` applies a list of them (one in asynchronous mode, a whole
round in worker order in synchronous mode), ``reply`` answers a worker,
``model`` is the shard as the server holds it.

Shared math (pure functions): :func:`scaled_gradient` (``eta (g + lambda w)``),
:func:`async_momentum` (the workers' momentum under asynchrony)
and :func:`layerwise_topk` (DGS's per-layer threshold keeping the top R %).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import backend
from ..backend.fusion import FusionLayout
from ..registry import k_for
from ..results.timing import PhaseTimer
from .protocol import MODEL, PUSH, Part, ProtocolError, check_shape, decode_into, encode
from .roles import Shard, split_by_shard


@dataclass
class WorkerContext:
    layout: FusionLayout
    shards: list[Shard]
    worker: int          # this worker's index, 0 .. workers-1
    workers: int
    density: float
    opts: dict[str, Any]
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    memory: bool = True
    seed: int = 0
    timer: PhaseTimer = field(default_factory=lambda: PhaseTimer(enabled=False))


@dataclass
class ServerContext:
    layout: FusionLayout
    shard: Shard
    workers: int
    density: float
    opts: dict[str, Any]
    memory: bool = True
    seed: int = 0


def _model_parts(replies: list[list[Part]]) -> list[Part]:
    out = []
    for s, parts in enumerate(replies):
        last = parts[-1]
        if last.kind != MODEL:
            raise ProtocolError(f"server {s} answered {last.name}; expected MODEL")
        out.append(last)
    return out


class WorkerAlgorithm:
    local_optimizer = False

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx
        self.n = ctx.layout.n
        self.shards = ctx.shards
        self.timer = ctx.timer
        self.communications = 0
        #: entries pushed in the last communication (for density_actual)
        self.last_pushed = 0

    def phase(self, name: str):
        return self.timer.phase(name)

    # the model as the servers hold it, written into w
    def load_model(self, w: np.ndarray, replies: list[list[Part]]) -> None:
        for sh, part in zip(self.shards, _model_parts(replies)):
            decode_into(w[sh.lo:sh.hi], part)

    def on_init(self, w: np.ndarray, replies: list[list[Part]]) -> None:
        """``w_k^0 <- Pull(w^0)``: start from the servers' model."""
        self.load_model(w, replies)

    def due(self) -> bool:
        return True

    def make_push(self, w: np.ndarray, g: np.ndarray) -> list[list[Part]]:
        raise NotImplementedError

    def on_reply(self, w: np.ndarray, replies: list[list[Part]]) -> None:
        raise NotImplementedError

    def on_final(self, w: np.ndarray, replies: list[list[Part]]) -> dict[str, float]:
        """The final bundle: the servers' model replaces ``w``."""
        self.load_model(w, replies)
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"communications": self.communications}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.communications = int(state["communications"])


class ServerAlgorithm:
    def __init__(self, ctx: ServerContext, w0: np.ndarray):
        if w0.shape != (ctx.shard.n,):
            raise ValueError(f"server {ctx.shard.index} holds {ctx.shard.n} parameters, got {w0.shape}")
        self.ctx = ctx
        self.n = ctx.shard.n
        self.w = np.array(w0, dtype=np.float32)

    def init_parts(self, worker: int) -> list[Part]:
        return [Part(MODEL, values=self.model().copy())]

    def receive(self, worker: int, parts: list[Part]) -> Any:
        raise NotImplementedError

    def apply(self, pushes: list[tuple[int, Any]]) -> None:
        raise NotImplementedError

    def reply(self, worker: int) -> list[Part]:
        raise NotImplementedError

    def model(self) -> np.ndarray:
        return self.w

    def final_parts(self, worker: int) -> list[Part]:
        return [Part(MODEL, values=self.model().copy())]

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.w[...] = state["w"]


def single_push(scheme: str, worker: int, parts: list[Part], n: int) -> Part:
    """The one PUSH (sparse or dense over the shard's ``n`` entries) a worker sends per round."""
    part = parts[-1]
    if part.kind != PUSH:
        raise ProtocolError(f"{scheme}: worker {worker} sent {part.name}")
    check_shape(part, n)
    return part


# --------------------------------------------------------------------------- shared math
def scaled_gradient(g: np.ndarray, w: np.ndarray, lr: float, weight_decay: float, out: np.ndarray) -> np.ndarray:
    """``out = eta (g + lambda w)``: the SGD step a worker turns into its push."""
    if weight_decay:
        np.multiply(w, np.float32(weight_decay), out=out)
        out += g
    else:
        out[...] = g
    out *= np.float32(lr)
    return out


def async_momentum(m: float, workers: int, rule: str = "compensated") -> float:
    """The momentum a worker of an asynchronous scheme applies (``--async-momentum``).

    ``K`` workers pushing asynchronously into one model act like momentum
    SGD with an implicit momentum of about ``1 - 1/K`` on top of the
    explicit one (Mitliagkas, Zhang, Hadjis, Re, "Asynchrony begets
    momentum, with an application to deep learning", 2016).  With the
    explicit ``m = 0.9`` and ``K = 2`` the total exceeds 1 and training
    diverges; ``compensated`` lowers the explicit momentum by the implicit
    part, ``max(0, m - (1 - 1/K))``, so the total stays near ``m``.  One
    worker is unchanged.  ``as-given`` keeps ``m`` (the DGS slides' and
    ASGD's plain form).
    """
    if rule == "as-given":
        return float(m)
    if rule != "compensated":
        raise ValueError(f"--async-momentum is {rule!r}; allowed values are compensated, as-given")
    return max(0.0, float(m) - (1.0 - 1.0 / max(1, int(workers))))


def layer_k(layout: FusionLayout, density: float) -> np.ndarray:
    """Entries kept per layer: ``k_j = max(1, round(density * n_j))`` (0 for empty layers)."""
    return np.array([k_for(density, s.size) if s.size else 0 for s in layout.layers], dtype=np.int64)


def layerwise_topk(x: np.ndarray, pieces: list[tuple[int, int, int]], density: float) -> np.ndarray:
    """Sorted indices of the top ``k_j = max(1, round(density n_j))`` of ``|x|`` in each piece ``[a, b)``.

    DGS (Yan et al.) worker Alg. l.7-12 and server l.6-11: per layer
    ``thr <- R% of |x[j]|; Mask <- |x[j]| > thr``, kept as an exact top-k so
    the count does not depend on ties.
    """
    idt = backend.index_dtype(x.size)
    out = []
    for _, a, b in pieces:
        size = b - a
        if size == 0:
            continue
        k = k_for(density, size)
        idx = backend.topk_abs(x[a:b], k)
        out.append(idx.astype(idt) + a)
    if not out:
        return np.empty(0, dtype=idt)
    keys = np.concatenate(out)
    keys.sort()
    return keys


def layer_pieces(layout: FusionLayout) -> list[tuple[int, int, int]]:
    return [(j, s.offset, s.end) for j, s in enumerate(layout.layers)]


def push_sparse(kind: int, keys: np.ndarray, vec: np.ndarray, shards: list[Shard]) -> list[list[Part]]:
    """One bundle per shard with ``vec[keys]`` (global sorted ``keys``), sparse or dense."""
    bundles = []
    for sh, sl in zip(shards, split_by_shard(keys, shards)):
        k = keys[sl]
        bundles.append([encode(kind, k - sh.lo, vec[k], sh.n)])
    return bundles
