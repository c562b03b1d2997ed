"""MPI tests of the ``gtopk`` scheme (global Top-k, Shi et al. 2019) through ``bench step``.

The NumPy reference at 1-4 ranks (tests/mpi/check_gtopk.py) runs in tests/test_mpi_core.py.
"""

import pytest

from conftest import bench_step

pytestmark = pytest.mark.mpi


def test_gtopk_bench_density_is_exactly_k_over_n(tmp_path):
    """ncf-shaped gradients at W = 3 (fold-in path): density_actual is k / n, bytes O(k log W)."""
    res = bench_step(3, tmp_path, "--scheme", "gtopk", "--density", "0.01", "--iters", "2", "--warmup", "1",
                     "--diagnostics")
    assert res["scheme"] == "gtopk" and res["world_size"] == 3
    assert res["density_actual"] == res["k"] / res["n"]
    # max over ranks: rank 0 does one doubling round plus the fold-out send
    assert res["bytes_sent_per_rank"] == 2 * res["k"] * 8 + 16
    assert 0.0 < res["diagnostics"]["mean"]["local_in_global"] <= 1.0
