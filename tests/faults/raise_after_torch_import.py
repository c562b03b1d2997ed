"""Rank 1 raises right after ``import mpisparse.torch``; rank 0 waits in a collective.

Run as plain ``mpiexec -n 2 python raise_after_torch_import.py`` (no ``-m mpi4py``):
the import alone must make the uncaught exception end the whole job.
"""

import sys
import time

import numpy as np

import mpisparse.torch as hvd

if hvd.rank() == 1:
    print(f"raising at {time.time():.3f}", file=sys.stderr, flush=True)
    raise RuntimeError("injected failure on rank 1")
hvd.communicator().allreduce(np.zeros(1), op="sum")  # rank 0 would wait here forever
