"""Run on W ranks: the communicator's device path, the CUDA-aware decision and probe, local ranks.

Without arguments everything runs on the fake device array of
tests/fakedevice.py (host memory presenting ``__cuda_array_interface__``).
With ``--cupy`` the collectives run on real CuPy arrays (a GPU test), staged
and, when the probe says the MPI is CUDA-aware, handed over directly.
"""

import os
import sys

import numpy as np
from _common import FakeDeviceArray, recorded_syncs
from mpi4py import MPI  # the test drives decide_cuda_aware_how with a raw communicator

from mpisparse.mpi import device
from mpisparse.mpi.comm import Communicator, decide_cuda_aware_how

comm = Communicator(cuda_aware=False)
W, rank = comm.size, comm.rank


class FakeOps:
    """probe_cuda_aware's device operations on the fake device array."""

    def to_device(self, h):
        return FakeDeviceArray(np.array(h))

    def to_host(self, a):
        return a.get() if hasattr(a, "get") else np.asarray(a)


class LosesData(FakeOps):
    """An MPI that 'moves' device buffers wrongly: what comes back reads as zeros."""

    def to_host(self, a):
        return np.zeros_like(super().to_host(a))


class CannotAllocate(FakeOps):
    def to_device(self, h):
        raise MemoryError("out of device memory")


def check_cupy():
    import cupy

    dev = device.assign_device(comm)
    assert dev.device is not None, dev
    for aware in (False, decide_cuda_aware_how(None, MPI.COMM_WORLD)[0]):
        c = Communicator(cuda_aware=aware)
        x = cupy.arange(1001, dtype=cupy.float32) + rank
        s = c.allreduce(x)
        assert isinstance(s, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(s), np.arange(1001, dtype=np.float32) * W + W * (W - 1) / 2)
        g, counts = c.allgatherv(cupy.full(rank + 2, rank, dtype=cupy.int32))
        assert isinstance(g, cupy.ndarray), type(g)
        np.testing.assert_array_equal(cupy.asnumpy(g), np.concatenate([np.full(r + 2, r) for r in range(W)]))
        b = cupy.arange(7, dtype=cupy.float64) if rank == 0 else cupy.zeros(7)
        c.bcast(b)
        np.testing.assert_array_equal(cupy.asnumpy(b), np.arange(7))
    if rank == 0:
        print(f"gpu comm (cupy) OK on {W} ranks")


if "--cupy" in sys.argv:
    check_cupy()
    sys.exit(0)

# 1. the stream is synchronised before every MPI call on a device buffer -------------------
with recorded_syncs() as syncs:
    for aware in (False, True):
        c = Communicator(cuda_aware=aware)
        d = FakeDeviceArray(np.full(5, rank, np.float32))
        syncs.clear()
        c.bcast(d, root=0)
        assert len(syncs) >= 1, ("bcast", aware, syncs)
        syncs.clear()
        c.allgatherv(d)
        assert len(syncs) >= 1, ("allgatherv", aware)
        if W > 1:
            syncs.clear()
            peer = rank ^ 1
            if peer < W:
                r = c.sendrecv(d, peer)
                assert len(syncs) >= 1 and r.size == 5, ("sendrecv", aware)
        syncs.clear()
        counts = [1] * W
        recv, rc = c.alltoallv(FakeDeviceArray(np.arange(W, dtype=np.int32) + 10 * rank), counts)
        assert len(syncs) >= 1, ("alltoallv", aware)
        np.testing.assert_array_equal(recv, np.arange(W) * 10 + rank)

# 2. staging buffers are reused across calls, also when sizes vary ----------------------------
c = Communicator(cuda_aware=False)
for step in range(12):
    n = 50 + (step * 37 + rank * 11) % 400  # this rank's count changes every step
    d = FakeDeviceArray(np.arange(n, dtype=np.float32) + rank)
    got, counts = c.allgatherv(d)
    assert d.gets == 1
    start = 0
    for r, cnt in enumerate(counts):
        np.testing.assert_array_equal(got[start:start + cnt], np.arange(cnt, dtype=np.float32) + r)
        start += cnt
    x = FakeDeviceArray(np.full(300, rank + 1.0, np.float32))
    c.allreduce(x, x)
    assert np.all(x.host() == W * (W + 1) / 2) and (x.gets, x.sets) == (1, 1)
