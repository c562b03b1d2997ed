"""``dgc``: Deep Gradient Compression (Lin et al., ICLR 2018), a peer baseline.

Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the
Communication Bandwidth for Distributed Training", ICLR 2018: Algorithm 1
(gradient sparsification with local accumulation) with the momentum
correction and momentum factor masking of Sec. 3.2 (Appendix, "DGC with
momentum correction"), local gradient clipping (Sec. 3.2), the sampled /
hierarchical threshold selection (Sec. 5) and the exponential sparsity
warm-up (Sec. 3.3).  Not one of the papers this project reproduces: written from the
published algorithm.

One step on rank ``r`` of ``W`` (``t`` = iteration, ``g`` = this rank's
gradient as passed to :meth:`step`)::

    1. k_t = density_schedule(t) * n                 (warm-up, Sec. 3.3)
    2. g   = g * min(1, (C / sqrt(W)) / ||g||)       (local clipping, C = --clip-norm)
    3. u   = m u + g                                 (momentum correction, m = --momentum)
    4. v   = v + u                                   (local accumulation of the velocity)
    5. t0  = sampled estimate of the k_t-th largest |v|   (--sample-fraction of v)
    6. S   = {i : |v_i| >= t}, the threshold adjusted toward k_t (see below)
    7. Allgatherv of every rank's (S, v[S]); out = (1/W) sum_r sparse(S_r, v_r[S_r])
    8. u[S] = 0, v[S] = 0                            (momentum factor masking)

The returned vector is the mean over ranks of the sent part of the
momentum-corrected velocity ``v``: it already contains the momentum, so the
optimizer must apply it with plain SGD, without momentum of its own
(``w <- w - lr * out``); the class advertises this with
``provides_momentum = True``.  Weight decay belongs in ``g`` (before step 3),
not in the optimizer.  At density 1 everything is sent and masked every step,
so ``u`` never carries over and DGC reduces to plain SGD on the mean
gradient (the paper's masking, taken literally).

Decisions where the paper leaves room (all documented in the report):

* Selection is over the whole fusion buffer (one threshold), not per layer
  as in the paper's Algorithm 1; ``--density`` is the fraction of the whole
  vector, as for ``topk``.
* Threshold adjustment (step 6, :func:`refine_selection`): with ``c`` the
  number of entries ``|v| >= t``: if ``c > UPPER * k`` (``UPPER = 1.3``) the
  exact top ``k`` of those ``c`` candidates are taken (the paper's
  hierarchical selection: "a precise threshold is calculated from the
  already-selected gradients"), so exactly ``k`` are sent; if
  ``c < LOWER * k`` (``LOWER = 0.8``) the threshold is halved and the pass
  repeated, at most ``MAX_LOWERINGS = 4`` times, after which the exact top
  ``k`` of ``v`` is taken; otherwise the ``c`` candidates are sent.  A rank
  therefore sends between ``0.8 k`` and ``1.3 k`` entries, and always the
  ones of largest ``|v|``.  ``k >= n`` sends everything.
* The sample (step 5) is ``m = round(f n)`` entries, one in each of ``m``
  equal strata of ``v`` (:func:`~mpisparse.backend.compiled.stratum_positions`:
  a hash of one 64-bit key, drawn from a generator seeded with
  ``(seed, rank, iteration)``, gives each stratum's offset; the paper only
  says it samples 0.1 % to 1 % of the gradients); the threshold is the
  ``round(k m / n)``-th largest sampled magnitude (at least the largest).
  Ascending positions let the fused momentum pass read the sample while its
  block of ``v`` is in cache instead of ``m`` random reads after it, and no
  random number is drawn per entry.  The selection is deterministic given
  (seed, rank, iteration, v), so no RNG state is stored: a restored
  iteration counter restores the sampler.  (A device array keeps its
  kernel's own sample, ``estimate_threshold``.)
* Clipping (step 2) uses this rank's whole-vector L2 norm and the limit
  ``C / sqrt(W)`` (the paper scales the clipping threshold by ``N^-1/2``);
  ``C = 0`` turns it off.
* Warm-up (step 1, :func:`warmup_density`): over the first ``T``
  (``--density-warmup-iters``) iterations the density falls geometrically
  from 0.25 to the target, ``d_t = 0.25 (d / 0.25)^(t / T)`` for ``t < T``,
  then ``d``; never below ``d`` (a target above 0.25 is used as is).  With
  ``T = 4`` and ``d = 0.001`` this is 25 %, 6.3 %, 1.6 %, 0.4 %, then 0.1 %:
  the paper's 4-epoch schedule (25 %, 6.25 %, 1.5625 %, 0.39 %, 0.1 %) with
  one iteration per epoch.
* ``--no-memory``: nothing unsent is kept (``v = u`` each step, no
  masking): local momentum SGD with the top of the velocity sent and the
  rest dropped.  With ``--momentum 0`` that is ``topk --no-memory`` on the
  clipped gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import backend
from ..backend import numpy_select as nk
from .memory import Memory, accumulate, restored, saved
from .base import WIRE_DTYPE, SchemeOption, SparseGatherScheme, k_for, register, scatter_sum

#: More than ``UPPER * k`` candidates: take the exact top k of the candidates.
UPPER = 1.3
#: Fewer than ``LOWER * k`` candidates: lower the threshold.
LOWER = 0.8
#: Factor applied to the threshold per lowering.
LOWERING_FACTOR = 0.5
#: Lowerings before falling back to the exact top k of the whole vector.
MAX_LOWERINGS = 4
#: The fused momentum pass collects ``|v| >= HINT_FACTOR * t`` with ``t`` this step's sampled threshold
#: extrapolated from the last two (their ratio, within [1, 2]: the threshold grows while ``v`` builds up):
#: a superset of this step's first candidates unless the guess was too high.
HINT_FACTOR = 0.9
#: ... into a buffer of ``HINT_CAP * k + 1024`` indices (more: the threshold pass runs instead).
HINT_CAP = 16
#: Density at the first warm-up iteration (the paper's 75 % sparsity).
WARMUP_START_DENSITY = 0.25


# --------------------------------------------------------------------------
# pure functions
# --------------------------------------------------------------------------


def warmup_density(iteration: int, target: float, warmup_iters: int,
                   start: float = WARMUP_START_DENSITY) -> float:
    """Density of step ``iteration`` under the exponential warm-up (Alg. step 1).

    ``start (target / start)^(iteration / warmup_iters)`` while
    ``iteration < warmup_iters``, then ``target``; never below ``target``.
    """
    if warmup_iters <= 0 or iteration >= warmup_iters or target >= start:
        return float(target)
    return max(float(target), start * (target / start) ** (iteration / warmup_iters))


def clip_scale(norm: float, clip_norm: float, world_size: int) -> float:
    """Factor that brings a gradient of L2 norm ``norm`` to at most ``clip_norm / sqrt(W)``.

    1 when clipping is off (``clip_norm == 0``), the norm is within the limit,
    or the norm is 0 or not finite.
    """
    if clip_norm <= 0 or not (norm > 0) or not math.isfinite(norm):
        return 1.0
    limit = clip_norm / math.sqrt(world_size)
    return 1.0 if norm <= limit else limit / norm


def adjust_rule(count: int, k: int) -> str:
    """What the threshold adjustment does with ``count`` candidates for a target ``k``.

    ``"trim"`` (count > UPPER k: exact top k of the candidates), ``"lower"``
    (count < LOWER k: lower the threshold), else ``"accept"``.
    """
    if count > UPPER * k:
        return "trim"
    if count < LOWER * k:
        return "lower"
    return "accept"


@dataclass
class Selection:
    """What one rank selects in one step."""

    indices: Any  # indices into v, of backend.index_dtype(v.size)
    threshold: float  # last threshold tried (0 when everything is sent)
    candidates: int  # entries |v| >= threshold at that threshold
    lowerings: int  # threshold lowerings done
    path: str  # "accept" | "trim" | "topk" (fallback) | "all"
    sampled: float = 0.0  # step 5's threshold, before any lowering (0 when everything is sent)


def refine_selection(v, k: int, threshold: float, *, rng=None, scratch=None, first=None) -> Selection:
    """Adjust a threshold toward ``k`` selected entries of ``|v|`` (Alg. step 6).

    Applies :func:`adjust_rule` repeatedly: accept the candidates
    ``|v| >= t``, trim them to their exact top ``k``, or multiply ``t`` by
    :data:`LOWERING_FACTOR` and try again, at most :data:`MAX_LOWERINGS`
    times; then fall back to the exact top ``k`` of ``v``.  ``first``: the
    candidates ``|v| >= threshold`` (ascending) when already known (the fused
    momentum pass collects them), instead of the first threshold pass.
    """
    n = v.shape[0]
    if k >= n:
        return Selection(backend.array_module(v).arange(n, dtype=backend.index_dtype(n)), 0.0, n, 0, "all")
    t = float(threshold)
    lowerings = 0
    while True:
        if first is not None:
            cand, first = first, None
        else:
            cand = backend.threshold_select(v, t, scratch=scratch)
        c = int(cand.shape[0])
        action = adjust_rule(c, k)
        if action == "accept":
            return Selection(cand, t, c, lowerings, "accept")
        if action == "trim":
            sel = backend.topk_abs(v[cand], k, rng=rng)
            return Selection(cand[sel], t, c, lowerings, "trim")
        if lowerings == MAX_LOWERINGS or not t > 0:  # t NaN or 0: lowering cannot help
            idx = backend.topk_abs(v, k, scratch=scratch, rng=rng)
            return Selection(idx, t, c, lowerings, "topk")
        t *= LOWERING_FACTOR
        lowerings += 1


def sample_size(n: int, sample_fraction: float) -> int:
    """Entries of ``v`` in step 5's sample: ``round(f n)``, within ``[1, n]``."""
    return min(n, max(1, int(round(sample_fraction * n))))


