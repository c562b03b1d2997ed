"""``dct``: DCT-DP, per-layer top-K threshold refreshed every ``L`` steps.

Gupta et al., "Fast Distributed Training of Deep Neural Networks: Dynamic
Communication Thresholding for Model and Data Parallelism" (Gupta et al.),
Sec. 2.1 and Algorithm 1 (DCT-DP).  Per layer of ``N`` entries, with sparsity
factor ``eta`` (here ``--density``) and threshold life-span ``L``
(``--lifespan``), at iteration ``k``:

1. (l.1) input: the layer's gradient, its error ``E`` and its threshold
   ``tau`` from iteration ``k - 1``;
2. (l.2) error feedback: ``W = W_grad + E``;
3. (l.3-5) if ``L`` divides ``k``: sort ``|W|`` and take as ``tau`` the
   ``floor(N eta)``-th largest magnitude (at least the 1st);
4. (l.6-7) otherwise keep ``tau`` from iteration ``k - 1``;
5. (l.9) mask ``M = I(|W| >= tau)``;
6. (l.10) compressed gradient ``W_hat = W * M``;
7. (l.11) error ``E = W - W_hat``;
8. (l.12) send ``W_hat`` to the parameter server, which updates the model.

Decisions where the paper leaves room:

* **Per rank, per layer.**  "Each worker compresses the gradients layer-wise"
  (Sec. 2.1): every rank computes its own ``tau`` per layer from its own
  error-compensated gradient, so ranks' masks differ and so do their counts.
  Thresholds are never agreed between ranks.
* **Exchange.**  Step 8 pushes each worker's own sparse ``W_hat`` to a
  parameter server that sums them; there is no common mask and no
  all-reduce in the paper.  The collective equivalent is the Allgatherv of
  (index, value) sets of :class:`~.base.SparseGatherScheme` followed by the
  sum on every rank: the aggregate is exactly what the server would apply.
* **Rank of tau.**  ``k_l = floor(N_l eta)`` as in l.5, raised to 1 (a small
  layer still sends its largest entry at recompute steps) and computed with
  a relative guard of 1e-9 against the float product falling just below an
  integer (``0.29 * 100 = 28.999...``).  Empty layers select nothing.
* **Ties.**  The mask is ``>=`` (l.9), so entries tied with ``tau`` are all
  sent: at a recompute step a layer may send more than ``k_l`` entries.
* **Density drift.**  Between recomputations ``tau`` is fixed while ``|W|``
  changes (error feedback makes unsent entries grow), so the achieved
  density drifts; :meth:`selected_global` reports it as measured.
* **Density 1.**  ``k_l = N_l`` makes ``tau`` the smallest ``|W|`` of the
  layer, so every entry is sent at a recompute step (the step equals dense);
  in between, entries below that stored ``tau`` stay in the error.
* **Schedule.**  ``L`` divides 0, so iteration 0 always recomputes; a scheme
  whose thresholds are unknown (fresh, or loaded from a state without them)
  also recomputes.  :attr:`DCT.recomputed` tells whether the last step
  recomputed and :attr:`DCT.recomputed_at` lists every iteration that did.

Sec. 2.2 / Appendix B also estimate a top-K threshold without sorting, from
the mean and variance of a Laplace fit (there for DCT-MP's activations):
:func:`laplace_threshold` and :func:`laplace_fit_threshold` below.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..backend import reference
from .base import SELECT_KERNEL, WIRE_DTYPE, Offer, SchemeOption, SparseGatherScheme, register

#: Relative guard of ``floor(N eta)`` against float products like 28.999...
_FLOOR_GUARD = 1e-9


# --------------------------------------------------------------------------
# pure functions
# --------------------------------------------------------------------------


def layer_rank(size: int, density: float) -> int:
    """Alg. 1 l.5: the rank ``floor(N eta)`` of ``tau`` in a layer, in ``[1, N]``.

    ``0`` for an empty layer.
    """
    size = int(size)
    if size < 0:
        raise ValueError(f"layer size is {size}; it must be >= 0")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density is {density!r}; allowed range is (0, 1]")
    if size == 0:
        return 0
    k = math.floor(size * density * (1.0 + _FLOOR_GUARD))
    return max(1, min(size, k))


def recompute_due(iteration: int, lifespan: int) -> bool:
    """Alg. 1 l.3: whether ``tau`` is recomputed at ``iteration`` (``L`` divides it)."""
    if int(lifespan) < 1:
        raise ValueError(f"lifespan is {lifespan!r}; it must be an integer >= 1")
    if int(iteration) < 0:
        raise ValueError(f"iteration is {iteration!r}; it must be >= 0")
    return int(iteration) % int(lifespan) == 0


def topk_threshold(x, k: int, *, scratch=None, kernel: str = "native") -> float:
    """Alg. 1 l.4-5: the ``k``-th largest ``|x|`` (``inf`` for ``k == 0``).

    Exact (backend top-k, no full sort; ``kernel="sort"``: the paper's
    copy-and-sort, :mod:`mpisparse.backend.reference`); the value is one of
    ``|x|``, so ``|x| >= tau`` keeps at least ``k`` entries (more on ties).
    """
    n = int(x.shape[0])
    k = int(k)
    if not 0 <= k <= n:
        raise ValueError(f"k is {k}; it must be in [0, {n}]")
    if k == 0:
        return math.inf
    xp = backend.array_module(x)
    if k == n:
        return float(xp.abs(x).min())  # an explicit scalar read (a device x: 4-8 bytes)
    return reference.kth_largest_abs(x, k, kernel, scratch=scratch)


def laplace_threshold(mean: float, var: float, kept_fraction: float, *, two_sided: bool = True) -> float:
    """Sec. 2.2: threshold of a Laplace fit that keeps ``kept_fraction`` of the values.

    The values are modelled as ``R ~ Laplace(mu, b)`` with ``mu = mean`` and
    ``b = sqrt(var / 2)`` (a Laplace variable's variance is ``2 b^2``), and
    ``tau`` solves the quantile equation for the target kept fraction ``p``:

    * ``two_sided=True`` (default): ``P(|R| >= tau) = p``, the fraction that
      the mask ``I(|X| >= tau)`` of Algorithms 1 and 2 keeps.  With
      ``m = |mu|``: ``P(|R| >= tau) = exp(-tau/b) cosh(m/b)`` for ``tau >= m``,
      so ``tau = m + b ln((1 + exp(-2m/b)) / (2p))``; for ``tau < m``
      ``P = 1 - exp(-m/b) sinh(tau/b)``, so ``tau = b asinh((1-p) exp(m/b))``.
    * ``two_sided=False``: the paper's literal ``P(R >= tau) = p``, i.e. the
      Laplace quantile function at ``1 - p``:
      ``tau = mu - b ln(2p)`` for ``p <= 1/2``, ``mu + b ln(2(1-p))`` above.

    ``p = 1`` gives ``0`` (two-sided: keep everything) or ``-inf``.  With
    ``var = 0`` every value equals ``mu``: the threshold is ``|mu|``
    (two-sided, keeps all) or ``mu``.
    """
    p = float(kept_fraction)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"kept_fraction is {kept_fraction!r}; allowed range is (0, 1]")
    mu, var = float(mean), float(var)
    if not (math.isfinite(mu) and math.isfinite(var) and var >= 0.0):
        raise ValueError(f"mean {mean!r} and variance {var!r} must be finite, variance >= 0")
    b = math.sqrt(var / 2.0)
    if not two_sided:
        if p == 1.0:
            return -math.inf
        if b == 0.0:
            return mu
        return mu - b * math.log(2.0 * p) if p <= 0.5 else mu + b * math.log(2.0 * (1.0 - p))
    m = abs(mu)
    if p == 1.0:
        return 0.0
    if b == 0.0:
        return m
    e = math.exp(-2.0 * m / b)
    if p <= 0.5 * (1.0 + e):  # tau >= m: both tails beyond +-tau
        return m + b * math.log((1.0 + e) / (2.0 * p))
    # 0 <= tau < m: the mass between -tau and tau (all on mu's side) is dropped
    z = m / b
    if z < 700.0:
        return b * math.asinh((1.0 - p) * math.exp(z))
    return m + b * math.log(2.0 * (1.0 - p))  # asinh(y) = ln(2y) for huge y


def laplace_fit_threshold(x, kept_fraction: float, *, two_sided: bool = True) -> float:
    """:func:`laplace_threshold` from the sample mean and variance of ``x`` (O(n), no sort)."""
    x = np.asarray(x)
    if x.size == 0:
        raise ValueError("cannot fit a Laplace distribution to an empty array")
    mean = float(np.mean(x, dtype=np.float64))
    var = float(np.var(x, dtype=np.float64))
    return laplace_threshold(mean, var, kept_fraction, two_sided=two_sided)


# --------------------------------------------------------------------------
# the scheme
# --------------------------------------------------------------------------


@register("dct")
class DCT(SparseGatherScheme):
    """DCT-DP (Gupta et al., Alg. 1): per-layer ``tau`` every ``L`` steps, hard threshold between.

    State beyond iteration and memory: :attr:`taus` (one per layer, ``None``
    before the first recomputation) and :attr:`recomputed_at`.
    """

    compiled_kernels = ("select", "segments_fused", "segments_select", "scatter_sum")

    options = (
        SchemeOption("lifespan", int, 1000,
                     "dct: threshold life-span L, recompute each layer's top-K threshold when L divides "
                     "the iteration", low=1),
        SELECT_KERNEL,
        WIRE_DTYPE,
    )

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.lifespan: int = int(self.opts["lifespan"])
        self.layer_k = [layer_rank(s.size, self.density) for s in self.layout.layers]
        self.taus: list[float] | None = None
        #: whether the last step recomputed the thresholds
        self.recomputed = False
        #: every iteration at which the thresholds were recomputed
        self.recomputed_at: list[int] = []
        #: entries this rank sent in the last step
        self.local_count = 0
        self._scratch = None

    def compensate_select(self, grad):
        """Between recomputations (tau known): Alg. 1 l.2 and l.9 in one fused pass where possible
        (:func:`mpisparse.backend.fused.compensate_segments_threshold`, the same indices and error; the offer
        is sent whole, so the pass also collects its values and zeroes the error there, Alg. 1 l.11)."""
        from ..backend import fused

        due = self.taus is None or recompute_due(self.iteration, self.lifespan)
        residual = None if due else self.fused_residual(grad)
        if residual is None:
            return super().compensate_select(grad)
        with self.phase("compensate"):
            self.recomputed = False  # Alg. 1 l.7, tau from iteration k - 1
            idx, vals = fused.compensate_segments_threshold(residual, grad, self.layout.offsets, self.layout.sizes,
                                                            self.taus, values=True, clear=self.memory.in_place)
        self.local_count = int(idx.size)
        return Offer(residual, idx, vals, sent=vals is not None)

    def select(self, acc) -> np.ndarray:
        # Alg. 1 l.2 happened in compensate(): acc = W_grad + E_grad
        xp = backend.array_module(acc)
        if self._scratch is None:  # one layer at a time: as long as the largest layer, not the vector
            self._scratch = xp.empty(int(self.layout.sizes.max()), dtype=acc.dtype)
        lay = self.layout
        self.recomputed = self.taus is None or recompute_due(self.iteration, self.lifespan)  # Alg. 1 l.3
        if self.recomputed:
            self.taus = [topk_threshold(lay.view(acc, i), k, scratch=self._scratch[:lay.layers[i].size],  # l.4-5
                                        kernel=self.select_kernel) for i, k in enumerate(self.layer_k)]
            self.recomputed_at.append(self.iteration)
        # else: Alg. 1 l.7, tau from iteration k - 1
        if xp is np:  # Alg. 1 l.9 in every layer: one compiled pass with numba, else the loop below
            from ..backend import fused

            idx = fused.segments_threshold(acc, lay.offsets, lay.sizes, self.taus, scratch=self._scratch)
            self.local_count = int(idx.size)
            return idx
        idt = backend.index_dtype(self.n)
        parts = []
        for i, slot in enumerate(lay.layers):
            if self.layer_k[i] == 0:
                continue
            hit = backend.threshold_select(lay.view(acc, i), self.taus[i],  # Alg. 1 l.9: |W| >= tau
                                           scratch=self._scratch[:slot.size])
            if hit.size:
                parts.append(hit.astype(idt, copy=False) + idt(slot.offset))
        # Alg. 1 l.10-12: the base sends acc[idx] (W_hat) with Allgatherv, sums
        # every rank's set, and memory.update zeroes the sent entries (E = W - W_hat)
        idx = xp.concatenate(parts) if parts else xp.empty(0, idt)
        self.local_count = int(idx.size)
        return idx

    def diagnostics(self) -> dict[str, float]:
        d = super().diagnostics()
        d["tau_recomputed"] = float(self.recomputed)
        # this rank's own density (before the union over ranks) and, for the DCT paper's Fig. 2, the
        # threshold of the largest layer in use at this step; both means over ranks
        big = int(np.argmax(self.layout.sizes)) if len(self.layout) else 0
        tau = 0.0 if not self.taus else float(self.taus[big])
        mine = self.comm.allreduce(np.array([self.local_count / self.n, tau]))
        d["dct_local_density"] = float(mine[0]) / self.comm.size
        d["tau_largest_layer"] = float(mine[1]) / self.comm.size
        return d

    def _extra_state(self) -> dict[str, Any]:
        return {"taus": None if self.taus is None else list(self.taus),
                "recomputed_at": list(self.recomputed_at)}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        taus = extra.get("taus")
        if taus is not None and len(taus) != len(self.layout):
            raise ValueError(f"state holds {len(taus)} thresholds but the layout has {len(self.layout)} layers")
        self.taus = None if taus is None else [float(t) for t in taus]
        self.recomputed_at = [int(i) for i in extra.get("recomputed_at", [])]
