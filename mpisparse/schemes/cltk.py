"""``cltk``: ScaleCom's cyclic local top-k (CLT-k) with a low-pass filtered memory.

Chen et al., "ScaleCom: Scalable Sparsified Gradient Compression for
Communication-Efficient Distributed Training" (NeurIPS 2020).

Algorithm 1, as run by every rank ``i`` of ``W`` at iteration ``t``
(``t`` = :attr:`Scheme.iteration`, counted from 0, warm-up included):

1. (l.5) the stochastic gradient ``grad_i`` is given (the fusion buffer).
2. (l.6, eq. 3) ``g_i = CLT^k_{t mod W}(m_i + grad_i)``:

   a. ``acc_i = m_i + grad_i``, the error-compensated vector   [compensate]
   b. the leader ``L = t mod W`` alone takes the top-k index set
      ``I^k(acc_L)`` of eq. 2 (chunk-wise, see below); the other ranks
      select nothing                                             [select]
   c. the leader broadcasts its ``k`` indices (Bcast)           [exchange_indices]
   d. every rank takes its *own* values ``acc_i[I]`` and the ``k`` values
      are summed with one Allreduce (l.8-11: CLT-k is commutative, eq. 1:
      ``sparse(mean x_i) = mean sparse(x_i)``, so the reduction is an
      all-reduce of ``k`` values, not a gather)                 [exchange_values]
3. (l.7, eq. 5) the low-pass filter on the memory,
   ``m_i <- (1 - beta) m_i + beta (m_i + grad_i - g_i)``
   ``     = (1 - beta) m_i + beta (acc_i - g_i)``; ``acc_i - g_i`` is
   ``acc_i`` with the entries at ``I`` zeroed, so ``beta = 1`` is plain
   error feedback (:class:`mpisparse.schemes.memory.ResidualMemory`)     [update]
4. (l.9-12) the output is ``g = (1/W) sum_i g_i``: the summed values / W at
   ``I``, zero elsewhere; the caller applies ``theta -= alpha g``.

What the filter smooths is the *memory*: the previous memory ``m_i^t`` is
blended with the new residual ``acc_i - g_i``; the gradient enters the
compensated vector ``acc_i = m_i^t + grad_i`` unfiltered (Alg. 1 l.6).  With
``beta < 1`` error feedback no longer conserves mass: a fraction
``1 - beta`` of the residual is discarded every step (that is the filter).

Options
-------
``--beta``
    the discounting factor of eq. 5, ``0 < beta <= 1`` (the paper uses 1
    for standard batch sizes and 0.1-0.3 for large ones).
``--chunks C``
    chunk-wise selection (Sec. 4, after [39]): the vector is split into
    ``C`` contiguous chunks of near-equal size (the first ``n mod C`` chunks
    one element longer; chunk boundaries ignore layer boundaries) and the
    leader takes the top ``k_c`` of each, with ``k`` split the same way
    (``k_c = k // C``, plus one for the first ``k mod C`` chunks).  The total
    is exactly ``k`` (a chunk never gets more picks than elements; with
    ``k < C`` the last chunks get none).  ``C = 1`` is the exact global top-k.
``--warmup-iters N``
    the first ``N`` iterations are not compressed (Sec. 4, footnote 7):
    one dense Allreduce of the compensated vector, output its mean, memory
    cleared.  The leader cycle keeps counting through them (``t mod W``).

Diagnostics (``--diagnostics``; two extra full-vector Allreduces per step)
--------------------------------------------------------------------------
``hamming_to_true_topk``
    Fig. 3: the normalized Hamming distance ``d / k`` between the leader's
    index set and the "true" top-k set of the *averaged* compensated vector
    ``y = (1/W) sum_i acc_i`` (taken with the same chunk-wise rule, so only
    the CLT-k approximation is measured, and it is 0 at ``W = 1``).  Eq. 6:
    ``H = 2 d`` for two sets of ``k`` indices, i.e.
    ``d = k - |I_leader & I_true|``.  0 during warm-up (nothing is dropped).
``memory_cosine_distance``
    Fig. 2(a,c): the mean over ranks of the cosine distance (footnote 1,
    ``1 - x.y / (|x| |y|)``) between each rank's memory ``m_i`` after the
    update and the mean memory ``(1/W) sum_j m_j``.  Conventions: 0 when both
    vectors are zero (also with ``--no-memory``), 1 when exactly one is.

The base key ``error_norm`` is ``(1/W) sum_i |m_i|``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend
from ..backend import reference
from .memory import Memory, NoMemory, accumulate, restored, saved
from .base import SELECT_KERNEL, WIRE_DTYPE, Scheme, SchemeOption, register


# --------------------------------------------------------------------------- pure functions
#: eq. 5's low-pass factor: the ``--beta`` option, and the range every holder of a beta checks
BETA = SchemeOption("beta", float, 1.0,
                    "cltk: low-pass factor of the memory update (ScaleCom eq. 5); 1 = plain error feedback",
                    low=0.0, high=1.0, low_open=True)


def check_beta(beta: Any) -> float:
    """The low-pass factor of eq. 5 as a float; ValueError outside (0, 1]."""
    if beta is None:
        raise ValueError("--beta is None; allowed range is (0, 1]")
    return BETA.validate(beta)


def chunk_sizes(total: int, chunks: int) -> np.ndarray:
    """Split ``total`` into ``chunks`` near-equal parts, the larger ones first.

    ``total // chunks`` each, plus one for the first ``total % chunks``; the
    parts sum to ``total`` exactly.
    """
    total, chunks = int(total), int(chunks)
    if chunks < 1:
        raise ValueError(f"The number of chunks is {chunks}; it must be at least 1.")
    if total < 0:
        raise ValueError(f"Cannot split a negative count {total} into chunks.")
    sizes = np.full(chunks, total // chunks, dtype=np.int64)
    sizes[: total % chunks] += 1
    return sizes


def chunk_bounds(n: int, chunks: int) -> np.ndarray:
    """Offsets ``[0, e_0, e_1, ..., n]`` of ``chunks`` contiguous near-equal chunks of ``n``."""
    bounds = np.zeros(int(chunks) + 1, dtype=np.int64)
    np.cumsum(chunk_sizes(n, chunks), out=bounds[1:])
    return bounds


def chunked_topk(x, k: int, chunks: int = 1, *, scratch=None, kernel: str = "native"):
    """Chunk-wise top-k by magnitude: exactly ``k`` distinct indices of ``x``.

    ``x`` is split as :func:`chunk_bounds` and ``k`` as :func:`chunk_sizes`;
    chunk ``c`` contributes the indices of its ``k_c`` largest ``|x|``.
    ``chunks = 1`` is the plain top-k of eq. 2.  Indices are
    ``backend.index_dtype(n)``, in no particular order.  ``scratch`` (a
    float buffer of ``x``'s size) is passed on to the kernel; ``kernel`` is the
    selection primitive (:mod:`mpisparse.backend.reference`).
    """
    n = int(x.shape[0])
    k, chunks = int(k), int(chunks)
    if not 0 <= k <= n:
        raise ValueError(f"k is {k}; it must lie in [0, {n}] for a vector of {n} elements.")
    if not 1 <= chunks <= max(n, 1):
        raise ValueError(f"The number of chunks is {chunks}; it must lie in [1, {n}] "
                         f"for a vector of {n} elements.")
    if chunks == 1:
        return reference.topk_abs(x, k, kernel, scratch=scratch)
    idt = backend.index_dtype(n)
    xp = backend.array_module(x)
    bounds = chunk_bounds(n, chunks)
    ks = chunk_sizes(k, chunks)
    parts = []
    for c in range(chunks):
        a, b, kc = int(bounds[c]), int(bounds[c + 1]), int(ks[c])
        if kc == 0:
            continue
        sub = reference.topk_abs(x[a:b], kc, kernel, scratch=None if scratch is None else scratch[a:b])
        parts.append(sub.astype(idt, copy=False) + idt(a))
    if not parts:
        return xp.empty(0, dtype=idt)
    return xp.concatenate(parts)


def lowpass_update(memory, acc, sent, beta: float):
    """Alg. 1 l.7 / eq. 5 in place: ``m <- (1 - beta) m + beta (acc - g)``.

    ``g`` is ``acc`` at the ``sent`` indices and zero elsewhere (``sent`` is
    None when everything was sent).  ``acc`` is overwritten with the residual
    ``acc - g`` (its ``sent`` entries zeroed), which it keeps afterwards.
    ``memory`` may *be* ``acc`` only when ``beta == 1`` (plain error
    feedback, no second buffer).  Returns ``memory``.
    """
    beta = check_beta(beta)
    if sent is None:
        acc.fill(0)
    else:
        acc[sent] = 0
    if beta == 1.0:
        if memory is not acc:
            memory[...] = acc
        return memory
    if memory is acc:
        raise ValueError("With beta < 1 the memory and the compensated vector must be separate buffers.")
    # (1 - beta) m + beta r == (m - r) (1 - beta) + r, with no temporary
    memory -= acc
    memory *= memory.dtype.type(1.0 - beta)
    memory += acc
    return memory


def normalized_hamming(selected, true_set, k: int) -> float:
    """``d / k`` of eq. 6 for two sets of ``k`` indices: ``d = k - |A & B|``."""
    if k == 0:
        return 0.0
    a, b = backend.to_host(selected), backend.to_host(true_set)
    common = np.intersect1d(a, b, assume_unique=True).size
    return float(k - common) / k


def cosine_distance(x, y) -> float:
    """``1 - x.y / (|x| |y|)`` accumulated in float64; 0 if both are zero, 1 if one is."""
    xy, xx, yy = _dot64(x, y), _dot64(x, x), _dot64(y, y)
    if xx == 0.0 and yy == 0.0:
        return 0.0
    if xx == 0.0 or yy == 0.0:
        return 1.0
    cos = xy / np.sqrt(xx * yy)
    return float(min(2.0, max(0.0, 1.0 - cos)))


_DOT_CHUNK = 1 << 18


def _dot64(x, y) -> float:
    """``x . y`` with float64 accumulation, chunk by chunk (no full-size copy)."""
    xp = backend.array_module(x)
    total = 0.0
    for s in range(0, int(x.shape[0]), _DOT_CHUNK):
        a = x[s:s + _DOT_CHUNK].astype(xp.float64)
        b = a if y is x else y[s:s + _DOT_CHUNK].astype(xp.float64)
        total += float(xp.dot(a, b))
    return total


# --------------------------------------------------------------------------- memory
class LowPassMemory(Memory):
    """ScaleCom's low-pass filtered error feedback (eq. 5, Alg. 1 l.7).

    ``compensate(grad)`` returns ``acc = m + grad`` (Alg. 1 l.6, inside the
    CLT-k operator); ``update(acc, sent)`` sets
    ``m <- (1 - beta) m + beta (acc - g)`` with ``g`` = ``acc`` on ``sent``.
    ``residual`` is the memory ``m``.  With ``beta = 1`` it works in place
    like :class:`~mpisparse.schemes.memory.ResidualMemory` (``acc`` *is* ``m``);
    with ``beta < 1`` a second buffer holds ``acc``, and after ``update``
    it holds the residual ``acc - g``.
    """

    buffers = ("residual", "_acc")

    def __init__(self, beta: float = 1.0) -> None:
        self.beta = check_beta(beta)
        self.residual = None
        self._acc = None

    @property
    def in_place(self) -> bool:
        """With ``beta = 1`` the memory is plain in-place error feedback."""
        return self.beta == 1.0

    def compensate(self, grad):
        if self.beta == 1.0:
            self.residual = accumulate(self.residual, grad)
            return self.residual
        if self.residual is None:
            self.residual = grad.copy()
            self.residual.fill(0)
        if self._acc is None or self._acc.shape != grad.shape:
            self._acc = grad.copy()
        xp = backend.array_module(grad)
        xp.add(self.residual, grad, out=self._acc)
        return self._acc

    def update(self, acc, sent_indices) -> None:
        if self.residual is None:
            raise RuntimeError("LowPassMemory.update was called before compensate.")
        lowpass_update(self.residual, acc, sent_indices, self.beta)

    def keep(self, indices, error) -> None:
        """The wire's rounding of the sent values stays in ``acc - g``, filtered like the rest (eq. 5)."""
        self.residual[indices] += self.residual.dtype.type(self.beta) * error

    def clear(self) -> None:
        """Forget everything (warm-up): ``m = 0``, buffers kept."""
        if self.residual is not None:
            self.residual.fill(0)

    def reset(self) -> None:
        self.residual = None
        self._acc = None

    def state_dict(self) -> dict[str, Any]:
        return {"residual": saved(self.residual), "beta": self.beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residual = restored(state.get("residual"))
        self._acc = None
        if "beta" in state:
            self.beta = check_beta(state["beta"])


# --------------------------------------------------------------------------- scheme
@register("cltk")
class CLTK(Scheme):
    """Cyclic local top-k: the leader ``t mod W`` picks, everyone reduces its values there."""

    compiled_kernels = ("fused",)

    options = (
        BETA,
        SchemeOption("chunks", int, 1,
                     "cltk: chunk-wise selection: top-(k/C) in each of C near-equal contiguous chunks",
                     low=1),
        SchemeOption("warmup_iters", int, 0,
                     "cltk: first iterations uncompressed (dense Allreduce, memory cleared)",
                     low=0),
        SELECT_KERNEL,
        WIRE_DTYPE,
    )

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.beta = check_beta(self.opts["beta"])
        self.chunks = int(self.opts["chunks"])
        self.warmup_iters = int(self.opts["warmup_iters"])
        if self.chunks > self.n:
            raise ValueError(f"--chunks is {self.chunks}; the allowed range is [1, {self.n}] "
                             f"for a gradient vector of {self.n} elements.")
        if not isinstance(self.memory, NoMemory):
            self.memory = LowPassMemory(self.beta)
        self._scratch = None
        self._idx_buf = None
        # last step, for selected_global() and diagnostics()
        self.leader: int | None = None  # None: a warm-up (dense) step
        self.last_indices = None
        self._out_indices = None  # the entries the output holds (zeroed at the next step)
        self._acc_ref = None
        self._local_vals = None
        self._selected = 0

    # ------------------------------------------------------------- step
    def leader_of(self, iteration: int) -> int:
        """Alg. 1 l.6: the leading worker of iteration ``t`` is ``t mod W``."""
        return int(iteration) % self.comm.size

    def _step(self, grad):
        if self.iteration < self.warmup_iters:
            return self._dense_step(grad)
        comm, k = self.comm, self.k
        leader = self.leader_of(self.iteration)
        if comm.rank == leader and self.chunks == 1:  # Alg. 1 l.6, eq. 2: I^k(acc_L), leader only
            acc, idx = self.compensate_topk(grad, k)  # one fused pass where the memory allows it
            idx = idx.astype(backend.index_dtype(self.n), copy=False)
        else:
            with self.phase("compensate"):
                acc = self.memory.compensate(grad)  # Alg. 1 l.6: m_i + grad_i
            with self.phase("select"):
                if comm.rank == leader:
                    if self._scratch is None:
                        self._scratch = backend.array_module(acc).empty_like(acc)
                    idx = chunked_topk(acc, k, self.chunks, scratch=self._scratch, kernel=self.select_kernel)
                    idx = idx.astype(backend.index_dtype(self.n), copy=False)
        with self.phase("exchange_indices"):
            if comm.rank != leader:
                if self._idx_buf is None:
                    xp = backend.array_module(acc)
                    self._idx_buf = xp.empty(k, dtype=backend.index_dtype(self.n))
                idx = self._idx_buf
            comm.bcast(idx, root=leader)  # Alg. 1 l.6: everyone follows the leader's set
        with self.phase("exchange_values"):
            local = acc[idx]  # eq. 3: CLT_L(acc_i), this rank's own values
            total = local.copy()
            lost = self.sum_values(total)  # Alg. 1 l.8-11, eq. 1: reduce, not gather
        with self.phase("update"):
            self.memory.update(acc, idx)  # Alg. 1 l.7, eq. 5
            self.keep_lost(idx, lost)  # (a 16-bit wire's rounding: g_i is what was sent)
            out = self.write_output(idx, total, 1.0 / comm.size, self._out_indices)  # Alg. 1 l.10: (1/W) sum
        self.leader, self.last_indices = leader, idx
        self._out_indices = idx.copy()  # a non-leader's idx is the receive buffer the next Bcast overwrites
        self._acc_ref, self._local_vals, self._selected = acc, local, k
        return out

    def _dense_step(self, grad):
        """Warm-up (Sec. 4, footnote 7): no compression, memory cleared."""
        with self.phase("compensate"):
            acc = self.memory.compensate(grad)
        with self.phase("exchange_values"):
            out = self.comm.allreduce(acc, self.output())
        with self.phase("update"):
            if self.comm.size > 1:
                out *= out.dtype.type(1.0 / self.comm.size)
            if isinstance(self.memory, LowPassMemory):
                self.memory.clear()
        self.leader, self.last_indices = None, None
        self._out_indices = None
        self._acc_ref, self._local_vals, self._selected = None, None, self.n
        return out

    def selected_global(self) -> int:
        """``k`` (the leader's set is everyone's: no build-up); ``n`` in warm-up."""
        return self._selected

    # ------------------------------------------------------- diagnostics
    def compensated_last(self):
        """This rank's compensated vector ``acc_i`` of the last (sparse) step, rebuilt.

        After the update the ``acc`` buffer holds the residual (sent entries
        zeroed); the sent values are put back from the copy kept by the step.
        With ``--no-memory`` ``acc`` is the caller's gradient buffer, which
        must be unchanged between :meth:`step` and :meth:`diagnostics`.
        """
        acc = self._acc_ref.copy()
        acc[self.last_indices] = self._local_vals
        return acc

    def diagnostics(self) -> dict[str, float]:
        out = super().diagnostics()
        comm = self.comm
        # Fig. 3: leader's set vs the true top-k of the averaged compensated vector
        if self.leader is None:
            out["hamming_to_true_topk"] = 0.0
        else:
            y = comm.allreduce(self.compensated_last())  # W * mean; same ranking
            true_set = chunked_topk(y, self.k, self.chunks)
            out["hamming_to_true_topk"] = normalized_hamming(self.last_indices, true_set, self.k)
        # Fig. 2: cosine distance of each memory to the mean memory, averaged over ranks
        m = getattr(self.memory, "residual", None)
        if m is None:
            out["memory_cosine_distance"] = 0.0
        else:
            msum = comm.allreduce(m)  # W * mean memory; same direction
            mine = np.array([cosine_distance(m, msum)], dtype=np.float64)
            out["memory_cosine_distance"] = float(comm.allreduce(mine)[0]) / comm.size
        return out

    # ------------------------------------------------------------ state
    def _extra_state(self) -> dict[str, Any]:
        # the leader cycle follows from the iteration; beta is also in the memory's state
        return {"beta": self.beta}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        if "beta" in extra:
            self.beta = check_beta(extra["beta"])
            self.opts["beta"] = self.beta
            if isinstance(self.memory, LowPassMemory):
                self.memory.beta = self.beta
