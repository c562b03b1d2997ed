"""Run on W ranks: the communicator's collectives, byte counts and checks."""

import numpy as np
from _common import FakeDeviceArray, recorded_syncs

from mpisparse.mpi.comm import CollectiveMismatch, Communicator, UnsupportedDtype

comm = Communicator()
W, rank = comm.size, comm.rank


def delta(fn):
    b0 = comm.bytes_sent
    out = fn()
    return out, comm.bytes_sent - b0


# Allgatherv: rank 0 contributes nothing, rank r contributes r*3 values ---------
counts = [0 if r == 0 else 3 * r for r in range(W)]
mine = np.arange(counts[rank], dtype=np.float32) + 100 * rank
(recv, got_counts), nb = delta(lambda: comm.allgatherv(mine))
expect = np.concatenate([np.arange(c, dtype=np.float32) + 100 * r for r, c in enumerate(counts)])
assert got_counts.tolist() == counts, got_counts
np.testing.assert_array_equal(recv, expect)
ring = 0 if W == 1 else (sum(counts) - counts[(rank + 1) % W]) * 4 + (W - 1) * 8
assert nb == ring, ("allgatherv bytes", nb, ring)
# second gather reusing the counts exchanges no counts
(recv2, _), nb2 = delta(lambda: comm.allgatherv(mine.astype(np.int32), got_counts))
np.testing.assert_array_equal(recv2, expect.astype(np.int32))
assert nb2 == ring - (0 if W == 1 else (W - 1) * 8)
# everyone empty
(recv3, c3), _ = delta(lambda: comm.allgatherv(np.empty(0, np.float32)))
assert recv3.size == 0 and c3.tolist() == [0] * W

# Allreduce, in place and out of place ---------------------------------------
x = np.full(1001, rank + 1, dtype=np.float32)
out, nb = delta(lambda: comm.allreduce(x))
assert np.all(out == W * (W + 1) / 2) and np.all(x == rank + 1)
assert nb == 2 * (W - 1) * 1001 * 4 // W
comm.allreduce(x, x)
assert np.all(x == W * (W + 1) / 2)
h = np.full(8, 0.5, dtype=np.float16)
assert np.all(comm.allreduce(h) == np.float16(0.5 * W))
assert comm.allreduce(np.array([rank], np.int64), op="max")[0] == W - 1

# Bcast from the last rank --------------------------------------------------
root = W - 1
b = np.arange(10, dtype=np.float64) if rank == root else np.zeros(10)
_, nb = delta(lambda: comm.bcast(b, root=root))
np.testing.assert_array_equal(b, np.arange(10))
assert nb == (80 if (rank - root) % W < W - 1 else 0), ("bcast bytes", nb)

# Alltoallv: rank r sends r+d+1 copies of (100r + d) to rank d -----------------
send_counts = [rank + d + 1 for d in range(W)]
send = np.concatenate([np.full(c, 100 * rank + d, np.int32) for d, c in enumerate(send_counts)])
(recv, rc), nb = delta(lambda: comm.alltoallv(send, send_counts))
assert rc.tolist() == [s + rank + 1 for s in range(W)]
np.testing.assert_array_equal(recv, np.concatenate([np.full(s + rank + 1, 100 * s + rank, np.int32) for s in range(W)]))
assert nb == (sum(send_counts) - send_counts[rank]) * 4 + 8 * (W - 1)

# Point to point around a ring ----------------------------------------------
if W > 1:
    buf = np.empty(5, np.float32)
    if rank % 2 == 0:
        comm.send(np.full(5, rank, np.float32), (rank + 1) % W, tag=7)
        src, tag, cnt = comm.recv(buf, (rank - 1) % W)
    else:
        src, tag, cnt = comm.recv(buf, (rank - 1) % W)
        comm.send(np.full(5, rank, np.float32), (rank + 1) % W, tag=7)
    assert (src, tag, cnt) == ((rank - 1) % W, 7, 5) and np.all(buf == (rank - 1) % W)

# dtypes MPI cannot reduce correctly are refused --------------------------------
class BF16Stub:
    dtype = "bfloat16"
    size = 4


for fn in (lambda: comm.allreduce(BF16Stub()), lambda: comm.bcast(BF16Stub())):
    try:
        fn()
    except UnsupportedDtype as e:
        assert "bfloat16" in str(e) and "float32" in str(e)
    else:
        raise AssertionError("bfloat16 accepted")
try:
    import torch

    try:
        comm.allreduce(torch.zeros(4, dtype=torch.bfloat16))
    except UnsupportedDtype:
        pass
    else:
        raise AssertionError("torch bfloat16 accepted")
except ImportError:
    pass

# debug mode: mismatched counts raise on every rank, naming both ----------------
checked = Communicator(check=True)
if W > 1:
    try:
        checked.allreduce(np.zeros(10 + rank, np.float32))
    except CollectiveMismatch as e:
        assert "rank 0 passed 10 x float32" in str(e) and "rank 1 passed 11 x float32" in str(e), str(e)
    else:
        raise AssertionError("mismatch not detected")
    try:
        checked.allgatherv(np.zeros(2, np.float32 if rank == 0 else np.float64))
    except CollectiveMismatch as e:
        assert "float32" in str(e) and "float64" in str(e), str(e)
    else:
        raise AssertionError("dtype mismatch not detected")
checked.allreduce(np.zeros(10, np.float32))  # agreeing calls still work

# device buffers: stream synchronised first; staged through host or handed over ---------
with recorded_syncs() as syncs:
    for aware in (False, True):
        c = Communicator(cuda_aware=aware)
        d = FakeDeviceArray(np.full(6, rank + 1, np.float32))
        o = FakeDeviceArray(np.zeros(6, np.float32))
        syncs.clear()
        c.allreduce(d, o)
        assert np.all(o.host() == W * (W + 1) / 2)
        assert len(syncs) == 2, syncs  # send and receive buffers
        staged = (d.gets, o.sets)
        assert staged == ((1, 1) if not aware else (0, 0)), (aware, staged)
        g = FakeDeviceArray(np.arange(rank + 1, dtype=np.float32))
        r, cnt = c.allgatherv(g)
        assert r.size == W * (W + 1) // 2

if rank == 0:
    print(f"comm OK on {W} ranks")
