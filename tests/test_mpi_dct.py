"""MPI tests of the ``dct`` scheme (DCT-DP) through ``bench step`` (each a bounded mpiexec job).

The NumPy reference at 1-4 ranks (tests/mpi/check_dct.py) runs in tests/test_mpi_core.py.
"""

import pytest

from conftest import bench_step, mpi_run

pytestmark = pytest.mark.mpi


def test_dct_bench_density_drifts_on_model_shapes(tmp_path):
    """ncf-shaped gradients, L = 2: recompute steps near the target per rank, drift in between."""
    res = bench_step(2, tmp_path, "--scheme", "dct", "--density", "0.01", "--lifespan", "2", "--iters", "4",
                     "--warmup", "0", "--diagnostics")
    assert res["scheme"] == "dct" and res["world_size"] == 2 and res["config"]["lifespan"] == 2
    per_step = res["diagnostics"]["density_per_step"]
    recomputed = [d["tau_recomputed"] for d in res["diagnostics"]["per_step"]]
    assert recomputed == [1.0, 0.0, 1.0, 0.0]
    # a recompute step: each rank sends ~1 % per layer (at least 1 entry a layer); union of 2 ranks
    assert 0.01 <= per_step[0] <= 2 * 0.0102
    # in between, the residual grows past the stored thresholds: density rises
    assert per_step[1] > per_step[0]
    local = res["diagnostics"]["mean"]["dct_local_density"]
    assert 0.01 <= local <= 0.1


def test_dct_cli_rejects_lifespan_zero():
    out = mpi_run(1, ["bench", "step", "--model", "ncf", "--scheme", "dct", "--lifespan", "0"],
                  module=True, check=False)
    assert out.returncode != 0
    assert "--lifespan is 0; allowed range is [1, inf]" in out.stderr
