"""``oktopk`` on a (strict fake) device equals its host run, at 2 and 3 ranks without MPI.

On an H200, ``train -n 2 --device cuda --scheme oktopk`` once reached 57.66%
where ``--device cpu`` reached 94.43%: a CuPy selection kernel returns its
indices "in no particular order" (atomic appends), the NumPy kernel
ascending, and Ok-Topk used them unsorted -- step 4 cut them into
per-region runs by count (entries went to the wrong rank, the same index
was reduced in two regions and gathered twice) and step 9's ``in_sorted``
searched an unsorted set.

Here the strict fake CuPy (:mod:`gpu_emu.strictcupy`, NumPy kernels behind
the device wall) has its ``topk_abs`` and ``threshold_select`` return the
same indices in a scrambled order, as the GPU kernels may, and two or three
ranks run as threads over an in-process communicator: every step's output,
the global set and the residuals must equal the host run's bit for bit.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from gpu_emu import strictcupy
from mpisparse import backend
from mpisparse.backend.fusion import FusionLayout
from mpisparse.results.timing import PhaseTimer
from mpisparse.schemes import create

LAYOUT = FusionLayout([("a", (60, 40)), ("b", (40,)), ("c", (1500,))])
STEPS, TAU, DENSITY = 7, 3, 0.03


class _World:
    def __init__(self, size: int):
        self.size = size
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)


class ThreadComm:
    """One rank of a world of threads: the collectives Ok-Topk calls, on host or device buffers, summed and
    concatenated in rank order (as MPI delivers them)."""

    bytes_sent = 0

    def __init__(self, world: _World, rank: int):
        self.world, self.rank, self.size = world, rank, world.size
        self.staging = {"d2h": 0, "h2d": 0, "d2h_bytes": 0, "h2d_bytes": 0}

    def _exchange(self, obj) -> list:
        w = self.world
        w.slots[self.rank] = obj
        w.barrier.wait()
        every = list(w.slots)
        w.barrier.wait()
        return every

    def barrier(self):
        self.world.barrier.wait()

    def allgather_obj(self, obj):
        return self._exchange(obj)

    def allreduce(self, x, out=None, *, op="sum"):
        assert not backend.is_device_array(x), "Ok-Topk allreduces host counts and boundaries only"
        parts = self._exchange(np.array(x, copy=True))
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
        total = parts[0].copy()
        for p in parts[1:]:
            fn(total, p, out=total)
        if out is None:
            return total
        out[...] = total
        return out

    def allgather_counts(self, count: int) -> np.ndarray:
        return np.array(self._exchange(int(count)), dtype=np.int64)

    def allgatherv(self, x, counts=None):
        parts = self._exchange(x.copy())
        got = np.array([p.shape[0] for p in parts], dtype=np.int64)
        if counts is not None:
            assert np.array_equal(np.asarray(counts), got), (counts, got)
        return backend.array_module(x).concatenate(parts), got

    def alltoallv(self, x, sendcounts, recvcounts=None):
        sendcounts = np.asarray(sendcounts, dtype=np.int64)
        assert sendcounts.shape == (self.size,) and int(sendcounts.sum()) == x.shape[0]
        parts = self._exchange((x.copy(), sendcounts))
        mine = []
        for src, (buf, counts) in enumerate(parts):
            start = int(counts[:self.rank].sum())
            mine.append(buf[start:start + int(counts[self.rank])])
        got = np.array([p.shape[0] for p in mine], dtype=np.int64)
        return backend.array_module(x).concatenate(mine), got


def run_world(size: int, grads, device_module=None, **opts):
    """Every rank's per-step outputs (host copies), global-set sizes and final residual."""
    world = _World(size)
    results: list = [None] * size
    errors: list = []

    def rank_main(rank: int):
        try:
            sch = create("oktopk", ThreadComm(world, rank), LAYOUT, DENSITY, timer=PhaseTimer(enabled=False),
                         seed=2, **opts)
            if device_module is not None:
                sch.use_array_module(device_module)
            outs, sizes = [], []
            for t in range(STEPS):
                g = grads[t][rank]
                out = sch.step(device_module.asarray(g) if device_module is not None else g.copy())
                outs.append(backend.to_host(out).copy())
                sizes.append(sch.selected_global())
            resid = [backend.to_host(v).copy() for v in (getattr(sch.memory, a) for a in sch.memory.buffers)
                     if v is not None and hasattr(v, "shape")]
            results[rank] = (outs, sizes, resid)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            world.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return results


@pytest.fixture
def scrambled_cp(monkeypatch):
    """Strict CuPy whose ``topk_abs`` and ``threshold_select`` return their indices in a scrambled order
    (the CuPy kernels' contract: any order), the same sets as the NumPy kernels'."""
    cp = strictcupy.install(monkeypatch, kernels="host")
    kern = sys.modules[strictcupy.HOST_KERNELS]
    rng = np.random.default_rng(11)
    for name in ("topk_abs", "threshold_select"):
        def scrambled(*args, _plain=getattr(kern, name), **kw):
            idx = _plain(*args, **kw)
            return idx[cp.asarray(rng.permutation(idx.shape[0]))]

        monkeypatch.setattr(kern, name, scrambled)
    return cp


def _grads(size: int):
    rng = np.random.default_rng(5)
    return [[rng.standard_normal(LAYOUT.n).astype(np.float32) for _ in range(size)] for _ in range(STEPS)]


@pytest.mark.parametrize("size", [2, 3])
def test_oktopk_on_a_device_with_unordered_selection_kernels_equals_the_host_run(scrambled_cp, size):
    grads = _grads(size)
    host = run_world(size, grads, tau=TAU)
    dev = run_world(size, grads, scrambled_cp, tau=TAU)
    for rank in range(size):
        (h_out, h_sizes, h_res), (d_out, d_sizes, d_res) = host[rank], dev[rank]
        assert d_sizes == h_sizes, (rank, d_sizes, h_sizes)  # the global set: no index twice
        for t in range(STEPS):
            np.testing.assert_array_equal(d_out[t], h_out[t], err_msg=f"rank {rank} step {t}")
        for a, b in zip(d_res, h_res):
            np.testing.assert_array_equal(a, b)
    # the steps between estimations (the corrected global threshold) ran and kept entries on the device too
    assert all(s > 0 for s in host[0][1][1:TAU])


def test_the_local_selection_is_ascending_on_the_device(scrambled_cp):
    """Steps 1-2 hand steps 4 and 9 ascending indices whatever the kernel's order: the exact top-k."""
    from conftest import SelfComm

    sch = create("oktopk", SelfComm(), LAYOUT, DENSITY, timer=PhaseTimer(enabled=False), tau=4)
    sch.use_array_module(scrambled_cp)
    g = np.random.default_rng(1).standard_normal(LAYOUT.n).astype(np.float32)
    acc, idx, vals = sch._select_local(scrambled_cp.asarray(g))
    idx = idx.get()
    assert np.all(np.diff(idx) > 0) and idx.shape[0] == sch.k
    np.testing.assert_array_equal(idx, np.sort(np.argsort(-np.abs(g), kind="stable")[:sch.k]))
    np.testing.assert_array_equal(vals.get(), g[idx])
