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
