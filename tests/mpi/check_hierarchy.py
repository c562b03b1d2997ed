"""Run on W ranks: the two-level collectives and every hierarchical scheme against the flat ones.

``python -m mpi4py check_hierarchy.py GROUPING``: GROUPING is ``pairs``
(hosts of two consecutive ranks), ``split`` (even and odd ranks on two
hosts: hosts not contiguous in rank order) or ``one`` (every rank on one
host).  Collectives are checked against NumPy references computed from
every rank's input (Bcast and Allgatherv bit for bit, Allreduce to
rounding: the additions run in another order); each scheme's aggregate
over three steps against the same scheme on the flat communicator.
"""

from __future__ import annotations

import sys

import numpy as np

from _common import RankWorld
from mpisparse.mpi.hierarchy import HierarchicalCommunicator
from mpisparse.registry import SCHEMES
from mpisparse.schemes import create

grouping = sys.argv[1]
world = RankWorld(steps=3)
comm, W, rank, layout, n, grads = world
hosts = {"pairs": [r // 2 for r in range(W)], "split": [r % 2 for r in range(W)] if W > 1 else [0],
         "one": [0] * W}[grouping]
hc = HierarchicalCommunicator(comm, hosts=hosts)
assert hc.num_hosts == max(hosts) + 1 and hc.is_leader == (rank == hosts.index(hosts[rank]))

# --- allreduce: sum (to rounding), max (exact), in place and out of place
xs = [np.random.default_rng(100 + r).standard_normal(1001).astype(np.float32) for r in range(W)]
ref = np.sum(np.stack(xs).astype(np.float64), axis=0)
out = hc.allreduce(xs[rank].copy())
np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg="allreduce sum (float32 sums in another order)")
inplace = xs[rank].copy()
hc.allreduce(inplace, inplace, op="max")
assert np.array_equal(inplace, np.max(np.stack(xs), axis=0)), "allreduce max"

# --- bcast from every root, bit for bit
for root in range(W):
    b = xs[rank].copy()
    hc.bcast(b, root)
    assert np.array_equal(b, xs[root]), f"bcast from {root}"

# --- allgatherv: varied counts with a zero, in global rank order, bit for bit
lens = [(7 * r + 3) % 11 if r != 1 else 0 for r in range(W)]
parts = [np.arange(c, dtype=np.int64) * 100 + r for r, c in enumerate(lens)]
got, counts = hc.allgatherv(parts[rank])
assert list(counts) == lens, (list(counts), lens)
assert np.array_equal(got, np.concatenate(parts)), "allgatherv order"
vals = [p.astype(np.float32) / 3 for p in parts]
gv, _ = hc.allgatherv(vals[rank], counts)
assert np.array_equal(gv, np.concatenate(vals)), "allgatherv with given counts"

# --- bytes: everything counted; only leaders send across hosts
assert hc.bytes_sent >= hc.cross_host_bytes >= 0
if not hc.is_leader:
    assert hc.cross_host_bytes == 0, hc.cross_host_bytes
if hc.num_hosts == 1:
    assert hc.cross_host_bytes == 0

# --- every hierarchical scheme: the same aggregate as on the flat communicator
for name, cls in sorted(SCHEMES.items()):
    if not getattr(cls, "hierarchical", False) or W < cls.min_world_size:
        continue
    flat = create(name, comm, layout, 0.05, seed=3)
    two = create(name, hc, layout, 0.05, seed=3)
    for t in range(3):
        a = flat.step(grads[t][rank].copy()).copy()
        b = two.step(grads[t][rank].copy()).copy()
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=f"{name} step {t} ({grouping})")
    if W > 1 and hc.num_hosts > 1 and hc.is_leader:
        assert hc.cross_host_bytes > 0

if rank == 0:
    print(f"hierarchy OK on {W} ranks")
