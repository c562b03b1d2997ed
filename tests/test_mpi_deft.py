"""MPI tests of the ``deft`` scheme at 1-4 ranks (tests/mpi/check_deft.py).

Plus the density check on realistic layer shapes: ``bench step`` on the
NCF model (392,601 parameters) must keep ``density_actual`` within 10 % of
the target (DEFT's selections are disjoint: no gradient build-up).
"""

import json

import pytest

from conftest import mpi_run, mpi_script

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_deft_matches_numpy_reference(ranks):
    out = mpi_run(ranks, [mpi_script("check_deft.py")])
    assert f"deft OK on {ranks} ranks" in out.stdout


def test_deft_passes_with_collective_checks_on():
    out = mpi_run(3, [mpi_script("check_deft.py"), "--check"])
    assert "deft OK on 3 ranks" in out.stdout


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_deft_density_on_model_shapes(ranks, tmp_path):
    path = tmp_path / "deft.json"
    mpi_run(ranks, ["bench", "step", "--model", "ncf", "--scheme", "deft", "--density", "0.01",
                    "--iters", "3", "--warmup", "1", "--diagnostics", "--json", str(path)], module=True)
    res = json.loads(path.read_text())
    assert res["world_size"] == ranks
    assert abs(res["density_actual"] - 0.01) <= 0.1 * 0.01, res["density_actual"]
    for d in res["diagnostics"]["density_per_step"]:
        assert abs(d - 0.01) <= 0.1 * 0.01, res["diagnostics"]["density_per_step"]
    mean = res["diagnostics"]["mean"]
    assert {"error_norm", "select_seconds_max", "select_seconds_mean", "select_imbalance"} <= set(mean)
    assert mean["select_imbalance"] >= 1.0
    assert set(res["phases"]) >= {"compensate", "select", "exchange_indices", "exchange_values", "update"}
