"""MPI tests of the ``dgc`` scheme through ``bench step`` (each a bounded mpiexec job).

The NumPy reference at 1-4 ranks (tests/mpi/check_dgc.py) runs in tests/test_mpi_core.py.
"""

import pytest

from conftest import bench_step, mpi_run

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2])
def test_dgc_bench_density_on_model_shapes(ranks, tmp_path):
    """density_actual on ncf-shaped gradients: DGC's band at W = 1, build-up above it at W > 1."""
    res = bench_step(ranks, tmp_path, "--scheme", "dgc", "--density", "0.01", "--iters", "3", "--warmup", "1",
                     "--diagnostics")
    d = res["density_actual"]
    assert res["scheme"] == "dgc" and res["world_size"] == ranks
    assert res["config"]["momentum"] == 0.9 and res["config"]["sample_fraction"] == 0.01
    local = res["diagnostics"]["mean"]["dgc_local_count_over_k"]
    assert 0.8 <= local <= 1.3
    if ranks == 1:
        assert 0.8 * 0.01 <= d <= 1.3 * 0.01
    else:
        assert 0.8 * 0.01 < d <= 1.3 * 0.01 * ranks


def test_dgc_cli_rejects_momentum_one():
    out = mpi_run(1, ["bench", "step", "--model", "ncf", "--scheme", "dgc", "--momentum", "1"],
                  module=True, check=False)
    assert out.returncode != 0
    assert "--momentum is 1.0; allowed range is [0, 1)" in out.stderr
