"""MPI tests of the communicator and the baseline schemes at 1-4 ranks.

Each test is one bounded ``mpiexec`` job (see conftest.mpi_run); the rank
scripts in tests/mpi/ raise on any mismatch, which aborts their job.
"""

import pytest

from conftest import mpi_run, mpi_script

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_schemes_match_numpy_reference(ranks):
    out = mpi_run(ranks, [mpi_script("check_schemes.py")])
    assert f"schemes OK on {ranks} ranks" in out.stdout


def test_schemes_pass_with_collective_checks_on():
    out = mpi_run(3, [mpi_script("check_schemes.py"), "--check"])
    assert "schemes OK on 3 ranks" in out.stdout


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_communicator(ranks):
    out = mpi_run(ranks, [mpi_script("check_comm.py")])
    assert f"comm OK on {ranks} ranks" in out.stdout


def test_topk_build_up_grows_with_world_size(tmp_path):
    """DEFT Fig. 1: the union of per-rank top-k sets grows with W (measured, never hidden)."""
    import json

    dens = {}
    for w in (1, 2, 4):
        out = tmp_path / f"w{w}.json"
        mpi_run(w, ["bench", "step", "--model", "ncf", "--scheme", "topk", "--density", "0.01", "--iters", "3",
                    "--warmup", "0", "--json", str(out)], module=True)
        dens[w] = json.loads(out.read_text())["density_actual"]
    assert abs(dens[1] - 0.01) < 1e-4, dens
    assert dens[4] > dens[2] > 1.2 * dens[1], dens
