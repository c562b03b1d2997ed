"""Run on 2+ ranks: the communicator's point-to-point calls the parameter server uses.

``isend`` (counted when posted, buffer kept until completed), ``waitall``,
``test_all``, ``probe`` and ``iprobe`` (source, tag and length of a message
before receiving it).  Rank 0 sends, rank 1 receives; any mismatch raises.
"""

import time

import numpy as np

from mpisparse.mpi.comm import Communicator

comm = Communicator()
rank = comm.rank
if rank == 0:
    a = np.arange(10, dtype=np.float32)
    b = np.arange(3, dtype=np.int32)
    pending = [comm.isend(a, 1, tag=7), comm.isend(b, 1, tag=8), comm.isend(np.empty(0, np.float32), 1, tag=9)]
    assert comm.stats["isend"].bytes == 40 + 12 and comm.stats["isend"].calls == 3
    deadline = time.time() + 30
    while not comm.test_all(pending):
        assert time.time() < deadline, "isend never completed"
    comm.waitall(pending)  # completed requests: returns at once
    comm.waitall([])
elif rank == 1:
    assert comm.iprobe(0, 99) is None  # nothing with that tag
    hit = None
    deadline = time.time() + 30
    while hit is None:
        hit = comm.iprobe(None, None)
        assert time.time() < deadline, "iprobe never saw the message"
    assert hit == (0, 7, 40), hit
    x = np.empty(10, np.float32)
    assert comm.recv(x, 0, 7) == (0, 7, 10) and x.tolist() == list(range(10))
    assert comm.probe(0, 8) == (0, 8, 12)
    y = np.empty(3, np.int32)
    comm.recv(y, 0, 8)
    assert y.tolist() == [0, 1, 2]
    assert comm.probe(0) == (0, 9, 0)
    comm.recv(np.empty(0, np.float32), 0, 9)
    assert comm.bytes_sent == 0  # receiving sends nothing
comm.barrier()
if rank == 0:
    print(f"ps comm OK on {comm.size} ranks", flush=True)
