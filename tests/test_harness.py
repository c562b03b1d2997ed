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


@pytest.mark.parametrize("first, runs, rc", [
    (_proc(213, "The PMIx server's listener thread failed to start."), 2, 0),
    (_proc(213, "rank 0 raised"), 1, 213),
])
def test_launch_is_the_same_relaunch_for_tests_that_write_their_own_mpiexec_line(monkeypatch, first, runs, rc):
    calls = []

    def fake_run(argv, **kw):
        calls.append((argv, kw))
        return first if len(calls) == 1 else _proc(0)

    monkeypatch.setattr(conftest.subprocess, "run", fake_run)
    assert conftest.launch(["mpiexec", "-n", "1", "x"], capture_output=True, timeout=5).returncode == rc
    assert len(calls) == runs and all(kw == {"capture_output": True, "timeout": 5} for _, kw in calls)


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


# --------------------------------------------------------------------------- many cases in one job
DEMO = [("case_demo", "pass"), ("case_demo", "raise", "1"), ("case_demo", "pass", "again"),
        ("case_demo", "exit", "1"), ("case_demo", "pass", "last")]


def test_many_cases_in_one_job_each_outcome_its_own(monkeypatch):
    """One job runs the cases in order; a case that raises is named with its rank's traceback and ends the
    job, the cases after it run in a new job; a case during which a rank dies is run again alone and fails
    on its own; the passing cases pass, each with its own output."""
    launches = []
    real = conftest.mpi_run
    monkeypatch.setattr(conftest, "mpi_run", lambda n, args, **kw: launches.append(args) or real(n, args, **kw))
    out = conftest.run_cases([conftest._case(c) for c in DEMO], 2)
    assert [out[" ".join(c)].ok for c in DEMO] == [True, False, True, False, True]
    assert "ValueError: demo failure on rank 1" in out["case_demo raise 1"].error
    assert "has no result: its job ended" in out["case_demo exit 1"].error
    assert all("case_demo OK on 2 ranks" in out[" ".join(c)].stdout for c in DEMO if c[1] == "pass")
    # the whole list, then what followed the raise, then the crashed case alone, then the last case
    assert len(launches) == 4, launches


def test_a_hung_case_is_ended_at_its_time_limit_and_named_with_its_stack():
    case = conftest.Case("case_demo", ("hang", "0"), timeout=1)
    out = conftest.run_cases([case, conftest.Case("case_demo", ("pass",))], 2)
    assert not out[case.id].ok and out["case_demo pass"].ok
    err = out[case.id].error
    assert "passed its time limit of 1 s on rank 0" in err and "check_case_demo.py" in err, err


def test_rank_case_reads_its_groups_one_job(monkeypatch):
    launches = []
    real = conftest.mpi_run
    monkeypatch.setattr(conftest, "mpi_run", lambda n, args, **kw: launches.append(args) or real(n, args, **kw))
    group = (("case_demo", "pass"), ("case_demo", "pass", "x"))
    for case in group:
        assert conftest.rank_case(case, 2, group=group, label="case_demo").ok
    assert len(launches) == 1
    with pytest.raises(AssertionError, match="raise 0 on 2 ranks"):
        conftest.rank_case(("case_demo", "raise", "0"), 2)


def test_two_lanes_put_every_module_that_runs_mpi_on_one_worker():
    assert conftest.lane_of("tests/test_mpi_core.py::test_communicator[3]") == conftest.LANE_MPI
    assert conftest.lane_of("tests/faults/test_fault_network.py::test_x") == conftest.LANE_MPI  # marked by hand
    assert conftest.lane_of("tests/test_kernels.py::test_topk_random_small[1]") == conftest.LANE_UNIT
    assert conftest.lane_of("tests/test_sgd.py::test_zero_grad_and_bad_options") == conftest.LANE_UNIT
    # MPI in one process at a time, declared (ONE_PROCESS_MPI): the unit lane
    assert conftest.lane_of("tests/test_config.py::test_x") == conftest.LANE_UNIT


def test_a_module_that_launches_ranks_cannot_declare_one_process(tmp_path):
    one = "ONE_PROCESS_MPI = True\n"
    (tmp_path / "test_single.py").write_text(one + "run([sys.executable, '-m', 'mpisparse', 'train'])\n")
    (tmp_path / "test_ranks.py").write_text(one + "run([sys.executable, '-m', 'mpisparse', 'train', '-n', '2'])\n")
    (tmp_path / "test_undeclared.py").write_text("run([sys.executable, '-m', 'mpisparse', 'train'])\n")
    assert conftest.lane_of("test_single.py::t", tmp_path) == conftest.LANE_UNIT
    assert conftest.lane_of("test_ranks.py::t", tmp_path) == conftest.LANE_MPI
    assert conftest.lane_of("test_undeclared.py::t", tmp_path) == conftest.LANE_MPI
