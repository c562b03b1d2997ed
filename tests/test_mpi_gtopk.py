"""MPI tests of the ``gtopk`` scheme (global Top-k, Shi et al. 2019) at 1-4 ranks."""

import json

import pytest

from conftest import mpi_run, mpi_script

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_gtopk_matches_numpy_reference(ranks):
    out = mpi_run(ranks, [mpi_script("check_gtopk.py")])
    assert f"gtopk OK on {ranks} ranks" in out.stdout


def test_gtopk_passes_with_collective_checks_on():
    out = mpi_run(3, [mpi_script("check_gtopk.py"), "--check"])
    assert "gtopk OK on 3 ranks" in out.stdout


def test_gtopk_bench_density_is_exactly_k_over_n(tmp_path):
    """ncf-shaped gradients at W = 3 (fold-in path): density_actual is k / n, bytes O(k log W)."""
    path = tmp_path / "gtopk.json"
    mpi_run(3, ["bench", "step", "--model", "ncf", "--scheme", "gtopk", "--density", "0.01",
                "--iters", "2", "--warmup", "1", "--diagnostics", "--json", str(path)], module=True)
    res = json.loads(path.read_text())
    assert res["scheme"] == "gtopk" and res["world_size"] == 3
    assert res["density_actual"] == res["k"] / res["n"]
    # max over ranks: rank 0 does one doubling round plus the fold-out send
    assert res["bytes_sent_per_rank"] == 2 * res["k"] * 8 + 16
    assert 0.0 < res["diagnostics"]["mean"]["local_in_global"] <= 1.0
