"""The test harness itself (tests/conftest.py): a launcher that fails to start is relaunched once, and only then."""

import subprocess

import pytest

import conftest


def _proc(rc, stderr=""):
    return subprocess.CompletedProcess(["mpiexec"], rc, stdout="", stderr=stderr)


def test_launcher_failed_to_start_reads_the_launchers_message():
    msg = "The PMIx server's listener thread failed to start. We cannot continue."
    assert conftest.launcher_failed_to_start(_proc(213, msg))
    assert not conftest.launcher_failed_to_start(_proc(0, msg))
    assert not conftest.launcher_failed_to_start(_proc(1, "Traceback ... AssertionError"))


@pytest.mark.parametrize("first, runs, ok", [
    (_proc(213, "The PMIx server's listener thread failed to start."), 2, True),  # relaunched once
    (_proc(1, "rank 1 raised"), 1, False),  # a rank's failure is the test's failure: not relaunched
])
def test_mpi_run_relaunches_only_a_launcher_that_failed_to_start(monkeypatch, first, runs, ok):
    calls = []

    def fake_run(argv, **kw):
        calls.append(argv)
        return first if len(calls) == 1 else _proc(0)

    monkeypatch.setattr(conftest.subprocess, "run", fake_run)
    if ok:
        assert conftest.mpi_run(2, ["x.py"]).returncode == 0
    else:
        with pytest.raises(AssertionError, match="MPI job failed"):
            conftest.mpi_run(2, ["x.py"])
    assert len(calls) == runs


def test_the_suite_budget_fails_only_past_its_limit():
    assert conftest.suite_budget_verdict(500.0, None) is None
    assert conftest.suite_budget_verdict(500.0, "") is None
    assert conftest.suite_budget_verdict(500.0, "600") is None
    line = conftest.suite_budget_verdict(601.4, "600")
    assert "601 s" in line and "600 s" in line and conftest.BUDGET_ENV in line


@pytest.mark.parametrize("text, runs_mpi", [
    ('mpi_run(2, [script])', True),
    ('rank_script("comm", 3)', True),
    ('invoke("train", "-n", "2")', True),
    ('[sys.executable, "-m", "mpisparse", "train"]', True),
    ('from mpi4py import MPI', True),
    ('def test_x(tmp_path, mpirun):', True),
    ('"""strips mpiexec -n N and srun prefixes"""', False),
    ('np.random.default_rng(0)', False),
])
def test_what_marks_a_module_mpi(text, runs_mpi):
    assert bool(conftest.MPI_USE.search(text)) is runs_mpi
