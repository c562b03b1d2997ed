"""MPI tests of the communicator and of every collective scheme against its NumPy reference, at 1-4 ranks.

The rank scripts in tests/mpi/ raise on any mismatch.  All those of a rank
count run in one bounded ``mpiexec`` job (conftest.rank_case), each
reported as its own test; ``bench step`` runs are jobs of their own.  The
scheme-specific ``bench step`` checks are in tests/test_mpi_<scheme>.py.
"""

import pytest

from conftest import CHECKED_CASES, NUMPY_CASES, SCRIPT_RUNS, bench_step, rank_case

pytestmark = pytest.mark.mpi


#: rank scripts comparing schemes with a NumPy reference: the baselines (dense, topk,
#: randomk, threshold), then one script per scheme
REFERENCE_SCRIPTS = ["schemes", "cltk", "dct", "deft", "dgc", "gtopk"]


@pytest.mark.parametrize("ranks, args", SCRIPT_RUNS)
@pytest.mark.parametrize("name", REFERENCE_SCRIPTS)
def test_schemes_match_numpy_reference(name, ranks, args):
    rank_case(name, ranks, *args, family=CHECKED_CASES if args else NUMPY_CASES)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_communicator(ranks):
    rank_case("comm", ranks, family=NUMPY_CASES)


def test_topk_build_up_grows_with_world_size(tmp_path):
    """DEFT Fig. 1: the union of per-rank top-k sets grows with W (measured, never hidden)."""
    dens = {w: bench_step(w, tmp_path, "--scheme", "topk", "--density", "0.01", "--iters", "3", "--warmup", "0",
                          name=f"w{w}")["density_actual"] for w in (1, 2, 4)}
    assert abs(dens[1] - 0.01) < 1e-4, dens
    assert dens[4] > dens[2] > 1.2 * dens[1], dens
