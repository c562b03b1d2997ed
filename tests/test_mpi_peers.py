"""MPI tests of the peers' schemes: ``powersgd`` (against PyTorch's own ``powerSGD_hook`` and a NumPy
reference) and ``oktopk`` (a NumPy reference and the paper's byte bound), plus both through ``bench step``.

The rank scripts raise on any mismatch; they run in the shared jobs of conftest.rank_case (the comparison
with PyTorch's hook among the torch cases at 2 ranks, the references among the others).
"""

import importlib.util

import pytest

from conftest import CHECKED_CASES, NUMPY_CASES, TORCH_CASES, bench_step, rank_case

pytestmark = pytest.mark.mpi

TORCH = importlib.util.find_spec("torch") is not None


def test_powersgd_equals_pytorchs_hook():
    """2 ranks open a gloo group beside MPI: powerSGD_hook under DDP and powersgd give the same aggregate."""
    if not TORCH:
        pytest.skip("torch is not installed")
    out = rank_case(("powersgd", "torch"), 2, family=TORCH_CASES, label="powersgd")
    assert out.stdout.count("equal to powerSGD_hook") == 2, out.stdout


def test_powersgd_numpy_reference_at_3_ranks():
    rank_case("powersgd", 3, "--check", family=CHECKED_CASES)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_oktopk_numpy_reference_and_byte_bound(ranks):
    if ranks == 3:  # with the collective checks on
        rank_case("oktopk", 3, "--check", family=CHECKED_CASES)
    else:
        rank_case("oktopk", ranks, family=NUMPY_CASES)


def test_peers_through_bench_step(tmp_path):
    """ncf-shaped gradients at W = 2, both in one job: powersgd's bytes are its factors' (every timed step
    compressed), oktopk's stay under the paper's bound with its global count near k on steps between its
    estimations (the threshold corrected from the probes' counts)."""
    from mpisparse.backend.fusion import FusionLayout
    from mpisparse.models.shapes import MODELS
    from mpisparse.schemes.oktopk import oktopk_bound_bytes
    from mpisparse.schemes.powersgd import powersgd_elements

    psgd, ok = bench_step(2, tmp_path, "--scheme", "powersgd", "--scheme", "oktopk", "--density", "0.01",
                          "--iters", "2", "--warmup", "1", "--matrix-approximation-rank", "2")
    elements = powersgd_elements(FusionLayout(MODELS["ncf"]()), 2)
    assert psgd["scheme"] == "powersgd" and psgd["density_actual"] == 1.0
    assert psgd["bytes_sent_per_rank"] == elements * 4  # ring Allreduce at W = 2: 2 (W-1)/W = 1
    assert elements < psgd["n"] / 5
    assert ok["scheme"] == "oktopk" and 0 < ok["bytes_sent_per_rank"] < oktopk_bound_bytes(ok["k"], 2)
    assert abs(ok["density_actual"] * ok["n"] / ok["k"] - 1) < 0.1
