"""The parameter-server runtime under MPI: references, shutdown, failures, the commands.

Each test is its own bounded mpiexec job (conftest.mpi_run).  The rank
script tests/mpi/check_ps.py holds the NumPy references.
"""

import json
import time

import pytest

from conftest import NUMPY_CASES, mpi_run, mpi_script, rank_case

pytestmark = pytest.mark.mpi


def test_point_to_point_calls_count_bytes_and_report_envelopes():
    rank_case("ps_comm", 2, family=NUMPY_CASES, label="ps comm")


@pytest.mark.parametrize("ranks, servers", [(3, 1), (4, 1), (4, 2)])
def test_schemes_match_numpy_references_and_byte_formulas(ranks, servers):
    """Plump-DP, Slim-DP, ASGD (+ gradient dropping), DGS vs NumPy; slimdp(1,1) == plumpdp; dgs(1) == asgd."""
    rank_case(("ps", "reference", str(servers)), ranks, family=NUMPY_CASES, label="ps reference")


@pytest.mark.parametrize("ranks, servers", [(3, 1), (4, 2)])
def test_workers_stopping_at_different_times_end_cleanly_with_the_server_model(ranks, servers):
    rank_case(("ps", "shutdown", str(servers)), ranks, family=NUMPY_CASES, label="ps shutdown")


@pytest.mark.parametrize("mode", ["fail-worker", "fail-server"])
def test_a_failing_worker_or_server_ends_the_job_quickly(mode):
    t0 = time.perf_counter()
    out = mpi_run(3, [mpi_script("check_ps.py"), mode], timeout=60, check=False)
    assert out.returncode != 0
    assert "injected failure" in out.stderr
    assert time.perf_counter() - t0 < 30


def test_bench_step_runs_ps_schemes_with_two_servers(tmp_path):
    path = tmp_path / "ps.json"
    p = mpi_run(4, ["bench", "step", "--model", "ncf", "--scheme", "plumpdp", "--scheme", "slimdp", "--scheme", "dgs",
                    "--density", "0.3", "--core", "0.15", "--server-density", "0.3", "--servers", "2",
                    "--iters", "3", "--warmup", "1", "--json", str(path)], module=True)
    plump, slim, dgs = json.loads(path.read_text())
    for r in (plump, slim, dgs):
        assert r["servers"] == 2 and r["workers"] == 2 and r["world_size"] == 4
        assert {"push", "pull", "wait", "server_apply"} <= set(r["phases"])
        assert r["communications"] == 2 * 3
        assert set(r["phases_server"]) >= {"wait", "push", "server_apply", "pull"}
    n = plump["n"]
    assert plump["bytes_up_per_communication"] == plump["bytes_down_per_communication"] == 4 * n
    assert abs(slim["bytes_up_per_communication"] - 4 * (2 * 0.3 - 0.15) * n) < 16  # no full push in 4 steps
    assert dgs["ps_mode"] == "async" and abs(dgs["density_actual"] - 0.3) < 0.01
    assert "server phases per push served" in p.stdout and "bytes down/comm" in p.stdout