def sample_key(rng) -> int:
    """The key of step 5's sample positions (:func:`~mpisparse.backend.compiled.stratum_positions`): one
    64-bit draw of the step's generator, the only one the sample makes."""
    return int(rng.integers(0, 1 << 64, dtype=np.uint64))


def sampled_threshold(samples, k: int, n: int, hint: float = math.inf) -> float:
    """Step 5's threshold: the ``round(k m / n)``-th largest of the ``m`` sampled magnitudes (at least the
    1st).  ``hint``: speed only: when at least that many samples are not below it, the selection runs
    among those alone (the same value: every larger sample is among them, NaN included)."""
    m = samples.shape[0]
    ks = min(m, max(1, int(round(k * m / n))))
    if hint > 0 and math.isfinite(hint):
        top = samples[~(samples < hint)]
        if top.shape[0] >= ks:
            return float(nk.kth_largest(top, ks))
    return float(nk.kth_largest(samples, ks))


def dgc_select(v, k: int, rng, sample_fraction: float, *, scratch=None, superset=None, samples=None,
               hint: float = math.inf) -> Selection:
    """DGC's selection on ``|v|``: sampled threshold (step 5), then adjusted (step 6).

    Deterministic given ``rng``'s state: the scheme seeds it with
    ``(seed, rank, iteration)``, so a reference can reproduce the selection.
    On the host the sample is ``|v|`` at ``stratum_positions(sample_key(rng), n, sample_size(n, f))``
    (one position in each of ``m`` equal strata); ``samples``: those magnitudes when already read (the
    fused momentum pass reads them; the caller drew the key from ``rng``).  A device array keeps its
    kernel's own sample (``estimate_threshold``).
    ``superset``: ``(t_c, idx)`` or ``(t_c, idx, |v[idx]|)``, the ascending indices of every ``|v| >= t_c``
    (or None), known from the fused momentum pass; when the sampled threshold
    is at least ``t_c`` its candidates are taken from them instead of a pass
    over ``v`` (the same indices); else the compiled threshold pass finds them.
    ``hint``: see :func:`sampled_threshold` (speed only).
    """
    n = v.shape[0]
    if k >= n:
        return refine_selection(v, k, 0.0)
    if isinstance(v, np.ndarray):  # Alg. step 5
        if samples is None:
            from ..backend.compiled import stratum_positions

            samples = np.abs(v[stratum_positions(sample_key(rng), n, sample_size(n, sample_fraction))])
        t0 = sampled_threshold(samples, k, n, hint)
    else:
        t0 = backend.estimate_threshold(v, k, sample=sample_fraction, rng=rng)
    first = None
    if superset is not None:
        from ..backend import fused

        first = fused.narrow(v, superset[1], superset[0], t0, *superset[2:])
        if first is None:  # the guess missed: the compiled threshold pass (threshold_select's indices)
            first = fused.segments_threshold(v, [0], [n], [t0], scratch=scratch)
    sel = refine_selection(v, k, t0, rng=rng, scratch=scratch, first=first)  # Alg. step 6
    sel.sampled = t0
    return sel


