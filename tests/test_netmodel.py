"""The exchange models of nodes with several ranks (:mod:`mpisparse.bench.netmodel`), against cases computed by
hand, and the advisor's use of them: the bytes that cross a host's NIC, the two-level exchange, NCCL's dense."""

from __future__ import annotations

import pytest

from mpisparse.bench import advise as adv
from mpisparse.bench import costmodel as cm
from mpisparse.bench import netmodel as nm

ONE_PROCESS_MPI = True  # no MPI at all (tests/conftest.py lane_of)

M = 8e6  # bytes
NIC = cm.Link(latency=1e-5, bandwidth=1e9)
INTRA = cm.Link(latency=1e-6, bandwidth=1e10)


def two_by_two(hierarchical=False):
    return nm.Topology(4, 2, NIC, INTRA, hierarchical=hierarchical)


def test_a_ring_of_two_hosts_of_two_ranks_puts_one_block_a_round_on_each_nic():
    # ranks 0,1 on host 0 and 2,3 on host 1; in each round only 1 -> 2 and 3 -> 0 cross: 3 rounds, 3 blocks
    assert nm.ring_nic_bytes(4, 2, 1000.0) == 3000.0
    assert nm.ring_nic_bytes(4, 1, 1000.0) == 3000.0  # one rank a host: the same per NIC
    assert nm.ring_nic_bytes(4, 4, 1000.0) == 0.0  # one host: nothing crosses
    # the allgatherv of 1 MB blocks: 3 rounds, each as slow as its NIC (1 MB at 1 GB/s) + log2(4) latencies
    assert nm.collective("allgatherv", two_by_two(), 1e6) == pytest.approx(3 * 1e-3 + 2 * 1e-5)


def test_halving_doubling_keeps_the_large_halves_inside_a_host():
    # MPICH's reduce-scatter: at distance 1 each rank sends m/2 to its neighbour (inside the host), at distance 2
    # m/4 to the other host (both ranks of a host at once: m/2 through the NIC); the allgather retraces it: m in
    # all, 2 (H-1)/H m, what 2 emulated hosts of 2 ranks measured (docs/results/hierarchical.md: dense 1.00)
    assert nm.halving_doubling_nic_bytes(4, 2, M) == pytest.approx(M)
    assert nm.halving_doubling_nic_bytes(4, 1, M) == pytest.approx(2 * 3 / 4 * M)  # one rank a host: 2 (W-1)/W m
    assert nm.halving_doubling_nic_bytes(16, 4, M) == pytest.approx(2 * 3 / 4 * M)  # 4 hosts: 2 (H-1)/H m
    assert [nm.cross_ranks(8, 2, d) for d in (1, 2, 4)] == [0, 2, 2]
    assert nm.cross_ranks(6, 3, 1) == 1  # host 0 = ranks 0, 1, 2: only 2 <-> 3 crosses
    # its time: 2 x (m/2 at 10 GB/s inside + m/2 at 1 GB/s through the NIC) + 2 log2(4) latencies
    assert nm.collective("allreduce", two_by_two(), M) == pytest.approx(2 * (M / 2 / 1e10 + M / 2 / 1e9) + 4e-5)


def test_the_two_level_allreduce_crosses_once_per_host():
    # Reduce in the host (2 (G-1)/G m inside, 2 log2 G latencies), Allreduce of the 2 leaders (m through the NIC,
    # 2 latencies), Bcast in the host (scatter m/2 + ring m/2 inside, 2 latencies)
    want = (2 * 1e-6 + M / 1e10) + (2 * 1e-5 + M / 1e9) + (2 * 1e-6 + M / 1e10)
    assert nm.collective("allreduce", two_by_two(hierarchical=True), M) == pytest.approx(want)
    # the same m through the NIC as the flat one, more inside the host: slower (as measured there, 571 ms
    # against 488 for resnet18's dense step)
    assert nm.collective("allreduce", two_by_two(hierarchical=True), M) > nm.collective("allreduce", two_by_two(), M)
    # Alltoallv has no two-level form: flat either way (G (W-G) m / W through the NIC)
    flat = nm.collective("alltoallv", two_by_two(), M)
    assert flat == nm.collective("alltoallv", two_by_two(hierarchical=True), M)
    assert flat == pytest.approx(2 * 2 * M / 4 / 1e9 + 2 * 1e-5)
    with pytest.raises(ValueError, match="collective 'reduce'"):
        nm.collective("reduce", two_by_two(), M)


def test_nccl_dense_reduces_in_the_node_then_one_shard_per_gpu_across():
    # 2 nodes of 2: reduce-scatter in the node ((G-1)/G m inside, G-1 rounds), the shards' ring allreduce across
    # the 2 nodes (2 (H-1) rounds of m/H through the NIC: all G shards at once), allgather in the node
    want = 2 * (1e-6 + M / 2 / 1e10) + 2 * (1e-5 + M / 2 / 1e9)
    assert nm.nccl_allreduce(two_by_two(), M) == pytest.approx(want)
    # 16 nodes of 8: the NIC carries 2 (H-1)/H m whatever G is
    big = nm.Topology(128, 8, NIC, INTRA)
    assert nm.nccl_allreduce(big, M) == pytest.approx(2 * 7 * (1e-6 + M / 8 / 1e10) + 2 * 15 * (1e-5 + M / 16 / 1e9))


def test_at_one_rank_a_host_the_flat_model_is_the_validated_cost_model():
    rates = adv.DEFAULT_RATES
    for W in (2, 3, 4, 6, 8):
        for scheme in cm.SCHEMES:
            for wire in ("float32", "float16"):
                if scheme == "gtopk" and wire != "float32":
                    continue
                s = adv.Setting(n=1_000_003, compute=0.1, world=W, hosts=W, density=0.01, rates=rates,
                                dense_wire=wire, sparse_wire=wire)
                label = adv.BASELINE if scheme == "dense" and wire != "float32" else scheme
                got = adv.scheme_phases(label, s, NIC)
                old = cm.predict(scheme, s.n, 0.01, W, NIC, rates, wire=wire)
                assert got == pytest.approx(old, rel=1e-12), (scheme, W, wire)


def test_a_topology_refuses_what_it_cannot_be():
    with pytest.raises(ValueError, match="W = 6 with 4 ranks a host"):
        nm.Topology(6, 4, NIC, INTRA)
    with pytest.raises(ValueError, match="need an intra-host link"):
        nm.Topology(4, 2, NIC, None)
