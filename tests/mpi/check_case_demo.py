"""A case for the tests of the harness (tests/test_harness.py): ``check_case_demo.py MODE [RANK]``.

MODE ``pass`` reports OK; ``raise R`` raises on rank R while the others wait
in a collective; ``hang R`` makes rank R wait forever in a collective the
others never join; ``exit R`` ends rank R's process without a word (a crash).
"""

import os
import sys
import time

from mpi4py import MPI

world = MPI.COMM_WORLD
mode = sys.argv[1]
bad = int(sys.argv[2]) if mode != "pass" else -1
if mode == "raise" and world.rank == bad:
    raise ValueError(f"demo failure on rank {bad}")
if mode == "hang" and world.rank == bad:
    while True:  # a rank stuck in its own loop: the others wait at the harness's barrier
        time.sleep(0.05)
if mode == "exit" and world.rank == bad:
    os._exit(3)
world.Barrier()
if world.rank == 0:
    print(f"case_demo OK on {world.size} ranks")