def sampler(seed: int, rank: int, iteration: int) -> np.random.Generator:
    """The generator of one rank's step: a pure function of (seed, rank, iteration)."""
    return np.random.default_rng([int(seed), int(rank), int(iteration)])


# --------------------------------------------------------------------------
# memory: momentum correction with momentum factor masking
# --------------------------------------------------------------------------


class MomentumCorrectionMemory(Memory):
    """DGC's memory: the local momentum ``u`` and the accumulated velocity ``v``.

    ``compensate(g)``: ``u = m u + g`` (Alg. step 3), ``v = v + u`` (step 4),
    returns ``v`` (the buffer itself).  ``update(v, sent)``: ``u[sent] = 0``,
    ``v[sent] = 0`` (step 8, momentum factor masking).

    With ``accumulate=False`` (the scheme's ``--no-memory``) ``v`` is ``u``
    and nothing is masked: the unsent velocity is dropped, momentum is kept.
    ``residual`` is ``v`` (what the error norm diagnostic measures).
    """

    buffers = ("u", "v")

    def __init__(self, momentum: float, accumulate: bool = True) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"the DGC momentum is {momentum!r}; allowed range is [0, 1)")
        self.momentum = float(momentum)
        self.accumulate = bool(accumulate)
        self.u = None
        self.v = None

    @property
    def residual(self):
        return self.v if self.accumulate else None

    def compensate(self, grad):
        if self.u is not None:
            self.u *= self.momentum  # Alg. step 3: u = m u + g (from u = 0)
        self.u = accumulate(self.u, grad)
        if not self.accumulate:
            return self.u
        self.v = accumulate(self.v, self.u)  # Alg. step 4: v = v + u (from v = 0)
        return self.v

    def update(self, acc, sent_indices) -> None:
        if not self.accumulate:
            return
        if acc is not self.v:
            self.v[...] = acc
        if sent_indices is None:  # everything was sent
            self.u.fill(0)
            self.v.fill(0)
        else:  # Alg. step 8: momentum factor masking
            self.u[sent_indices] = 0
            self.v[sent_indices] = 0

    def keep(self, indices, error) -> None:
        """What the wire lost of the sent velocity stays in ``v`` (``u`` stays masked)."""
        if self.accumulate:
            self.v[indices] += error

    def reset(self) -> None:
        self.u = None
        self.v = None

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "accumulate": self.accumulate,
                "u": saved(self.u), "v": saved(self.v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.u = restored(state.get("u"))
        self.v = restored(state.get("v")) if self.accumulate else None


# --------------------------------------------------------------------------
# the scheme
# --------------------------------------------------------------------------


@register("dgc")
class DGC(SparseGatherScheme):
    """Deep Gradient Compression; see the module docstring for the steps."""

    #: the returned update already contains momentum: apply it with plain SGD
    provides_momentum = True
    compiled_kernels = ("momentum", "segments_select", "scatter_sum")

    options = (
        SchemeOption("sample_fraction", float, 0.01,
                     "dgc: fraction of the vector sampled to estimate the threshold",
                     low=0.0, high=1.0, low_open=True),
        SchemeOption("momentum", float, 0.9,
                     "dgc: momentum m of the momentum correction (the optimizer then runs without momentum), in [0, 1)",
                     low=0.0, high=1.0),
        SchemeOption("clip_norm", float, 0.0,
                     "dgc: clip each rank's gradient to L2 norm clip/sqrt(W) before accumulation (0 = off)",
                     low=0.0),
        SchemeOption("density_warmup_iters", int, 0,
                     "dgc: iterations over which the density falls exponentially from 0.25 to --density",
                     low=0),
        WIRE_DTYPE,
    )

    @classmethod
    def validate_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        # SchemeOption bounds are inclusive above; momentum 1 would never decay u
        m = options.get("momentum")
        if isinstance(m, (int, float)) and not isinstance(m, bool) and not 0.0 <= m < 1.0:
            raise ValueError(f"--momentum is {m!r}; allowed range is [0, 1)")
        return super().validate_options(options)

    def __init__(self, comm, layout, density, *, memory: bool = True, **kw):
        super().__init__(comm, layout, density, memory=memory, **kw)
        self.memory = MomentumCorrectionMemory(self.opts["momentum"], accumulate=bool(memory))
        self._scratch = None
        self._last: Selection | None = None
        self._last_k = self.k
        self._last_density = self.density
        self._hints: list[float] = []  # the last two sampled thresholds: speed only, never the result
        self._samples = None  # step 5's sample, read by the fused momentum pass

    # ------------------------------------------------------------ pieces
    def density_at(self, iteration: int) -> float:
        return warmup_density(iteration, self.density, self.opts["density_warmup_iters"])

    def _step(self, grad):
        xp = backend.array_module(grad)
        if self._scratch is None:
            self._scratch = xp.empty_like(grad)
        W = self.comm.size
        density = self.density_at(self.iteration)  # Alg. step 1
        k = k_for(density, self.n)
        with self.phase("compensate"):
            g = grad
            clip = self.opts["clip_norm"]
            if clip > 0:  # Alg. step 2
                scale = clip_scale(backend.norm(grad), clip, W)  # one explicit scalar read
                if scale != 1.0:
                    g = self._scratch
                    xp.multiply(grad, grad.dtype.type(scale), out=g)
            rng = sampler(self.seed, self.comm.rank, self.iteration)
            t_c = self._guess()
            fused_pass = self._fused_compensate(g, k, rng, t_c)  # Alg. steps 3-4 (and 5's sample) in one pass
            if fused_pass is None:
                v = self.memory.compensate(g)  # Alg. steps 3-4 (reads g before select reuses scratch)
                superset = samples = None
            else:
                v = self.memory.v
                superset, samples = (t_c, *fused_pass[0]), fused_pass[1]
        with self.phase("select"):
            sel = dgc_select(v, k, rng, self.opts["sample_fraction"], scratch=self._scratch,  # steps 5-6
                             superset=superset, samples=samples, hint=t_c)
            if sel.path != "all":
                self._hints = [*self._hints[-1:], sel.sampled]
            idx = sel.indices
            vals = v[idx]
        with self.phase("exchange_indices"):  # Alg. step 7
            all_idx, counts = self.comm.allgatherv(idx)
        with self.phase("exchange_values"):
            all_vals, lost = self.gather_values(vals, counts)
        with self.phase("update"):
            self.memory.update(v, idx)  # Alg. step 8
            self.keep_lost(idx, lost)  # a 16-bit wire's rounding stays in v
            out, clear = self.output_to_clear(getattr(self, "_last_indices", None))
            scatter_sum(out, all_idx, all_vals, counts, 1.0 / W, clear=clear)  # Alg. step 7: mean
        self._last_indices = all_idx
        self._last, self._last_k, self._last_density = sel, k, density
        return out

    def _guess(self) -> float:
        """The fused pass's candidate threshold ``t_c`` (``inf``: collect nothing, no usable history)."""
        h = [t for t in self._hints if t > 0 and math.isfinite(t)]
        if len(h) < len(self._hints) or not h:
            return math.inf
        growth = min(2.0, max(1.0, h[-1] / h[0]))
        return HINT_FACTOR * h[-1] * growth

    def _fused_compensate(self, g, k: int, rng, t_c: float):
        """Alg. steps 3-4 as one compiled pass over ``u``, ``v`` and ``g`` that also collects the entries
        ``|v| >= t_c`` and reads step 5's sample: ``((candidates, |v| at them), samples)`` for
        :func:`dgc_select`, or None when the plain steps must run (nothing changed then, ``rng`` not
        drawn from).

        ``t_c`` is a guess of step 5's threshold (:meth:`_guess`; step 5 samples the new ``v``, known only
        after the pass).  When step 5's threshold is at least ``t_c`` the candidates
        hold every entry it admits and the threshold pass is skipped; else (or when more than the buffer
        holds reach ``t_c``: ``candidates`` None) that pass runs.  The result never depends on the guess.
        The sample's key is drawn from ``rng`` here, as :func:`dgc_select` would draw it.
        """
        from ..backend import fused

        mem = self.memory
        u, v = mem.u, mem.v
        if (not mem.accumulate or u is None or v is None or not fused.enabled() or not isinstance(g, np.ndarray)
                or not (u.dtype == v.dtype == g.dtype) or g.dtype.kind != "f" or not 0 < k < self.n):
            return None
        m = sample_size(self.n, self.opts["sample_fraction"])
        if self._samples is None or self._samples.shape[0] != m or self._samples.dtype != v.dtype:
            self._samples = np.empty(m, dtype=v.dtype)
        cand = fused.compensate_momentum(u, v, g, mem.momentum, t_c, HINT_CAP * k + 1024,
                                         key=sample_key(rng), samples=self._samples, with_values=True)
        return (None, None) if cand is None else cand, self._samples

    # ------------------------------------------------------------ reports
    def diagnostics(self) -> dict[str, float]:
        """Adds the warm-up density, the local count over k, lowerings and how ranks selected."""
        d = super().diagnostics()
        s = self._last
        if s is None:
            return d
        local = np.array([s.indices.shape[0] / self._last_k, s.lowerings, float(s.path == "trim"),
                          float(s.path == "topk"), s.threshold], dtype=np.float64)
        total = self.comm.allreduce(local) / self.comm.size
        d.update({
            "dgc_density_scheduled": self._last_density,
            "dgc_local_count_over_k": float(total[0]),
            "dgc_lowerings": float(total[1]),
            "dgc_trimmed_fraction": float(total[2]),
            "dgc_topk_fallback_fraction": float(total[3]),
            "dgc_threshold": float(total[4]),
        })
        return d

    # -------------------------------------------------------------- state
    def _extra_state(self) -> dict[str, Any]:
        # The sampler is a pure function of (seed, rank, iteration): no RNG state to keep.
        return {"sampler_seed": self.seed, "rank": self.comm.rank}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        rank = extra.get("rank", self.comm.rank)
        if rank != self.comm.rank:
            raise ValueError(
                f"this DGC state was saved by rank {rank} but is loaded on rank {self.comm.rank}; "
                "u and v are per rank, so each rank must load its own state"
            )
        self.seed = int(extra.get("sampler_seed", self.seed))
