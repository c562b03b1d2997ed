"""What the rank scripts in this folder share.

A script runs on every rank of one ``mpiexec`` job (``python -m mpi4py
SCRIPT``, so an exception on one rank aborts the job).  :class:`RankWorld`
holds the communicator (collective checks on with ``--check``), a fusion
layout and every rank's synthetic gradients, so each rank can compute a
NumPy reference from all ranks' inputs; it also knows the byte counts of
the collectives the schemes use, steps a scheme while checking that every
rank holds the same aggregate, and checks the mass balance of error
feedback.  :func:`error_feedback_reference` is the reference of a sparse
error-feedback step whose per-rank selection is given.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from mpisparse import backend
from mpisparse.mpi.comm import Communicator
from mpisparse.backend.fusion import FusionLayout
from mpisparse.bench.gradgen import SyntheticGradients

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the fake device array
from fakedevice import FakeDeviceArray  # noqa: E402

__all__ = ["SMALL_LAYERS", "RankWorld", "close", "error_feedback_reference", "recorded_syncs", "FakeDeviceArray"]

#: a small layout with odd sizes (the default of most scripts)
SMALL_LAYERS = [("a.weight", (50, 20)), ("a.bias", (20,)), ("b.weight", (300,)), ("c.weight", (7, 7)), ("d", (3,))]


def close(a, b, what: str, rtol: float = 2e-5) -> None:
    np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-9, err_msg=what)


class RankWorld:
    """This rank's communicator, the layout, and ``grads[t][r]`` for every step ``t`` and rank ``r``."""

    def __init__(self, layers=SMALL_LAYERS, steps: int = 4, *, seed: int = 7):
        self.comm = Communicator(check="--check" in sys.argv)
        self.W, self.rank = self.comm.size, self.comm.rank
        self.layout = FusionLayout(layers)
        self.n = self.layout.n
        self.steps = steps
        self.grads = [[SyntheticGradients(self.layout, r, seed=seed).fill(self.layout.empty(), t)
                       for r in range(self.W)] for t in range(steps)]

    def __iter__(self):
        """``comm, W, rank, layout, n, grads = world``."""
        return iter((self.comm, self.W, self.rank, self.layout, self.n, self.grads))

    # ------------------------------------------------------------------ bytes this rank sends
    def ring_allgather(self, counts, itemsize: int) -> int:
        """Ring Allgather(v): every block but the next rank's passes through this rank."""
        return 0 if self.W == 1 else (sum(counts) - counts[(self.rank + 1) % self.W]) * itemsize

    def ring_allreduce(self, nbytes: int) -> int:
        return 2 * (self.W - 1) * nbytes // self.W

    def chain_bcast(self, nbytes: int, root: int) -> int:
        """Chain Bcast from ``root``: every rank but the chain's last forwards the buffer."""
        return nbytes if self.W > 1 and (self.rank - root) % self.W < self.W - 1 else 0

    def sparse_allgather(self, counts) -> int:
        """The (index, value) Allgatherv of sparse schemes: counts, then int32 indices and float32 values."""
        return 2 * self.ring_allgather(counts, 4) + self.ring_allgather([1] * self.W, 8)

    # ------------------------------------------------------------------ checks
    def dense(self, t: int) -> np.ndarray:
        """The mean gradient of step ``t`` (what any scheme at density 1 returns)."""
        return np.mean(self.grads[t], axis=0, dtype=np.float64)

    def same_everywhere(self, value, what: str) -> None:
        everyone = self.comm.allgather_obj(value)
        assert all(e == everyone[0] for e in everyone), f"{what}: ranks hold different values"

    def run(self, sch, name: str, steps: Iterable[int] | None = None, grads=None,
            observe: Callable | None = None, keeps_input: bool = False):
        """Step ``sch`` on this rank's gradients; per step the float64 output, the bytes sent, ``observe(sch)``.

        Every rank must hold the identical aggregate after every step; with
        ``keeps_input`` the scheme must not write into the gradient it is given.
        """
        grads = self.grads if grads is None else grads
        outs, nbytes, seen = [], [], []
        for t in range(len(grads)) if steps is None else steps:
            g = grads[t][self.rank].copy()
            b0 = self.comm.bytes_sent
            out = sch.step(g)
            nbytes.append(self.comm.bytes_sent - b0)
            if keeps_input:
                assert np.array_equal(g, grads[t][self.rank]), f"{name} wrote into the caller's gradient"
            outs.append(out.astype(np.float64))
            self.same_everywhere(out.tobytes(), f"{name}: aggregate at step {t}")
            if observe is not None:
                seen.append(observe(sch))
        return outs, nbytes, seen

    def mass_balance(self, outs, residual, grads=None) -> tuple[np.ndarray, np.ndarray]:
        """``(W sum_t out_t + sum_r e_r, sum_r sum_t g_r,t)``: equal when error feedback loses nothing.

        ``outs`` are this rank's outputs, ``residual`` its memory (None: empty).
        """
        grads = self.grads if grads is None else grads
        resid = np.zeros(self.n) if residual is None else np.asarray(residual, dtype=np.float64)
        lhs = self.W * np.sum(outs, axis=0) + np.sum(self.comm.allgather_obj(resid), axis=0)
        return lhs, np.sum([g for step in grads for g in step], axis=0, dtype=np.float64)

    def conserves_mass(self, outs, residual, what: str) -> None:
        """Mass balance within float32 rounding: each element's tolerance grows with the magnitudes summed into
        it (an element whose gradients nearly cancel has a tiny total but the rounding of its large terms)."""
        lhs, rhs = self.mass_balance(outs, residual)
        summed = np.sum([np.abs(g) for step in self.grads for g in step], axis=0, dtype=np.float64)
        err = np.abs(lhs - rhs)
        tol = 2e-5 * np.abs(rhs) + 16 * np.finfo(np.float32).eps * summed + 1e-12
        bad = np.flatnonzero(err > tol)
        assert bad.size == 0, (f"{what}: error feedback does not conserve mass at {bad.size} elements, e.g. [{bad[0]}]: "
                               f"{lhs[bad[0]]!r} vs {rhs[bad[0]]!r} (tolerance {tol[bad[0]]:.3g})" if bad.size else "")

    def done(self, name: str, extra: str = "") -> None:
        if self.rank == 0:
            print(f"{name} OK on {self.W} ranks{extra}")