assert c.staging_allocations <= 6, c.staging_allocations  # a few growths, never one per call
first = c._host_buffers[(True, False)]
c.allgatherv(FakeDeviceArray(np.zeros(10, np.float32)))
assert c._host_buffers[(True, False)] is first, "a smaller call must reuse the buffer"

# 3. non-blocking sends never hand a device buffer to Open MPI -------------------------------
if W > 1 and rank < 2 * (W // 2):
    peer = rank ^ 1
    for open_mpi, staged in ((False, 0), (True, 1)):
        c = Communicator(cuda_aware=True)
        c.open_mpi = open_mpi
        d = FakeDeviceArray(np.full(4, rank, np.float32))
        if rank % 2 == 0:
            p = c.isend(d, peer, tag=3)
            c.waitall([p])
            assert d.gets == staged, (open_mpi, d.gets)
        else:
            buf = np.empty(4, np.float32)
            c.recv(buf, peer, tag=3)
            assert np.all(buf == peer)

# 4. the CUDA-aware probe, with fake device operations ------------------------------------------
direct = Communicator(cuda_aware=True)
assert device.probe_cuda_aware(direct, ops=FakeOps()) is True
assert device.probe_cuda_aware(direct, ops=LosesData() if rank == W - 1 else FakeOps()) is False  # all agree
assert device.probe_cuda_aware(direct, ops=CannotAllocate() if rank == 0 else FakeOps()) is False  # no hang
try:
    device.probe_cuda_aware(Communicator(cuda_aware=False), ops=FakeOps())
except ValueError as e:
    assert "cuda_aware=True" in str(e)
else:
    raise AssertionError("probe on a staging communicator accepted")

# 5. the decision: override, environment, library, probe -----------------------------------------
def decide(**kw):
    kw.setdefault("have_gpu", lambda: True)
    kw.setdefault("probe", lambda c: device.probe_cuda_aware(c, ops=FakeOps()))
    return decide_cuda_aware_how(kw.pop("override", None), MPI.COMM_WORLD, **kw)


env = os.environ.pop("MPISPARSE_CUDA_AWARE", None)
try:
    assert decide(override=False, library=lambda: True) == (False, "override")
    assert decide(library=lambda: False) == (False, "library: no")
    assert decide(library=lambda: None) == (False, "library: cannot tell")
    ok, how = decide(library=lambda: True)
    assert ok and how.startswith("probe"), (ok, how)
    ok, how = decide(library=lambda: True, probe=lambda c: device.probe_cuda_aware(
        c, ops=LosesData() if rank == 0 else FakeOps()))
    assert not ok and "wrong" in how, (ok, how)
    ok, how = decide(library=lambda: True, have_gpu=lambda: rank != W - 1)
    assert ok and "not probed" in how, (ok, how)
    os.environ["MPISPARSE_CUDA_AWARE"] = "1"
    assert decide(library=lambda: False) == (True, "MPISPARSE_CUDA_AWARE")
    assert Communicator().cuda_aware_how == "MPISPARSE_CUDA_AWARE"
finally:
    os.environ.pop("MPISPARSE_CUDA_AWARE", None)
    if env is not None:
        os.environ["MPISPARSE_CUDA_AWARE"] = env
assert Communicator(cuda_aware=True).cuda_aware_how == "override"
# the real library answer here (pip MPICH / Open MPI wheels: not CUDA-aware): nothing is probed
real = Communicator()
assert real.cuda_aware is False and real.cuda_aware_how.startswith("library"), real.cuda_aware_how

# 6. local rank and device per rank -----------------------------------------------------------------
lr, ls = comm.local_rank()
hosts = comm.allgather_obj(comm.processor_name())
assert ls == hosts.count(hosts[rank]) and 0 <= lr < ls
assert comm.local_rank() == (lr, ls)  # cached
a = device.assign_device(comm, use=False)
assert (a.local_rank, a.local_size, a.rank) == (lr, ls, rank)
if device.gpu_count() == 0:
    assert a.device is None and a.device_name == "none"
assert device.current_assignment() is a

if rank == 0:
    print(f"gpu comm OK on {W} ranks")
