"""MPI tests of the ``cltk`` scheme (ScaleCom CLT-k) through ``bench step``.

Each test is one bounded ``mpiexec`` job (see conftest.mpi_run); the NumPy
reference at 1-4 ranks (tests/mpi/check_cltk.py) runs in tests/test_mpi_core.py.
"""

import pytest

from conftest import bench_step

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [2, 3])
def test_cltk_bench_step_density_is_exactly_k_over_n(ranks, tmp_path):
    """On model-shaped gradients (ncf): density_actual == k/n, the leader's set is the global set."""
    res = bench_step(ranks, tmp_path, "--scheme", "cltk", "--density", "0.01", "--iters", "3", "--warmup", "1",
                     "--beta", "0.5", "--chunks", "4", "--warmup-iters", "1", "--diagnostics")
    assert res["density_actual"] == res["k"] / res["n"]
    assert res["config"]["beta"] == 0.5 and res["config"]["chunks"] == 4
    diag = res["diagnostics"]["mean"]
    assert 0.0 <= diag["hamming_to_true_topk"] <= 1.0
    assert 0.0 < diag["memory_cosine_distance"] <= 2.0
    # per timed step (iterations 1..3, leader t mod W): one Bcast of k int32 indices
    # (chain model: every rank but the chain's last sends them) + one ring Allreduce
    # of k float32 values; the result is the worst rank's mean over the steps
    k, W = res["k"], ranks
    per_rank = [sum((4 * k if (r - t % W) % W < W - 1 else 0) + 2 * (W - 1) * 4 * k // W
                    for t in (1, 2, 3)) / 3 for r in range(W)]
    assert res["bytes_sent_per_rank"] == pytest.approx(max(per_rank), rel=1e-12)
    assert "select" in res["phases"] and "exchange_indices" in res["phases"]
