"""``powersgd``: rank-r power-iteration compression of each layer, with error feedback (PowerSGD).

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", NeurIPS 2019 (Algorithm 1, one
power iteration per step with warm start; Algorithm 2, error feedback).
A peer users choose instead of a sparsifier; it behaves as PyTorch's DDP
communication hook ``powerSGD_hook`` with its ``PowerSGDState`` (the options
carry that state's names), written here from the paper and PyTorch's
documented interface.  Per step, with ``W`` ranks:

0. before ``--start-powersgd-iter`` steps (PyTorch's ``start_powerSGD_iter``):
   one plain Allreduce of the gradient, divided by ``W``; no error feedback;
1. error feedback: ``acc = e + g`` (``--no-memory``: ``acc = g``);
2. every layer is viewed as a matrix ``M`` of ``rows = shape[0]`` by
   ``cols = size / rows`` (a 1-D layer is ``n x 1``, a scalar ``1 x 1``), with
   ``r = min(rows, cols, --matrix-approximation-rank)``; it is compressed only
   when that pays: ``(rows + cols) r * min_compression_rate < rows cols``
   (``--min-compression-rate``, PyTorch's rule).  The other layers
   (biases, small layers) go dense;
3. the dense layers' entries are summed with one Allreduce (all of them in
   one buffer) and divided by ``W``;
4. ``Q`` (``cols x r`` per compressed layer): at the first compressed step
   (and at every step with ``--no-warm-start``) drawn from a standard normal,
   else the previous step's ``Q`` (warm start); orthogonalized either way;
5. ``P = M Q`` for every compressed layer, all ``P`` summed with one
   Allreduce (not divided: it is orthogonalized next);
6. every ``P`` orthogonalized (Gram-Schmidt; ``--orthogonalization-epsilon``
   is added to each column's norm before dividing);
7. ``Q = M^T P``, all ``Q`` summed with one Allreduce and divided by ``W``;
8. output: the dense layers' means and ``P Q^T`` for the compressed layers;
9. memory: ``e = acc - output`` (the whole vector: what this rank wanted
   minus what every rank applied, PyTorch's rule; a dense layer's entries keep
   this rank's difference from the mean, whose sum over ranks is zero).

Decisions and properties:

* **The random start.**  As PyTorch's hook: a ``numpy.random.RandomState``
  seeded with the scheme's ``--seed`` (PyTorch's ``random_seed``) gives one
  integer ``s = randint(1_000_000_000)`` per drawing of the ``Q`` matrices;
  with ``--init-rng torch`` every ``Q`` is then drawn, in layer order, by
  ``torch.randn`` from a CPU generator seeded with ``s``: PyTorch's documented
  behaviour of forking the RNG and seeding it per drawing so that all
  replicas agree (verified by running the hook next to this scheme,
  ``tests/mpi/check_powersgd_torch.py``: equal aggregates from the first
  compressed step on).  The default ``--init-rng numpy`` draws ``Q`` with
  NumPy's generator seeded with the same ``s`` (same distribution, no torch
  import); either way every rank draws the same ``Q`` without exchanging it.
* **Where PyTorch's default differs**: its ``start_powerSGD_iter`` defaults to
  1000 (DDP rebuilds its buckets after step 1); here 0, the paper's algorithm
  from the first step.  ``matrix_approximation_rank`` 1 and
  ``min_compression_rate`` 2 are PyTorch's defaults.  PyTorch compresses per
  DDP bucket; this scheme compresses the whole fusion buffer as one bucket,
  which gives the same per-layer math (buckets only change which layers share
  one Allreduce and, for ``torch`` draws, the order of the random stream).
* **Bytes per rank and step** (ring Allreduce model, 4-byte values): before the
  start iteration ``2 (W-1)/W 4 n``; after it
  ``2 (W-1)/W 4 (n_dense + sum_l (rows_l + cols_l) r_l)``
  (:func:`powersgd_elements`).
* ``density_actual`` is 1: a low-rank update changes every entry; the
  bytes, not the density, show the compression (``--diagnostics`` adds
  ``compression_rate``, elements of the gradient per element sent).
* Mass is conserved: ``W sum_t out_t + sum_r e_r = sum_r sum_t g_r,t`` from the
  first compressed step on (rounding aside).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .. import backend
from .base import CollectiveScheme, SchemeOption, register

_DRAW_HIGH = 1_000_000_000  # the RandomState draws one seed in [0, this) per drawing of Q (PyTorch's rule)


def matrix_shape(shape) -> tuple[int, int]:
    """``(rows, cols)`` of a layer viewed as a matrix: the first dimension by the rest."""
    shape = tuple(int(s) for s in shape)
    if not shape:
        return 1, 1
    rows = shape[0]
    size = math.prod(shape)
    return rows, (size // rows if rows else 0)


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """PyTorch's rule: compress when ``(rows + cols) rank * min_compression_rate < rows cols``."""
    return rows * cols > 0 and (rows + cols) * rank * min_compression_rate < rows * cols


