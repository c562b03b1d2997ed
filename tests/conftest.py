"""Shared test helpers: bounded MPI launches.

Every MPI test runs its own ``mpiexec`` job with ``MPIEXEC_TIMEOUT`` set and
a subprocess timeout on top, so one failing or hung rank ends that job and
can never hang the suite (a plain ``python script.py`` under mpiexec would
leave the other ranks waiting when one raises).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from mpisparse.mpi.launch import build_mpiexec_command, find_mpiexec, has_remote_shell, launcher_flavor

HERE = Path(__file__).parent
# the maintainers' tools (tools/docs_results/) are outside the installed package
sys.path.insert(0, str(HERE.parent / "tools"))
MPI_TIMEOUT = int(os.environ.get("MPISPARSE_TEST_MPI_TIMEOUT", "120"))
# the suite's emulated clusters (reproduce, bench scaling, docs tables) use their own instance, so a
# cluster someone left up with the default instance 0 (another rate, fewer hosts) cannot fail them
os.environ.setdefault("EMUCLUSTER_INSTANCE", "96")


def mpi_run(n: int, args: list[str], *, module: bool = False, timeout: int = MPI_TIMEOUT,
            env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python SCRIPT args`` (or ``python -m mpisparse args``) on ``n`` ranks, bounded in time."""
    mpiexec = find_mpiexec()
    plan = build_mpiexec_command(n, [], mpiexec=mpiexec, flavor=launcher_flavor(mpiexec),
                                 as_root=os.geteuid() == 0, timeout=timeout, remote_shell=has_remote_shell())
    argv = plan.argv[: plan.argv.index(sys.executable)]
    # scripts run under ``python -m mpi4py`` so an exception on one rank aborts the job
    argv += [sys.executable, "-m", "mpisparse", *args] if module else [sys.executable, "-m", "mpi4py", *args]
    full_env = dict(os.environ, **plan.env, OMP_NUM_THREADS="1", **(env or {}))
    # a script's own folder replaces the working directory on sys.path: name the checkout explicitly
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), full_env.get("PYTHONPATH")) if p)
    full_env.pop("PMI_RANK", None)
    for _ in range(2):  # the launcher's own failure, before any rank ran, is launched once more
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30, env=full_env,
                              cwd=HERE.parent)
        if not launcher_failed_to_start(proc):
            break
    if check and proc.returncode != 0:
        raise AssertionError(f"MPI job failed ({proc.returncode}): {' '.join(argv)}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


#: what a launcher prints when it fails to start before any rank runs (seen in CI: Open MPI 5's
#: mpiexec, intermittently, exit 213); a job that failed so is launched once more
LAUNCHER_START_FAILURES = ("The PMIx server's listener thread failed to start",)


def launcher_failed_to_start(proc: subprocess.CompletedProcess) -> bool:
    return proc.returncode != 0 and any(m in (proc.stderr or "") for m in LAUNCHER_START_FAILURES)


def mpiexec_prefix(timeout: int = MPI_TIMEOUT) -> tuple[list[str], dict[str, str]]:
    """``mpiexec`` and its launcher's options (root, oversubscription, time bound), without ``-n``,
    for tests that write their own command line (MPMD, plain python); plus the environment to add."""
    mpiexec = find_mpiexec()
    plan = build_mpiexec_command(1, [], mpiexec=mpiexec, flavor=launcher_flavor(mpiexec),
                                 as_root=os.geteuid() == 0, timeout=timeout, remote_shell=has_remote_shell())
    argv = plan.argv[: plan.argv.index(sys.executable)]
    del argv[1:3]  # "-n", "1"
    return argv, dict(plan.env)


class GatherComm:
    """``allgather_obj`` of a world whose other ranks hold ``others`` (this rank's object first), for unit
    tests of a reduction over ranks without MPI."""

    def __init__(self, others):
        self.others = others

    def allgather_obj(self, obj):
        return [obj, *self.others]


class SelfComm:
    """A one-rank stand-in for the communicator in unit tests (no MPI): every collective returns this
    rank's own data; device arrays pass through (``x.copy()`` on their own module)."""

    rank, size, bytes_sent = 0, 1, 0

    def __init__(self):
        self.staging = {"d2h": 0, "h2d": 0, "d2h_bytes": 0, "h2d_bytes": 0}

    def barrier(self):
        pass

    def bcast(self, x, root=0):
        return x

    def allgatherv(self, x, counts=None):
        return x.copy(), np.array([x.size])

    def allreduce(self, x, out=None, *, op="sum"):
        if out is None:
            return x.copy() if hasattr(x, "copy") else np.array(x, copy=True)
        if out is not x:
            out[...] = x
        return out

    def allgather_obj(self, obj):
        return [obj]

    def bcast_obj(self, obj, root=0):
        return obj


def mpi_script(name: str) -> str:
    return str(HERE / "mpi" / name)


#: (ranks, extra arguments) of the runs of a reference script: 1-4 ranks, and 3 with the collective checks on
SCRIPT_RUNS = [(1, ()), (2, ()), (3, ()), (4, ()), (3, ("--check",))]


def rank_script(name: str, ranks: int, *args: str, label: str | None = None, **kw) -> subprocess.CompletedProcess:
    """Run tests/mpi/check_NAME.py on ``ranks`` ranks; it must report ``LABEL OK on RANKS ranks`` (LABEL: NAME)."""
    out = mpi_run(ranks, [mpi_script(f"check_{name}.py"), *args], **kw)
    assert f"{label or name} OK on {ranks} ranks" in out.stdout, out.stdout[-2000:]
    return out


def bench_step(ranks: int, tmp_path: Path, *args: str, name: str = "bench") -> dict:
    """``mpisparse bench step --model ncf ARGS --json TMP/NAME.json`` on ``ranks`` ranks; its JSON result."""
    path = tmp_path / f"{name}.json"
    mpi_run(ranks, ["bench", "step", "--model", "ncf", *args, "--json", str(path)], module=True)
    return json.loads(path.read_text())


@pytest.fixture
def mpirun():
    return mpi_run


# --------------------------------------------------------------------------- the fault-injection suite
FAULTS = HERE / "faults"


#: what in a test module's text says it runs MPI: a launch helper, a launcher, a CLI command on ``-n`` ranks or
#: in a subprocess (a singleton MPI process), mpi4py itself, a communicator opened in the test's own process
MPI_USE = re.compile(r"\b(mpi_run|rank_script|bench_step|mpiexec_prefix|find_mpiexec|open_comm)\(|\bmpi4py\b"
                     r"|\bdef test_\w+\([^)]*\bmpirun\b|[\"']-n[\"']|[\"']-m[\"'],\s*[\"']mpisparse[\"']")
#: what says it exercises the compiled loops or their plain NumPy fallback (numba installed or not)
FALLBACK_USE = re.compile(r"\b(numba|compiled|fused|MPISPARSE_FUSED)\b")


@functools.lru_cache(maxsize=None)
def _module_text(path: Path) -> str:
    return path.read_text()


def pytest_collection_modifyitems(config, items):
    """Markers from where a test lives and what its module does.

    - ``faults``: every test under tests/faults/ (``pytest -m faults`` runs only them). The
      fault-injection suite runs each case the way a user meets it: real subprocesses, real
      ``mpiexec``, real signals and real files, each case bounded in time, asserting what must hold
      afterwards (exit code, the one-line message, no process of the job left, files intact).
    - ``mpi``: every test of a module that runs MPI (:data:`MPI_USE`), besides the tests marked by
      hand. The Open MPI pass of .ci/run runs these; a test that runs MPI without the marker fails
      (:func:`_unmarked_tests_run_no_mpi`), so the pass cannot miss one.
    - ``fallback``: every test of a module that exercises the compiled loops or their NumPy fallback
      (:data:`FALLBACK_USE`): the Open MPI pass, which has no numba, runs these too.
    """
    for item in items:
        path = Path(str(item.fspath))
        if FAULTS in path.parents:
            item.add_marker(pytest.mark.faults)
        text = _module_text(path)
        if MPI_USE.search(text) and item.get_closest_marker("mpi") is None:
            item.add_marker(pytest.mark.mpi)
        if FALLBACK_USE.search(text):
            item.add_marker(pytest.mark.fallback)


#: the mpiexec an unmarked test gets (:func:`_unmarked_tests_run_no_mpi`): it answers a launcher's
#: queries (``--version`` and the like) with the real one and refuses to start a job
_GUARD = """#!/bin/sh
case "$1" in --version|-V|-v|--help|-h|-info|--info) exec "{real}" "$@";; esac
echo "tests: $PYTEST_CURRENT_TEST launches MPI but is not marked mpi (tests/conftest.py MPI_USE)" >&2
exit 97
"""


@pytest.fixture(scope="session")
def _guard_mpiexec(tmp_path_factory) -> str:
    try:
        real = find_mpiexec()
    except RuntimeError:  # no MPI here: the unit tests still run
        real = "mpiexec"
    path = tmp_path_factory.mktemp("guard") / "mpiexec"
    path.write_text(_GUARD.format(real=real))
    path.chmod(0o755)
    return str(path)


MPI_MODULE = "mpi4py.MPI"


class _NoMPI(types.ModuleType):
    """``mpi4py.MPI`` for an unmarked test: any use of it fails the test, naming it."""

    def __getattr__(self, name):
        if name.startswith("__"):  # introspection (inspect, pickle) asks for dunders of every module
            raise AttributeError(name)
        raise RuntimeError(f"{os.environ.get('PYTEST_CURRENT_TEST', 'a test')} uses MPI in the test process but "
                           "is not marked mpi (tests/conftest.py MPI_USE)")


@pytest.fixture(autouse=True)
def _unmarked_tests_run_no_mpi(request, monkeypatch, _guard_mpiexec):
    """A test without the ``mpi`` marker runs no MPI: its launches meet a guard that refuses them, its
    subprocesses do not initialise MPI (``MPI4PY_RC_INITIALIZE=0``: their first MPI call fails), and in
    this process ``mpi4py.MPI``, if not imported yet, is a stand-in that fails on use. So every test that
    runs MPI is marked, and the Open MPI pass (``-m mpi``) misses none."""
    if request.node.get_closest_marker("mpi") is None:
        monkeypatch.setenv("MPISPARSE_MPIEXEC", _guard_mpiexec)
        monkeypatch.setenv("MPI4PY_RC_INITIALIZE", "0")
        if MPI_MODULE not in sys.modules:
            monkeypatch.setitem(sys.modules, MPI_MODULE, _NoMPI(MPI_MODULE))
    yield


# --------------------------------------------------------------------------- the suite's time budget
#: ``MPISPARSE_SUITE_BUDGET_S=S``: the run fails when the whole session took longer than S seconds
#: (.ci/run sets it for the README's test command, so that drift shows when it starts, not at CI's limit)
BUDGET_ENV = "MPISPARSE_SUITE_BUDGET_S"


def suite_budget_verdict(elapsed: float, budget: str | None) -> str | None:
    """None within the budget (or with none set); else the one line that fails the run."""
    if not budget:
        return None
    limit = float(budget)
    if elapsed <= limit:
        return None
    return (f"the suite took {elapsed:.0f} s, over its budget of {limit:.0f} s ({BUDGET_ENV}): "
            f"find the new slow tests in the --durations list above")


def pytest_sessionstart(session):
    session.config._mpisparse_t0 = time.monotonic()


def pytest_sessionfinish(session, exitstatus):
    t0 = getattr(session.config, "_mpisparse_t0", None)
    if t0 is None:
        return
    verdict = suite_budget_verdict(time.monotonic() - t0, os.environ.get(BUDGET_ENV))
    if verdict is not None:
        session.config._mpisparse_budget_verdict = verdict
        if session.exitstatus == 0:
            session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    verdict = getattr(config, "_mpisparse_budget_verdict", None)
    if verdict is not None:
        terminalreporter.write_line(f"BUDGET EXCEEDED: {verdict}", red=True)