def error_feedback_reference(world: RankWorld, select, steps: int | None = None, dtype=np.float64):
    """Sparse SGD with error feedback (DEFT Alg. 1 with per-rank sets), every rank simulated.

    ``select(acc, r, t)`` gives rank ``r``'s indices (or boolean mask) of its
    compensated vector ``acc`` at step ``t``; the ranks' selected values are
    summed and divided by ``W``, and what was sent leaves the residual.
    Returns per-step outputs, per-step counts per rank, per-step sizes of the
    union of the ranks' sets, and the final residuals (in ``dtype``).
    """
    W, n = world.W, world.n
    resid = [np.zeros(n, dtype) for _ in range(W)]
    outs, counts, union = [], [], []
    for t in range(world.steps if steps is None else steps):
        total = np.zeros(n, np.float64)
        sent = np.zeros(n, bool)
        cnt = []
        for r in range(W):
            acc = resid[r] + world.grads[t][r]
            idx = select(acc, r, t)
            if idx.dtype == bool:
                idx = np.flatnonzero(idx)
            total[idx] += acc[idx]
            sent[idx] = True
            acc[idx] = 0
            resid[r] = acc
            cnt.append(len(idx))
        outs.append(total / W)
        counts.append(cnt)
        union.append(int(sent.sum()))
    return outs, counts, union, resid


@contextlib.contextmanager
def recorded_syncs():
    """Record the arrays ``backend.synchronize`` is called on (instead of synchronising)."""
    calls = []
    real = backend.synchronize
    backend.synchronize = calls.append
    try:
        yield calls
    finally:
        backend.synchronize = real