def orthogonalize(m, epsilon: float = 0.0):
    """Gram-Schmidt on the columns of ``m`` (in place); ``epsilon`` is added to each column's norm."""
    xp = backend.array_module(m)
    for j in range(m.shape[1]):
        col = m[:, j]
        if j:
            prev = m[:, :j]
            col -= prev @ (prev.T @ col)
        col /= xp.linalg.norm(col) + m.dtype.type(epsilon)
    return m


class Factor(NamedTuple):
    """A compressed layer: its span of the vector, matrix shape, rank and spans of the P and Q buffers."""

    offset: int
    rows: int
    cols: int
    rank: int
    p_offset: int
    q_offset: int


class Plan(NamedTuple):
    """Which layers go dense (spans ``(start, end)``) and which are factorised."""

    dense: list[tuple[int, int]]
    factors: list[Factor]
    dense_size: int
    p_size: int
    q_size: int


def plan_layers(layout, rank: int, min_compression_rate: float) -> Plan:
    """Step 2 for every layer of ``layout``; adjacent dense layers merge into one span."""
    dense, factors = [], []
    p = q = nd = 0
    for s in layout.layers:
        rows, cols = matrix_shape(s.shape)
        r = min(rows, cols, rank)
        if should_compress(rows, cols, r, min_compression_rate):
            factors.append(Factor(s.offset, rows, cols, r, p, q))
            p += rows * r
            q += cols * r
        elif s.size:
            if dense and dense[-1][1] == s.offset:
                dense[-1] = (dense[-1][0], s.end)
            else:
                dense.append((s.offset, s.end))
            nd += s.size
    return Plan(dense, factors, nd, p, q)


def powersgd_elements(layout, rank: int = 1, min_compression_rate: float = 2.0) -> int:
    """Elements one compressed step allreduces: the dense layers' plus ``(rows + cols) r`` per factor."""
    plan = plan_layers(layout, rank, min_compression_rate)
    return plan.dense_size + plan.p_size + plan.q_size


def draw_q(seed: int, shapes, how: str):
    """The random ``Q`` matrices (float32, in order) of one drawing seeded with ``seed`` (step 4)."""
    if how == "torch":
        import torch

        gen = torch.Generator().manual_seed(int(seed))
        return [torch.randn(*shape, generator=gen, dtype=torch.float32).numpy() for shape in shapes]
    rng = np.random.default_rng(int(seed))
    return [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]


