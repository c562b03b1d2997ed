"""MPI tests of the ``deft`` scheme through ``bench step``.

The NumPy reference at 1-4 ranks (tests/mpi/check_deft.py) runs in
tests/test_mpi_core.py.  Here, the density check on realistic layer shapes: ``bench step`` on the
NCF model (392,601 parameters) must keep ``density_actual`` within 10 % of
the target (DEFT's selections are disjoint: no gradient build-up).
"""

import pytest

from conftest import bench_step

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_deft_density_on_model_shapes(ranks, tmp_path):
    res = bench_step(ranks, tmp_path, "--scheme", "deft", "--density", "0.01", "--iters", "3", "--warmup", "1",
                     "--diagnostics")
    assert res["world_size"] == ranks
    assert abs(res["density_actual"] - 0.01) <= 0.1 * 0.01, res["density_actual"]
    for d in res["diagnostics"]["density_per_step"]:
        assert abs(d - 0.01) <= 0.1 * 0.01, res["diagnostics"]["density_per_step"]
    mean = res["diagnostics"]["mean"]
    assert {"error_norm", "select_seconds_max", "select_seconds_mean", "select_imbalance"} <= set(mean)
    assert mean["select_imbalance"] >= 1.0
    assert set(res["phases"]) >= {"compensate", "select", "exchange_indices", "exchange_values", "update"}
