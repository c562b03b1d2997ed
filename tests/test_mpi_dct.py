"""MPI tests of the ``dct`` scheme (DCT-DP) at 1-4 ranks (each a bounded mpiexec job)."""

import json

import pytest

from conftest import mpi_run, mpi_script

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_dct_matches_numpy_reference(ranks):
    out = mpi_run(ranks, [mpi_script("check_dct.py")])
    assert f"dct OK on {ranks} ranks" in out.stdout


def test_dct_passes_with_collective_checks_on():
    out = mpi_run(3, [mpi_script("check_dct.py"), "--check"])
    assert "dct OK on 3 ranks" in out.stdout


def test_dct_bench_density_drifts_on_model_shapes(tmp_path):
    """ncf-shaped gradients, L = 2: recompute steps near the target per rank, drift in between."""
    path = tmp_path / "dct.json"
    mpi_run(2, ["bench", "step", "--model", "ncf", "--scheme", "dct", "--density", "0.01", "--lifespan", "2",
                "--iters", "4", "--warmup", "0", "--diagnostics", "--json", str(path)], module=True)
    res = json.loads(path.read_text())
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