@register("powersgd")
class PowerSGD(CollectiveScheme):
    """PowerSGD (Vogels et al. 2019) as PyTorch's ``powerSGD_hook``: rank-r factors of each layer."""

    options = (
        SchemeOption("matrix_approximation_rank", int, 1,
                     "powersgd: the rank r of each layer's factors P Q^T (PyTorch's matrix_approximation_rank)",
                     low=1),
        SchemeOption("start_powersgd_iter", int, 0,
                     "powersgd: plain Allreduce for this many steps first (PyTorch's start_powerSGD_iter, "
                     "whose default is 1000)", low=0),
        SchemeOption("min_compression_rate", float, 2.0,
                     "powersgd: compress a layer only when (rows + cols) r times this is below rows cols; "
                     "the others go dense (PyTorch's min_compression_rate)", low=0.0),
        SchemeOption("no_warm_start", bool, False,
                     "powersgd: draw a new random Q every step instead of reusing the last (PyTorch's "
                     "warm_start=False)"),
        SchemeOption("orthogonalization_epsilon", float, 0.0,
                     "powersgd: added to each column's norm when orthogonalizing (PyTorch's "
                     "orthogonalization_epsilon)", low=0.0),
        SchemeOption("init_rng", str, "numpy",
                     "powersgd: the generator of the random Q: numpy, or torch (torch.randn: PyTorch's hook's "
                     "values, bit for bit)", choices=("numpy", "torch")),
    )
    wire_refusal = "its factors P and Q are summed as float32"

    @classmethod
    def bucket_reason(cls, options):
        return "its random Q is one stream drawn over all layers, and DDP-style buckets would each draw their own"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        o = self.opts
        self.rank = o["matrix_approximation_rank"]
        self.start_iter = o["start_powersgd_iter"]
        self.warm_start = not o["no_warm_start"]
        self.epsilon = o["orthogonalization_epsilon"]
        self.plan = plan_layers(self.layout, self.rank, o["min_compression_rate"])
        self.draws = 0  # integers drawn from the RandomState so far (its whole state: it is re-drawn on load)
        self._seeds = np.random.RandomState(self.seed)
        self._q = None  # the Q buffer (warm start), made at the first compressed step
        self._p = None

    # -------------------------------------------------------------- pieces
    def _draw_q(self) -> None:
        """Step 4's random start: one seed from the RandomState, then every factor's Q in layer order."""
        s = self._seeds.randint(_DRAW_HIGH)
        self.draws += 1
        shapes = [(f.cols, f.rank) for f in self.plan.factors]
        host = np.empty(self.plan.q_size, dtype=np.float32)
        for f, q in zip(self.plan.factors, draw_q(s, shapes, self.opts["init_rng"])):
            host[f.q_offset:f.q_offset + f.cols * f.rank] = q.reshape(-1)
        self._q = backend.to_module(host, self.xp)

    def _views(self, buf, which: str):
        for f in self.plan.factors:
            if which == "p":
                yield f, buf[f.p_offset:f.p_offset + f.rows * f.rank].reshape(f.rows, f.rank)
            else:
                yield f, buf[f.q_offset:f.q_offset + f.cols * f.rank].reshape(f.cols, f.rank)

    def _matrix(self, acc, f: Factor):
        return acc[f.offset:f.offset + f.rows * f.cols].reshape(f.rows, f.cols)

    def _place_state(self) -> None:
        super()._place_state()
        if self._q is not None:
            self._q = backend.to_module(self._q, self.xp)
        self._p = None

    # -------------------------------------------------------------- the step
    def _step(self, grad):
        comm, xp, plan = self.comm, self.xp, self.plan
        scale = np.float32(1.0 / comm.size)
        if self.iteration < self.start_iter:  # step 0
            out = self.output()
            with self.phase("exchange_values"):
                comm.allreduce(grad, out)
            with self.phase("update"):
                out *= scale
            return out
        with self.phase("compensate"):  # step 1
            acc = self.memory.compensate(grad)
        with self.phase("select"):
            dense = (xp.concatenate([acc[a:b] for a, b in plan.dense]) if plan.dense
                     else xp.empty(0, dtype=np.float32))  # a copy: read before anything is written
            if plan.factors:
                if self._q is None or not self.warm_start:
                    self._draw_q()  # step 4
                for _, q in self._views(self._q, "q"):
                    orthogonalize(q, self.epsilon)
                if self._p is None:
                    self._p = xp.empty(plan.p_size, dtype=np.float32)
                qs = dict(self._views(self._q, "q"))
                for f, p in self._views(self._p, "p"):  # step 5
                    xp.matmul(self._matrix(acc, f), qs[f], out=p)
        with self.phase("exchange_values"):
            if dense.size:  # step 3
                comm.allreduce(dense, dense)
            if plan.factors:
                comm.allreduce(self._p, self._p)
        if plan.factors:
            with self.phase("select"):
                ps = dict(self._views(self._p, "p"))
                for f, q in self._views(self._q, "q"):  # steps 6-7
                    orthogonalize(ps[f], self.epsilon)
                    xp.matmul(self._matrix(acc, f).T, ps[f], out=q)
            with self.phase("exchange_values"):
                comm.allreduce(self._q, self._q)
        with self.phase("update"):
            out = self.output()  # step 8: every entry is written (dense spans and factors cover the vector)
            pos = 0
            for a, b in plan.dense:
                out[a:b] = dense[pos:pos + b - a]
                out[a:b] *= scale
                pos += b - a
            if plan.factors:
                self._q *= scale
                qs = dict(self._views(self._q, "q"))
                for f, p in self._views(self._p, "p"):
                    xp.matmul(p, qs[f].T, out=self._matrix(out, f))
            if acc is not grad:  # step 9 (acc is the residual buffer; without memory it is the gradient)
                acc -= out
        return out

    def selected_global(self) -> int:
        return self.n

    def sent_elements(self) -> int:
        """Elements allreduced by the last step (``n`` before the start iteration)."""
        if self.iteration <= self.start_iter:
            return self.n
        return self.plan.dense_size + self.plan.p_size + self.plan.q_size

    def diagnostics(self) -> dict[str, float]:
        d = super().diagnostics()
        d["compression_rate"] = self.n / max(self.sent_elements(), 1)
        return d

    # -------------------------------------------------------------- state
    def _extra_state(self) -> dict[str, Any]:
        return {"draws": self.draws, "q": None if self._q is None else np.array(backend.to_host(self._q), copy=True)}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self.draws = int(extra.get("draws", 0))
        self._seeds = np.random.RandomState(self.seed)
        for _ in range(self.draws):  # the RandomState where it was: the same integers drawn again
            self._seeds.randint(_DRAW_HIGH)
        q = extra.get("q")
        self._q = None if q is None else backend.to_module(np.array(q, dtype=np.float32, copy=True), self.xp)
        self._p = None
